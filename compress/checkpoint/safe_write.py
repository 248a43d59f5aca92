"""Writing a checkpoint directory so that no crash and no bad path loses anything.

Refusals, before anything is written (:func:`check_save_target`): an empty or whitespace path, a path
that is an existing file (or a symlink to one, or a dangling symlink), and an existing directory that
is neither empty nor a checkpoint of ours (:func:`compress.checkpoint.manifest.is_our_checkpoint`);
that refusal holds even with ``overwrite=True``. An existing checkpoint of ours is replaced only with
``overwrite=True`` (else ``FileExistsError`` naming the path and the flag). An empty directory is
saved into. A symlink to a directory saves at the directory it points to, so the link keeps working.

The swap (:func:`replace_directory`) is crash safe. The new checkpoint is written and fsynced in a
hidden sibling ``.NAME.tmp-<pid>-<hex>``. A new path is then one ``rename``. An existing one is
swapped with Linux ``renameat2(RENAME_EXCHANGE)`` (atomic: the path holds the old or the new
checkpoint at every instant; the old one, now in the temporary, is deleted after the parent directory
is fsynced). Where that call is unavailable the fallback is two renames: the old directory to
``.NAME.old-<pid>-<hex>``, the new one onto the path, then the backup is deleted; an exception between
them puts the old directory back at once. A crash at any point (a kill leaves no chance to clean up)
is repaired by :func:`recover` on the next save or load of that path: the path missing and a
``.NAME.old-*`` backup present -> the backup (the newest whole one) is put back; the path present ->
backups are dropped; ``.NAME.tmp-*`` entries are removed. Entries of another process that is still
alive (the pid in the name) are left alone. After a successful save or recovery no hidden ``.NAME.*``
entry remains.

Saves racing for one path: without ``overwrite`` the new checkpoint is put in place by one ``rename``,
which the kernel refuses when the path has meanwhile become a non-empty directory or a file, so of two
processes saving one new path the first to finish wins and the other gets ``FileExistsError`` (its
temporary removed, the winner's checkpoint untouched). With ``overwrite=True`` the last to finish wins.

Modes are the usual ones: directories ``0o777 & ~umask``, files ``0o666 & ~umask`` (the temporary
directory is made with ``os.mkdir``, not ``tempfile.mkdtemp``, whose 0700 would stay on the result;
safetensors writes its file 0600, so the files are given the directory's mode less the execute bits).
"""
from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import logging
import os
import pathlib
import re
import secrets
import shutil
import stat
import sys
from typing import Callable

from compress.checkpoint.manifest import is_our_checkpoint

logger = logging.getLogger(__name__)


def fsync_path(path: pathlib.Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)



def checkpoint_path(path) -> pathlib.Path:
    """The absolute, normalized directory ``path`` names (a symlink to a directory: the directory).

    Refuses a path that is not a str / PathLike, an empty or whitespace one, and the root."""
    if isinstance(path, bytes) or not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path: expected a str or os.PathLike directory path, got {type(path).__name__}")
    text = os.fspath(path)
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"path: expected a non-empty directory path, got {text!r}")
    target = pathlib.Path(os.path.abspath(text))
    if target.is_symlink() and target.is_dir():
        target = pathlib.Path(os.path.realpath(target))
    if not target.name:
        raise ValueError(f"path: expected a directory below the filesystem root, got {text!r}")
    return target



def check_save_target(path, overwrite: bool = False, flag: str = "overwrite=True") -> pathlib.Path:
    """The directory :func:`save_compressed` would write for ``path``, or the error it would raise.

    Call it before long work to fail early (``compress export`` does, before converting the weights). It runs
    :func:`recover` first, so a path left by a crashed save is judged as it will be saved onto."""
    if not isinstance(overwrite, bool):
        raise TypeError(f"overwrite: expected a bool, got {type(overwrite).__name__}")
    target = checkpoint_path(path)
    if target.is_symlink() and not target.exists():
        raise FileExistsError(f"{target}: is a dangling symlink; expected a new or empty directory, "
                              "or a compressed checkpoint")
    if target.exists() and not target.is_dir():
        raise FileExistsError(f"{target}: is an existing file, not a directory; refusing to replace it "
                              "(save_compressed writes a directory: choose a new path)")
    recover(target)
    if not target.is_dir():
        return target
    if is_our_checkpoint(target):
        if not overwrite:
            raise FileExistsError(f"{target}: already holds a compressed checkpoint; pass {flag} to replace it")
        return target
    entries = sorted(os.listdir(target))
    if entries:
        shown = ", ".join(entries[:3]) + (", ..." if len(entries) > 3 else "")
        raise FileExistsError(f"{target}: is a non-empty directory that is not a compressed checkpoint "
                              f"(it holds {shown}); refusing to replace it, even with {flag}: "
                              "choose a new or empty directory")
    return target


def _new_hidden_dir(target: pathlib.Path, kind: str) -> pathlib.Path:
    """Make ``.NAME.<kind>-<pid>-<hex>`` next to ``target`` with mode 0o777 & ~umask."""
    while True:
        candidate = target.with_name(f".{target.name}.{kind}-{os.getpid()}-{secrets.token_hex(4)}")
        try:
            os.mkdir(candidate, 0o777)
            return candidate
        except FileExistsError:
            continue


def _normal_file_modes(directory: pathlib.Path) -> None:
    """Files in ``directory`` get 0o666 & ~umask: the directory's own mode (made 0o777 & ~umask by
    ``os.mkdir``) without execute bits. safetensors writes 0600 whatever the umask."""
    mode = stat.S_IMODE(directory.stat().st_mode) & 0o666
    for entry in directory.iterdir():
        if entry.is_file() and not entry.is_symlink():
            os.chmod(entry, mode)


