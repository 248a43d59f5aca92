"""Reading the files of a model directory: regular files only, never blocking, sizes checked first.

Every JSON and safetensors file the loaders read goes through :func:`open_regular`: the file is opened
with ``O_NONBLOCK`` (opening a named pipe for reading then returns at once instead of waiting for a
writer forever) and kept only when ``fstat`` of the opened descriptor says it is a regular file, so no
check-then-open race can slip a pipe, a device or a directory in. Anything else is a
:class:`CheckpointError` naming the file and what it is. For the files that ``transformers`` opens
itself (a plain model directory), :func:`check_regular_entries` refuses a directory holding any such
entry before ``transformers`` is called.

:func:`read_safetensors` parses the safetensors header itself and checks every size it declares against
the file's size (header length, each tensor's byte range against its dtype and shape, the ranges
covering the data exactly) before it reads any tensor data, so a damaged header that declares a huge
tensor is refused without allocating it. The tensors are then views of a private mapping (``mmap``) of
the same open file: names, dtypes, shapes and bytes exactly as stored.
"""
from __future__ import annotations

import contextlib
import errno
import json
import mmap
import os
import pathlib
import stat
import struct
import sys

import torch

from compress.checkpoint.rebuild import ALIGNMENT

MAX_HEADER_BYTES = 100 * 1024 * 1024  # the safetensors library's own limit on the JSON header
_HEADER_LENGTH_BYTES = 8


class CheckpointError(ValueError):
    """A compressed-model directory is damaged, incomplete or does not match what it claims."""


class NotRegularFileError(CheckpointError):
    """A file the loaders read is a pipe, socket, device or directory: refused, never read. Checks that
    treat a missing or damaged file as "no" (:func:`compress.checkpoint.manifest.is_our_checkpoint`) let
    this one through, so a pipe is reported as what it is."""


def _safetensors_dtypes() -> dict[str, torch.dtype]:
    """safetensors dtype names -> the torch dtypes this torch has (sub-byte formats have none)."""
    names = {"BOOL": "bool", "U8": "uint8", "I8": "int8", "I16": "int16", "U16": "uint16", "I32": "int32",
             "U32": "uint32", "I64": "int64", "U64": "uint64", "F16": "float16", "BF16": "bfloat16",
             "F32": "float32", "F64": "float64", "C64": "complex64", "F8_E4M3": "float8_e4m3fn",
             "F8_E5M2": "float8_e5m2", "F8_E8M0": "float8_e8m0fnu"}
    return {name: getattr(torch, attr) for name, attr in names.items() if hasattr(torch, attr)}


SAFETENSORS_DTYPES = _safetensors_dtypes()


def _kind_of(mode: int) -> str:
    kinds = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISSOCK, "a socket"),
             (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))
    return next((name for test, name in kinds if test(mode)), "not a regular file")


def _not_regular(path, kind: str) -> NotRegularFileError:
    return NotRegularFileError(f"{path}: expected a regular file, got {kind}; refusing to read it (a pipe or device "
                           "could block the load forever or never end)")


