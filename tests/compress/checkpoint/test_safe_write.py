"""Fault injection for compress/checkpoint/safe_write.py: saves that never lose a user's files.

Refusals (empty path, existing file, foreign directory, our own checkpoint without overwrite=True)
write nothing. Every step of a save (each rename, exchange, fsync and tree removal) is made to fail
in turn, both as an exception (the save's own handler runs) and as a kill of a forked child process
(``os._exit``: no handler runs), before and after the step, with the atomic exchange and with its
two-rename fallback. After each, loading the path gives the old or the new model, bit for bit, and
leaves no hidden ``.NAME.*`` entry; the next save succeeds. File modes follow the umask.
"""
import contextlib
import os
import shutil
import stat

import pytest
import torch
from torch import nn

import compress
import compress.checkpoint.safe_write as safe_write
import compress.checkpoint.save as save_module
from compress import CheckpointError, W4A16Config, W8A8Config
from compress.checkpoint import MANIFEST, TENSORS


def _converted_mlp(seed):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 32))
    return compress.convert(model, {"0": W8A8Config(), "2": W4A16Config(32)})


def _skeleton():
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 32))


OLD, NEW = _converted_mlp(0), _converted_mlp(1)


def _same_state(model, reference) -> bool:
    ours, theirs = model.state_dict(), reference.state_dict()
    return ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)


def _hidden(directory):
    return sorted(p.name for p in directory.iterdir() if p.name.startswith("."))


