"""Tests for compress/core/observers.py: statistics of each kind, scale, shared buffer layout."""
import pytest
import torch

from compress.core.observers import make_observer


def test_absmax_observer_keeps_the_maximum():
    obs = make_observer("absmax", 4)
    obs.update(torch.tensor([[1.0, -3.0, 0.5, 0.0]]))
    obs.update(torch.tensor([[2.0, 1.0, -0.5, 0.0]]))
    assert obs.stat.item() == 3.0 and obs.channel_absmax.tolist() == [2.0, 3.0, 0.5, 0.0]
    assert obs.scale().item() == pytest.approx(3.0 / 127)


def test_percentile_observer_clips_outliers():
    obs = make_observer("percentile", 1000, percentile=99.0)
    x = torch.linspace(0, 1, 1000)[None, :].clone()
    x[0, -1] = 1000.0
    obs.update(x)
    assert obs.stat.item() < 1.0


def test_moving_average_observer():
    obs = make_observer("moving_average", 2)
    obs.update(torch.tensor([[1.0, 0.0]]))
    obs.update(torch.tensor([[3.0, 0.0]]))
    assert obs.stat.item() == pytest.approx(0.9 * 1.0 + 0.1 * 3.0)


def test_unobserved_scale_is_one_and_kinds_share_a_layout():
    kinds = [make_observer(k, 8) for k in ("absmax", "percentile", "moving_average")]
    assert kinds[0].scale().item() == 1.0
    keys = [set(o.state_dict()) for o in kinds]
    assert keys[0] == keys[1] == keys[2]


def test_errors():
    with pytest.raises(ValueError, match="absmax"):
        make_observer("minmax", 4)
    with pytest.raises(ValueError, match=r"\(\.\.\., 4\)"):
        make_observer("absmax", 4).update(torch.ones(2, 5))