def open_regular(path) -> int:
    """A read-only descriptor of ``path`` (symlinks followed), opened without blocking; CheckpointError
    unless the opened file is a regular file. A missing file raises ``FileNotFoundError`` as ``open`` does."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as error:
        if error.errno != errno.ENXIO:
            raise
        raise _not_regular(path, _kind_of(os.stat(path).st_mode)) from None  # a socket cannot be opened (ENXIO)
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise _not_regular(path, _kind_of(mode))
    return fd


@contextlib.contextmanager
def regular_file(path):
    """``open(path, "rb")`` through :func:`open_regular`: a binary file object of a regular file."""
    with os.fdopen(open_regular(path), "rb") as handle:
        yield handle


def read_json(path, what: str = "file"):
    """The JSON value in the regular file ``path`` (UTF-8); CheckpointError naming the file (``what`` it
    is) when it is not a regular file or not UTF-8 JSON, ``FileNotFoundError`` when it is missing."""
    with regular_file(path) as handle:
        data = handle.read()
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CheckpointError(f"{path}: damaged {what}, expected UTF-8 JSON ({error})") from None


def check_regular_entries(directory: pathlib.Path) -> None:
    """CheckpointError naming the first entry of ``directory`` (symlinks followed) that is neither a
    regular file nor a directory: ``transformers`` would open it by name and could block forever."""
    try:
        entries = sorted(os.scandir(directory), key=lambda entry: entry.name)
    except OSError:
        return  # an unreadable directory fails later with its own error, naming the path
    for entry in entries:
        try:
            mode = os.stat(entry.path).st_mode
        except OSError:
            continue  # a dangling symlink blocks nothing
        if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
            raise _not_regular(entry.path, _kind_of(mode))


def _fail(path, detail: str) -> CheckpointError:
    return CheckpointError(f"{path}: not a readable safetensors file ({detail})")


def _read_header(path, handle, file_size: int) -> tuple[dict, int]:
    """(the parsed header, the byte offset where the tensor data starts), the length checked first."""
    if file_size < _HEADER_LENGTH_BYTES:
        raise _fail(path, f"{file_size} bytes, shorter than the {_HEADER_LENGTH_BYTES}-byte header length")
    (length,) = struct.unpack("<Q", handle.read(_HEADER_LENGTH_BYTES))
    if length > min(MAX_HEADER_BYTES, file_size - _HEADER_LENGTH_BYTES):
        raise _fail(path, f"the header declares {length} bytes, the file holds {file_size - _HEADER_LENGTH_BYTES} "
                          f"after the length (at most {MAX_HEADER_BYTES})")
    try:
        header = json.loads(handle.read(length).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise _fail(path, f"the header is not UTF-8 JSON: {error}") from None
    if not isinstance(header, dict):
        raise _fail(path, f"the header is a JSON {type(header).__name__}, expected an object")
    return header, _HEADER_LENGTH_BYTES + length


def _entry(path, name: str, spec, data_size: int) -> tuple[torch.dtype, list[int], int, int]:
    """(dtype, shape, begin, end) of one header entry, its byte range checked against its size and the file."""
    if not isinstance(spec, dict):
        raise _fail(path, f"tensor {name!r}: expected an object {{dtype, shape, data_offsets}}, got {spec!r}")
    dtype, shape, offsets = spec.get("dtype"), spec.get("shape"), spec.get("data_offsets")
    if dtype not in SAFETENSORS_DTYPES:
        raise _fail(path, f"tensor {name!r}: dtype {dtype!r}, expected one of {sorted(SAFETENSORS_DTYPES)}")
    if not isinstance(shape, list) or not all(type(n) is int and n >= 0 for n in shape):
        raise _fail(path, f"tensor {name!r}: shape {shape!r}, expected a list of non-negative integers")
    if (not isinstance(offsets, list) or len(offsets) != 2 or not all(type(n) is int for n in offsets)
            or not 0 <= offsets[0] <= offsets[1] <= data_size):
        raise _fail(path, f"tensor {name!r}: data_offsets {offsets!r}, expected [begin, end] within the "
                          f"{data_size} data bytes of the file")
    numel = 1
    for size in shape:
        numel *= size
    expected = numel * SAFETENSORS_DTYPES[dtype].itemsize
    if offsets[1] - offsets[0] != expected:
        raise _fail(path, f"tensor {name!r}: {dtype} {shape} needs {expected} bytes, its data_offsets span "
                          f"{offsets[1] - offsets[0]}")
    return SAFETENSORS_DTYPES[dtype], shape, offsets[0], offsets[1]


def _check_coverage(path, entries: dict, data_size: int) -> None:
    """The tensors' byte ranges follow each other without gap or overlap and end where the file ends."""
    position = 0
    for name, (_, _, begin, end) in sorted(entries.items(), key=lambda item: (item[1][2], item[1][3])):
        if begin != position:
            raise _fail(path, f"tensor {name!r} starts at data byte {begin}, expected {position} (ranges overlap or "
                              "leave a gap)")
        position = end
    if position != data_size:
        raise _fail(path, f"the tensors cover {position} data bytes, the file holds {data_size}")


def _checked_entries(path, handle, file_size: int) -> tuple[dict, int]:
    """({name: (dtype, shape, begin, end)}, data start) of the file open as ``handle``, all sizes checked."""
    header, data_start = _read_header(path, handle, file_size)
    metadata = header.pop("__metadata__", {})
    if not isinstance(metadata, dict):
        raise _fail(path, f"'__metadata__' is {metadata!r}, expected an object")
    data_size = file_size - data_start
    entries = {name: _entry(path, name, spec, data_size) for name, spec in header.items()}
    _check_coverage(path, entries, data_size)
    return entries, data_start


def read_safetensors_header(path) -> dict[str, tuple[torch.dtype, list[int]]]:
    """{name: (dtype, shape)} of the safetensors file ``path``, every declared size checked; reads no tensor data."""
    with regular_file(path) as handle:
        entries, _ = _checked_entries(path, handle, os.fstat(handle.fileno()).st_size)
    return {name: (dtype, shape) for name, (dtype, shape, _, _) in entries.items()}


def read_safetensors(path) -> dict[str, torch.Tensor]:
    """Every tensor of the safetensors file ``path``; CheckpointError naming the file when it is not a
    regular file or its header does not fit the file (checked before any tensor data is read).

    The tensors are views of a private mapping of the file (pages are read when first used; writes to a
    tensor stay in this process), except those at an offset that is not 64-byte aligned, which are copied
    to aligned memory (CPU kernels pick their code path by alignment)."""
    if sys.byteorder != "little":
        raise CheckpointError(f"{path}: safetensors data is little-endian; this machine is {sys.byteorder}-endian")
    with regular_file(path) as handle:
        file_size = os.fstat(handle.fileno()).st_size
        entries, data_start = _checked_entries(path, handle, file_size)
        if file_size == data_start:
            return {name: torch.empty(shape, dtype=dtype) for name, (dtype, shape, _, _) in entries.items()}
        view = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_COPY)  # stays open while a tensor uses it
    return {name: _tensor(view, data_start, *entry) for name, entry in entries.items()}


def _tensor(view: mmap.mmap, data_start: int, dtype: torch.dtype, shape: list[int], begin: int, end: int):
    if begin == end:
        return torch.empty(shape, dtype=dtype)
    stored = torch.frombuffer(view, dtype=torch.uint8, count=end - begin, offset=data_start + begin)
    if (data_start + begin) % ALIGNMENT:
        stored = stored.clone()
    return stored.view(dtype).reshape(shape)
