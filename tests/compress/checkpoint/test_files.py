"""compress/checkpoint/files.py: the loaders read regular files only, never block on a pipe, and refuse a
safetensors header whose sizes do not fit the file before reading any tensor data."""
import contextlib
import json
import os
import signal
import socket
import struct

import pytest
import torch
from safetensors.torch import load_file, save_file

import compress.checkpoint.files as files
from compress.checkpoint.files import (
    CheckpointError,
    NotRegularFileError,
    check_regular_entries,
    read_json,
    read_safetensors,
    read_safetensors_header,
)


@contextlib.contextmanager
def fails_instead_of_hanging(seconds=10):
    """A call that blocks (a pipe opened for reading waits for a writer) fails the test instead of hanging it."""
    def hung(signum, frame):
        raise AssertionError(f"blocked for {seconds} s")
    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _special(tmp_path, kind, name):
    """A ``kind`` entry named ``name``: a named pipe, a socket, a directory or a symlink to a device."""
    path = tmp_path / name
    if kind == "pipe":
        os.mkfifo(path)
    elif kind == "socket":
        server = socket.socket(socket.AF_UNIX)
        server.bind(str(path))
        server.close()
    elif kind == "directory":
        path.mkdir()
    else:
        path.symlink_to("/dev/zero")
    return path


KINDS = {"pipe": "a named pipe", "socket": "a socket", "directory": "a directory", "device": "a character device"}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("reader", [read_json, read_safetensors, read_safetensors_header])
def test_anything_but_a_regular_file_is_refused_without_blocking(tmp_path, kind, reader):
    path = _special(tmp_path, kind, "config.json")
    with fails_instead_of_hanging(), pytest.raises(NotRegularFileError,
                                                   match=rf"config\.json: expected a regular file, got {KINDS[kind]}"):
        reader(path)


def test_a_missing_file_is_file_not_found_and_damaged_json_is_named(tmp_path):
    with pytest.raises(FileNotFoundError):
        read_json(tmp_path / "absent.json")
    (tmp_path / "bad.json").write_bytes(b"{\xff")
    with pytest.raises(CheckpointError, match=r"bad\.json: damaged manifest, expected UTF-8 JSON"):
        read_json(tmp_path / "bad.json", "manifest")
    (tmp_path / "good.json").write_text('{"a": [1]}')
    assert read_json(tmp_path / "good.json") == {"a": [1]}


@pytest.mark.parametrize("kind", ["pipe", "socket", "device"])
def test_a_directory_holding_a_special_entry_is_refused_naming_it(tmp_path, kind):
    (tmp_path / "model.safetensors").write_bytes(b"x")
    (tmp_path / "sub").mkdir()
    (tmp_path / "dangling").symlink_to(tmp_path / "absent")
    check_regular_entries(tmp_path)  # regular files, directories and dangling links block nothing
    _special(tmp_path, kind, "tokenizer.json")
    with pytest.raises(NotRegularFileError, match=rf"tokenizer\.json: expected a regular file, got {KINDS[kind]}"):
        check_regular_entries(tmp_path)


def test_tensors_are_the_stored_ones_in_aligned_memory(tmp_path):
    tensors = {name: (torch.randn(3, 5) * 10).to(dtype) for name, dtype in files.SAFETENSORS_DTYPES.items()
               if dtype != torch.bool}
    tensors.update(bool=torch.rand(3, 5) > 0.5, scalar=torch.tensor(3.5), empty=torch.zeros(0, 4),
                   odd=torch.arange(7, dtype=torch.int8))
    save_file(tensors, str(tmp_path / "t.safetensors"))
    ours, library = read_safetensors(tmp_path / "t.safetensors"), load_file(str(tmp_path / "t.safetensors"))
    assert ours.keys() == library.keys()
    for name, tensor in library.items():
        assert ours[name].dtype == tensor.dtype and ours[name].shape == tensor.shape, name
        assert torch.equal(ours[name].reshape(-1).view(torch.uint8), tensor.reshape(-1).view(torch.uint8)), name
        assert ours[name].numel() == 0 or ours[name].data_ptr() % 64 == 0, name
    assert read_safetensors_header(tmp_path / "t.safetensors")["odd"] == (torch.int8, [7])
    ours["F32"].add_(1)  # a private mapping: the file keeps its bytes
    assert torch.equal(load_file(str(tmp_path / "t.safetensors"))["F32"], library["F32"])


def _file(path, header, data=b"", length=None):
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text) if length is None else length) + text + data)
    return path


HUGE = {"w": {"dtype": "F32", "shape": [500_000_000], "data_offsets": [0, 2_000_000_000]}}
DAMAGE = {  # header, data, declared header length -> what the error says
    "a huge tensor": (HUGE, bytes(64), None, r"'w': data_offsets \[0, 2000000000\], expected \[begin, end\] "
                                             r"within the 64 data bytes"),
    "a huge header": ({}, b"", 2_000_000_000, r"the header declares 2000000000 bytes, the file holds 2"),
    "offsets that do not fit the shape": ({"w": {"dtype": "F32", "shape": [4, 4], "data_offsets": [0, 32]}},
                                          bytes(32), None,
                                          r"'w': F32 \[4, 4\] needs 64 bytes, its data_offsets span 32"),
    "overlapping tensors": ({"a": {"dtype": "U8", "shape": [8], "data_offsets": [0, 8]},
                             "b": {"dtype": "U8", "shape": [8], "data_offsets": [4, 12]}}, bytes(12), None,
                            r"'b' starts at data byte 4, expected 8"),
    "bytes no tensor covers": ({"a": {"dtype": "U8", "shape": [8], "data_offsets": [0, 8]}}, bytes(16), None,
                               r"the tensors cover 8 data bytes, the file holds 16"),
    "an unknown dtype": ({"a": {"dtype": "F4", "shape": [2], "data_offsets": [0, 1]}}, bytes(1), None,
                         r"'a': dtype 'F4'"),
    "a negative size": ({"a": {"dtype": "U8", "shape": [-8], "data_offsets": [0, 8]}}, bytes(8), None,
                        r"'a': shape \[-8\], expected a list of non-negative integers"),
    "a header that is not an object": ([1, 2], b"", None, r"the header is a JSON list"),
}


@pytest.mark.parametrize("case", DAMAGE)
def test_a_header_that_does_not_fit_the_file_is_refused_before_any_data_is_read(tmp_path, monkeypatch, case):
    header, data, length, message = DAMAGE[case]
    path = _file(tmp_path / "model.safetensors", header, data, length)

    def no_mapping(*args, **kwargs):
        raise AssertionError("tensor data was mapped before the header was validated")
    monkeypatch.setattr(files.mmap, "mmap", no_mapping)
    with pytest.raises(CheckpointError, match=r"model\.safetensors: not a readable safetensors file \(.*" + message):
        read_safetensors(path)
    with pytest.raises(CheckpointError, match=message):
        read_safetensors_header(path)


def test_a_file_shorter_than_the_header_length_is_refused(tmp_path):
    (tmp_path / "short.safetensors").write_bytes(b"\x01\x02")
    with pytest.raises(CheckpointError, match=r"short\.safetensors: not a readable safetensors file \(2 bytes"):
        read_safetensors(tmp_path / "short.safetensors")