# ---- refusals: nothing is written ---------------------------------------------------------------
@pytest.mark.parametrize("path", ["", "   ", "\t\n"])
def test_empty_or_blank_path_is_refused_and_the_working_directory_is_untouched(tmp_path, monkeypatch, path):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "important.txt").write_text("keep me")
    with pytest.raises(ValueError, match="expected a non-empty directory path"):
        compress.save_compressed(NEW, path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["important.txt"]
    assert (tmp_path / "important.txt").read_text() == "keep me"


def test_the_working_directory_itself_is_refused_even_with_overwrite(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "important.txt").write_text("keep me")
    for overwrite in (False, True):
        with pytest.raises(FileExistsError, match="not a compressed checkpoint .*important.txt"):
            compress.save_compressed(NEW, ".", overwrite=overwrite)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["important.txt"]


@pytest.mark.parametrize("overwrite", [False, True])
def test_a_non_empty_directory_that_is_not_ours_is_refused(tmp_path, overwrite):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "important.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match=r"d: is a non-empty directory .*important.txt.*even with overwrite=True"):
        compress.save_compressed(NEW, tmp_path / "d", overwrite=overwrite)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"]
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == ["important.txt"]


def test_a_directory_with_a_foreign_or_damaged_manifest_is_not_ours(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / MANIFEST).write_text('{"name": "someone else\'s project"}')
    with pytest.raises(FileExistsError, match="not a compressed checkpoint"):
        compress.save_compressed(NEW, tmp_path / "d", overwrite=True)
    (tmp_path / "d" / MANIFEST).write_text("{not json")
    with pytest.raises(FileExistsError, match="not a compressed checkpoint"):
        compress.save_compressed(NEW, tmp_path / "d", overwrite=True)
    assert (tmp_path / "d" / MANIFEST).read_text() == "{not json"


def test_an_existing_file_or_a_symlink_to_one_is_refused(tmp_path):
    (tmp_path / "f").write_text("keep me")
    (tmp_path / "link").symlink_to(tmp_path / "f")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    for name in ("f", "link"):
        with pytest.raises(FileExistsError, match="is an existing file, not a directory"):
            compress.save_compressed(NEW, tmp_path / name, overwrite=True)
    with pytest.raises(FileExistsError, match="dangling symlink"):
        compress.save_compressed(NEW, tmp_path / "dangling")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dangling", "f", "link"]
    assert (tmp_path / "f").read_text() == "keep me"


def test_a_path_that_is_not_a_path_is_a_type_error(tmp_path):
    with pytest.raises(TypeError, match="expected a str or os.PathLike directory path, got int"):
        compress.save_compressed(NEW, 3)
    with pytest.raises(TypeError, match="overwrite: expected a bool, got str"):
        compress.save_compressed(NEW, tmp_path / "c", overwrite="yes")
    assert list(tmp_path.iterdir()) == []


def test_our_checkpoint_needs_overwrite_and_an_empty_directory_does_not(tmp_path):
    (tmp_path / "c").mkdir()
    compress.save_compressed(OLD, tmp_path / "c")  # empty directory: saved into
    with pytest.raises(FileExistsError, match=r"c: already holds a compressed checkpoint; pass overwrite=True"):
        compress.save_compressed(NEW, tmp_path / "c")
    assert _same_state(compress.load_compressed(tmp_path / "c", model=_skeleton()), OLD)
    compress.save_compressed(NEW, tmp_path / "c", overwrite=True)
    assert _same_state(compress.load_compressed(tmp_path / "c", model=_skeleton()), NEW)
    assert _hidden(tmp_path) == []


def test_a_symlink_to_a_checkpoint_keeps_pointing_at_the_new_one(tmp_path):
    compress.save_compressed(OLD, tmp_path / "real")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    compress.save_compressed(NEW, tmp_path / "link", overwrite=True)
    assert (tmp_path / "link").is_symlink()
    assert _same_state(compress.load_compressed(tmp_path / "link", model=_skeleton()), NEW)
    assert _hidden(tmp_path) == []


# ---- file modes ---------------------------------------------------------------------------------
@pytest.mark.parametrize("umask", [0o022, 0o027, 0o002])
def test_modes_follow_the_umask(tmp_path, umask):
    previous = os.umask(umask)
    try:
        path = compress.save_compressed(NEW, tmp_path / "c")
    finally:
        os.umask(previous)
    assert stat.S_IMODE(path.stat().st_mode) == 0o777 & ~umask
    for name in (MANIFEST, TENSORS):
        assert stat.S_IMODE((path / name).stat().st_mode) == 0o666 & ~umask, name


# ---- fault injection ----------------------------------------------------------------------------
class Crash(Exception):
    """Raised by an injected fault."""


STEPS = (("os", "rename"), ("shutil", "rmtree"), ("save", "fsync_path"), ("safe_write", "fsync_path"),
         ("safe_write", "_exchange_directories"))
MODULES = {"os": os, "shutil": shutil, "save": save_module, "safe_write": safe_write}


@contextlib.contextmanager
def _faults(monkeypatch, exchange: bool, fail_at=None, when="before", action=None):
    """Wrap each save step; ``fail_at`` (a call index) runs ``action`` before or after that call.
    Yields the list of calls made. ``exchange=False`` makes renameat2 look unsupported (fallback)."""
    calls = []
    real = {step: getattr(MODULES[step[0]], step[1]) for step in STEPS}
    if not exchange:
        real[("safe_write", "_exchange_directories")] = lambda first, second: False

    def wrap(step):
        def wrapped(*args, **kwargs):
            index = len(calls)
            calls.append(step[1])
            if index == fail_at and when == "before":
                action()
            result = real[step](*args, **kwargs)
            if index == fail_at and when == "after":
                action()
            return result
        return wrapped

    with monkeypatch.context() as patch:
        for step in STEPS:
            patch.setattr(MODULES[step[0]], step[1], wrap(step))
        yield calls


def _save_trace(tmp_path, monkeypatch, exchange):
    """The steps of a clean save onto an existing checkpoint."""
    compress.save_compressed(OLD, tmp_path / "trace")
    with _faults(monkeypatch, exchange) as calls:
        compress.save_compressed(NEW, tmp_path / "trace", overwrite=True)
    shutil.rmtree(tmp_path / "trace")
    return list(calls)


def _assert_old_or_new_and_clean(directory, path, allow_missing=False):
    """Loading ``path`` recovers it to the old or the new model and leaves no hidden entry."""
    if allow_missing and not os.path.lexists(path) and not _hidden(directory):
        return None
    loaded = compress.load_compressed(path, model=_skeleton())
    assert _hidden(directory) == []
    assert _same_state(loaded, OLD) or _same_state(loaded, NEW)
    return "new" if _same_state(loaded, NEW) else "old"


@pytest.mark.parametrize("exchange", [True, False], ids=["renameat2", "two-renames"])
def test_the_swap_uses_the_expected_steps(tmp_path, monkeypatch, exchange):
    calls = _save_trace(tmp_path, monkeypatch, exchange)
    if exchange:
        assert calls == ["fsync_path", "fsync_path", "_exchange_directories", "fsync_path", "rmtree", "fsync_path"]
    else:
        assert calls == ["fsync_path", "fsync_path", "_exchange_directories", "rename", "rename",
                         "fsync_path", "rmtree", "fsync_path"]


@pytest.mark.parametrize("exchange", [True, False], ids=["renameat2", "two-renames"])
@pytest.mark.parametrize("fault", [KeyboardInterrupt, SystemExit, Crash])
def test_an_exception_at_any_step_leaves_old_or_new_loadable_and_nothing_hidden(tmp_path, monkeypatch, exchange, fault):
    steps = _save_trace(tmp_path, monkeypatch, exchange)
    outcomes = []
    for index in range(len(steps)):
        for when in ("before", "after"):
            directory = tmp_path / f"{index}-{when}"
            directory.mkdir()
            compress.save_compressed(OLD, directory / "c")

            def raise_fault():
                raise fault(f"injected at step {index} ({steps[index]}, {when})")

            with _faults(monkeypatch, exchange, index, when, raise_fault), pytest.raises(fault, match="injected"):
                compress.save_compressed(NEW, directory / "c", overwrite=True)
            outcomes.append(_assert_old_or_new_and_clean(directory, directory / "c"))
            compress.save_compressed(NEW, directory / "c", overwrite=True)  # and the next save works
            assert _same_state(compress.load_compressed(directory / "c", model=_skeleton()), NEW)
            assert _hidden(directory) == []
    assert outcomes[0] == "old" and outcomes[-1] == "new"  # a fault before the swap keeps the old one


def _crash_in_child(exchange, path, index, when, monkeypatch):
    """Fork; the child saves NEW onto ``path`` and is killed (``os._exit``) at step ``index``."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover (child)
        code = 3
        try:
            with _faults(monkeypatch, exchange, index, when, lambda: os._exit(17)):
                compress.save_compressed(NEW, path, overwrite=True)
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
@pytest.mark.parametrize("exchange", [True, False], ids=["renameat2", "two-renames"])
def test_a_kill_at_any_step_is_recovered_by_the_next_load_or_save(tmp_path, monkeypatch, exchange):
    steps = _save_trace(tmp_path, monkeypatch, exchange)
    outcomes, missing_before_recovery, leftovers_seen = [], 0, 0
    for index in range(len(steps)):
        for when in ("before", "after"):
            for repair in ("load", "save"):
                directory = tmp_path / f"{index}-{when}-{repair}"
                directory.mkdir()
                compress.save_compressed(OLD, directory / "c")
                assert _crash_in_child(exchange, directory / "c", index, when, monkeypatch) == 17
                leftovers_seen += bool(_hidden(directory))
                missing_before_recovery += not (directory / "c").exists()
                if repair == "load":
                    outcomes.append(_assert_old_or_new_and_clean(directory, directory / "c"))
                else:
                    with pytest.raises(FileExistsError, match="overwrite=True"):  # recovered to ours first
                        compress.save_compressed(NEW, directory / "c")
                    compress.save_compressed(NEW, directory / "c", overwrite=True)
                    assert _same_state(compress.load_compressed(directory / "c", model=_skeleton()), NEW)
                    assert _hidden(directory) == []
    assert outcomes[0] == "old" and outcomes[-1] == "new"
    assert leftovers_seen > 0  # kills do leave temporaries / backups behind, which recovery removed
    assert missing_before_recovery == (0 if exchange else 4)  # between the two renames (before/after x 2)


def test_a_failed_rename_into_place_puts_the_old_checkpoint_back_at_once(tmp_path, monkeypatch):
    compress.save_compressed(OLD, tmp_path / "c")
    real_rename = os.rename

    def rename(source, destination):
        if str(source).rsplit("/", 1)[-1].startswith(".c.tmp-"):
            raise OSError(28, "No space left on device")
        return real_rename(source, destination)

    monkeypatch.setattr(safe_write, "_exchange_directories", lambda first, second: False)
    monkeypatch.setattr(os, "rename", rename)
    with pytest.raises(OSError, match="No space left"):
        compress.save_compressed(NEW, tmp_path / "c", overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c"]
    assert _same_state(compress.load_compressed(tmp_path / "c", model=_skeleton()), OLD)


def test_a_kill_during_the_first_save_leaves_nothing(tmp_path, monkeypatch):
    steps = []
    with _faults(monkeypatch, True) as calls:
        compress.save_compressed(NEW, tmp_path / "first" / "c")
        steps = list(calls)
    for index in range(len(steps)):
        directory = tmp_path / f"{index}"
        directory.mkdir()
        assert _crash_in_child(True, directory / "c", index, "before", monkeypatch) == 17
        if (directory / "c").exists():
            assert _assert_old_or_new_and_clean(directory, directory / "c") == "new"
        else:
            with pytest.raises(CheckpointError, match="no manifest.json"):
                compress.load_compressed(directory / "c", model=_skeleton())
            assert _hidden(directory) == []


def test_leftovers_of_a_live_process_are_left_alone(tmp_path):
    compress.save_compressed(OLD, tmp_path / "c")
    parent_pid = os.getppid()  # alive, and not us
    busy = tmp_path / f".c.tmp-{parent_pid}-abcd1234"
    busy.mkdir()
    dead = tmp_path / ".c.tmp-999999999-abcd1234"
    dead.mkdir()
    compress.load_compressed(tmp_path / "c", model=_skeleton())
    assert _hidden(tmp_path) == [busy.name]


def test_renameat2_exchange_swaps_two_directories_or_reports_unsupported(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x").write_text("a")
    (tmp_path / "b").mkdir()
    if not safe_write._exchange_directories(tmp_path / "a", tmp_path / "b"):
        pytest.skip("renameat2(RENAME_EXCHANGE) is not supported here; the fallback is tested above")
    assert (tmp_path / "b" / "x").read_text() == "a" and list((tmp_path / "a").iterdir()) == []


def test_when_putting_the_old_checkpoint_back_fails_too_the_backup_is_kept_for_recovery(tmp_path, monkeypatch):
    compress.save_compressed(OLD, tmp_path / "c")
    real_rename = os.rename

    def rename(source, destination):
        if str(destination) == str(tmp_path / "c"):  # neither the new one nor the backup gets into place
            raise OSError(5, "Input/output error")
        return real_rename(source, destination)

    monkeypatch.setattr(safe_write, "_exchange_directories", lambda first, second: False)
    monkeypatch.setattr(os, "rename", rename)
    with pytest.raises(OSError, match="Input/output error"):
        compress.save_compressed(NEW, tmp_path / "c", overwrite=True)
    assert not (tmp_path / "c").exists()
    (backup,) = _hidden(tmp_path)
    assert backup.startswith(".c.old-")  # the only copy of the old checkpoint: kept
    monkeypatch.setattr(os, "rename", real_rename)
    assert _assert_old_or_new_and_clean(tmp_path, tmp_path / "c") == "old"


# ---- saves racing for one path -----------------------------------------------------------------
def _save_in_child(model, path, overwrite=False, start=None) -> int:
    """Fork a process that saves ``model`` to ``path`` (after a byte on the pipe ``start``, when given);
    returns its pid. Exit codes: 0 saved, 3 FileExistsError, 4 anything else."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover (child)
        code = 4
        try:
            if start is not None:
                os.read(start, 1)
            compress.save_compressed(model, path, overwrite=overwrite)
            code = 0
        except FileExistsError:
            code = 3
        finally:
            os._exit(code)
    return pid


def _exit_code(pid) -> int:
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def _another_save_while_writing(monkeypatch, path, existing_empty=False, overwrite=False):
    """Save OLD to ``path``; while it writes its temporary, another process saves NEW there (overwrite=False)
    and finishes first."""
    real_write = save_module._write_directory
    raced = []

    def write(model, directory):
        if not raced:
            raced.append(True)
            assert _exit_code(_save_in_child(NEW, path)) == 0
        real_write(model, directory)

    if existing_empty:
        path.mkdir()
    monkeypatch.setattr(save_module, "_write_directory", write)
    return compress.save_compressed(OLD, path, overwrite=overwrite)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
@pytest.mark.parametrize("existing_empty", [False, True], ids=["new-path", "empty-directory"])
def test_the_second_of_two_saves_to_a_new_path_fails_and_the_first_is_kept(tmp_path, monkeypatch, existing_empty):
    with pytest.raises(FileExistsError, match=r"c: a non-empty directory \(another save's, most likely\) appeared "
                                              r"there while this save was writing .*without overwrite=True; this "
                                              r"model was not saved"):
        _another_save_while_writing(monkeypatch, tmp_path / "c", existing_empty)
    assert _same_state(compress.load_compressed(tmp_path / "c", model=_skeleton()), NEW)
    assert _hidden(tmp_path) == []


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_with_overwrite_the_last_of_two_saves_wins(tmp_path, monkeypatch):
    _another_save_while_writing(monkeypatch, tmp_path / "c", overwrite=True)
    assert _same_state(compress.load_compressed(tmp_path / "c", model=_skeleton()), OLD)
    assert _hidden(tmp_path) == []


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_of_two_processes_saving_one_new_path_at_once_exactly_one_succeeds(tmp_path):
    for attempt in range(3):
        path = tmp_path / f"{attempt}" / "c"
        read_end, write_end = os.pipe()
        pids = [_save_in_child(model, path, start=read_end) for model in (OLD, NEW)]
        os.write(write_end, b"go")  # one byte each: both start at once
        codes = sorted(_exit_code(pid) for pid in pids)
        os.close(read_end), os.close(write_end)
        assert codes == [0, 3], codes
        loaded = compress.load_compressed(path, model=_skeleton())
        assert _same_state(loaded, OLD) or _same_state(loaded, NEW)
        assert _hidden(path.parent) == []
