"""Facts about the device a launch runs on, read from the device: SM count, L2 size, DRAM bandwidth, Hopper
features.

The dispatch tables size their grids by the SM count (e.g. "at least two programs per SM"), and the
tuning sweeps rotate enough input sets to exceed L2. Both come from
``torch.cuda.get_device_properties`` (``multi_processor_count``, ``L2_cache_size``), read once per
device and cached. Without a CUDA device (Triton's CPU interpreter, ``meta`` tensors) they are an
H100 SXM's: 132 SMs and 50 MiB of L2, the GPU every table was first tuned on, so a CPU test sees the
same picks as the H100 (the H200 has the same SM count and L2).

:func:`dram_bytes_per_s`: the DRAM's peak bandwidth, 2 transfers per memory clock times the bus width
(``memory_clock_rate`` in kHz, ``memory_bus_width`` in bits): an H100 SXM's HBM3 3.35 TB/s (2.619 GHz x
5120 bits), an H200's HBM3e 4.81 TB/s (3.201 GHz x 6016 bits). :func:`fast_dram` (at least
:data:`FAST_DRAM_BYTES_PER_S`) is how a table tells the two apart where their one-row kernels want
other tiles: the same latency at 1.43x the bandwidth needs more bytes in flight per program.

:func:`hopper_or_newer`: compute capability 9.0 or later, which programmatic dependent launch,
TMA descriptors and the bulk L2 prefetch need; :func:`tma_capable` and :func:`tma_describable`: whether a
tensor descriptor can run on a device and describe a tensor.
"""
from __future__ import annotations

import functools

import torch

H100_SM_COUNT = 132
H100_L2_BYTES = 50 * 2**20
H100_DRAM_BYTES_PER_S = 2 * 2_619_000_000 * 5120 // 8  # HBM3: 2.619 GHz memory clock, 5120-bit bus
FAST_DRAM_BYTES_PER_S = 4 * 10**12  # HBM3e-class DRAM (an H200's 4.81 TB/s) from here on


@functools.lru_cache(maxsize=None)
def _properties(index: int) -> tuple[int, int, int, int]:
    """(SM count, L2 bytes, compute capability major, peak DRAM bytes per second) of CUDA device ``index``."""
    props = torch.cuda.get_device_properties(index)
    dram = 2 * props.memory_clock_rate * 1000 * props.memory_bus_width // 8
    return props.multi_processor_count, props.L2_cache_size, props.major, dram


def _cuda_index(device) -> int | None:
    """The CUDA device index of ``device`` (a torch.device or its name), None when it is not CUDA."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    return device.index if device.index is not None else torch.cuda.current_device()


def sm_count(device) -> int:
    """Streaming multiprocessors of ``device`` (:data:`H100_SM_COUNT` when it is not a CUDA device)."""
    index = _cuda_index(device)
    return H100_SM_COUNT if index is None else _properties(index)[0]


def l2_bytes(device) -> int:
    """L2 cache bytes of ``device`` (:data:`H100_L2_BYTES` when it is not a CUDA device)."""
    index = _cuda_index(device)
    return H100_L2_BYTES if index is None else _properties(index)[1]


def dram_bytes_per_s(device) -> int:
    """Peak DRAM bandwidth of ``device`` in bytes per second (:data:`H100_DRAM_BYTES_PER_S` when it is not a
    CUDA device)."""
    index = _cuda_index(device)
    return H100_DRAM_BYTES_PER_S if index is None else _properties(index)[3]


def fast_dram(device) -> bool:
    """Whether ``device``'s DRAM streams at least :data:`FAST_DRAM_BYTES_PER_S` (an H200, not an H100)."""
    return dram_bytes_per_s(device) >= FAST_DRAM_BYTES_PER_S


def hopper_or_newer(device) -> bool:
    """True for a CUDA device of compute capability 9.0 or later (False off CUDA)."""
    index = _cuda_index(device)
    return index is not None and _properties(index)[2] >= 9


def tma_capable(device) -> bool:
    """Whether tensor descriptors (TMA) run on ``device``: a CUDA GPU of compute capability >= 9.0, or no CUDA
    device (Triton's interpreter runs them; the tables read an H100's facts there)."""
    return torch.device(device).type != "cuda" or hopper_or_newer(device)


def tma_describable(t: torch.Tensor) -> bool:
    """Whether a 2-d tensor descriptor can hold ``t``: unit stride along the last dim, 16-byte aligned base
    pointer and row stride."""
    return t.stride(-1) == 1 and t.stride(0) * t.element_size() % 16 == 0 and t.data_ptr() % 16 == 0
