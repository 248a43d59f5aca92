"""tests/compress/ranks.py: ranks that finish are joined; a rank still running at the deadline is
terminated and named; a rank that raises fails the call."""
import time

import pytest

from tests.compress.ranks import run_ranks


def _rank_one_stalls(rank: int) -> None:
    if rank == 1:
        time.sleep(120)


def _rank_one_raises(rank: int) -> None:
    if rank == 1:
        raise RuntimeError("rank 1 failed")


def test_finished_ranks_are_joined():
    assert run_ranks(_rank_one_stalls, (), nprocs=1) == []


@pytest.mark.slow
def test_a_stalled_rank_is_terminated_at_the_deadline():
    start = time.monotonic()
    with pytest.warns(UserWarning, match=r"ranks \[1\] still running after 20 s: terminated"):
        assert run_ranks(_rank_one_stalls, (), deadline_s=20) == [1]
    assert time.monotonic() - start < 100


def test_a_rank_that_raises_fails_the_call():
    with pytest.raises(Exception, match="rank 1 failed"):
        run_ranks(_rank_one_raises, ())