def _hidden_name(target: pathlib.Path, kind: str) -> pathlib.Path:
    return target.with_name(f".{target.name}.{kind}-{os.getpid()}-{secrets.token_hex(4)}")


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100
_libc = None


def _exchange_directories(first: pathlib.Path, second: pathlib.Path) -> bool:
    """Atomically swap two paths with Linux ``renameat2(RENAME_EXCHANGE)``; False where unsupported
    (not Linux, no such libc symbol, or a filesystem that refuses it), leaving both untouched."""
    global _libc
    if not sys.platform.startswith("linux"):
        return False
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    renameat2 = getattr(_libc, "renameat2", None)
    if renameat2 is None:
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    result = renameat2(_AT_FDCWD, os.fsencode(first), _AT_FDCWD, os.fsencode(second), _RENAME_EXCHANGE)
    if result == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False
    raise OSError(code, f"renameat2(RENAME_EXCHANGE) {first} <-> {second}: {os.strerror(code)}")


def _remove(path: pathlib.Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:
        return False
    return True


def _leftovers(target: pathlib.Path) -> dict[str, list[pathlib.Path]]:
    """Hidden ``.NAME.tmp-*`` / ``.NAME.old-*`` siblings of ``target`` that no other live process owns."""
    found = {"tmp": [], "old": []}
    pattern = re.compile(rf"^\.{re.escape(target.name)}\.(tmp|old)-(.+)$")
    try:
        names = os.listdir(target.parent)
    except OSError:  # a parent we cannot read holds nothing we could repair
        return found
    for name in names:
        match = pattern.match(name)
        if match is None:
            continue
        pid = re.match(r"^(\d+)(?:-|$)", match.group(2))
        if pid is not None and int(pid.group(1)) != os.getpid() and _pid_alive(int(pid.group(1))):
            continue  # another process is saving this path right now
        found[match.group(1)].append(target.parent / name)
    return found


def recover(path) -> pathlib.Path:
    """Repair what a save of ``path`` interrupted at any point left behind (see the module docstring);
    returns the directory. Does nothing (and writes nothing) when there is nothing to repair."""
    target = checkpoint_path(path)
    leftovers = _leftovers(target)
    if not leftovers["tmp"] and not leftovers["old"]:
        return target
    backups = leftovers["old"]
    if not os.path.lexists(target) and backups:
        whole = [b for b in backups if is_our_checkpoint(b)]
        chosen = max(whole or backups, key=lambda b: b.stat().st_mtime_ns)
        os.rename(chosen, target)
        logger.warning("recovered %s from the backup %s of an interrupted save", target, chosen.name)
        backups = [b for b in backups if b != chosen]
    for leftover in [*leftovers["tmp"], *backups]:
        _remove(leftover)
    fsync_path(target.parent)
    return target



def _rename_unless_taken(source: pathlib.Path, target: pathlib.Path, overwrite: bool) -> bool:
    """Rename the directory ``source`` to ``target`` unless ``target`` holds something by now: the kernel
    does this atomically (a directory replaces only a missing path or an empty directory). False when
    ``target`` is a non-empty directory and ``overwrite`` allows a swap; else FileExistsError."""
    try:
        os.rename(source, target)
        return True
    except OSError as error:
        if error.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR):
            raise
        if overwrite and error.errno != errno.ENOTDIR:
            return False
        found = "a file" if error.errno == errno.ENOTDIR else "a non-empty directory (another save's, most likely)"
    raise FileExistsError(f"{target}: {found} appeared there while this save was writing (the path was new or "
                          f"empty when checked); refusing to replace it{'' if overwrite else ' without overwrite=True'}"
                          "; this model was not saved")


def replace_directory(target: pathlib.Path, write: Callable[[pathlib.Path], None], overwrite: bool = False) -> None:
    """Put the directory that ``write(temporary)`` fills at ``target`` (checked by
    :func:`check_save_target`), crash safe (see the module docstring). Without ``overwrite`` the target is
    claimed atomically: if another save put a checkpoint there meanwhile, this one raises FileExistsError
    and that checkpoint stays."""
    target.parent.mkdir(parents=True, exist_ok=True)
    temporary = _new_hidden_dir(target, "tmp")  # the new checkpoint; after an exchange, the old one
    backup = None  # the fallback's ``.NAME.old-*``: the old checkpoint while the path is empty
    try:
        write(temporary)
        _normal_file_modes(temporary)
        fsync_path(temporary)
        if (not overwrite or not target.exists()) and _rename_unless_taken(temporary, target, overwrite):
            temporary = None
        elif not _exchange_directories(temporary, target):
            backup = _hidden_name(target, "old")
            os.rename(target, backup)
            os.rename(temporary, target)
            temporary = None
        fsync_path(target.parent)
        if temporary is not None:
            shutil.rmtree(temporary)
            temporary = None
        if backup is not None:
            shutil.rmtree(backup)
            backup = None
        fsync_path(target.parent)
    except BaseException:
        if backup is not None and not os.path.lexists(target):
            with contextlib.suppress(OSError):
                os.rename(backup, target)  # put the old checkpoint back at once
                backup = None
        # the temporary is never the only copy of the old checkpoint; a backup is removed only when the
        # path holds the new one (else :func:`recover` puts it back later)
        for leftover in (temporary, backup if os.path.lexists(target) else None):
            if leftover is not None and os.path.lexists(leftover):
                with contextlib.suppress(OSError):
                    _remove(leftover)
        raise
