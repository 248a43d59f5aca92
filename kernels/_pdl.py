"""Programmatic dependent launch (PDL, Hopper and later): start a kernel before the previous one ends.

A kernel launched with ``launch_pdl=True`` may be scheduled while the kernel before it on the
stream is still finishing. Until it executes ``griddepcontrol.wait`` (:func:`wait_for_inputs`) it
must only read memory that no earlier kernel still writes (weights, scales, bias: fixed after
export) and write nothing; after the wait, the previous kernel has completed and its writes are
visible. :func:`let_dependents_launch` tells the hardware that the next PDL kernel may start its own
prologue; it gives no memory ordering (the next kernel still waits), so it can go anywhere.

Where it is on (``COMPRESS_KERNELS_PDL``, CUDA devices of compute capability >= 9.0 only; the
interpreter and older GPUs never use it):

* ``pair`` (default): only the places where two of our kernels follow each other, one writing what
  the other reads: W8A8's quantize pass and the GEMM after it, and W4A16's x permutation and the
  swapped nibble-pair GEMM after it (:mod:`kernels.w4a16_wgmma`). The first kernel lets the second
  launch after its last store, and the second waits before reading what the first wrote. On an
  H100 the W8A8 pair took all-MiniLM-L6-v2's W8A8 forward at batch 1 (64 tokens, CUDA graph) from
  0.313-0.316 ms to 0.292-0.293 ms (dense 0.290-0.295 ms);
  letting the GEMM launch at the start of the quantize pass instead made batch 8 slower
  (0.363 -> 0.467 ms; probably the early GEMM programs took SM slots while quantize programs
  still ran: not profiled). The W4A16 pair: 8192x28672 at M = 64 went 121.3 -> 116.8 us between two
  full kernel benchmark runs without and with it; the other pair cells moved by at most 1.4 us.
* ``all``: also the one-row W4A16 and W8A8 kernels and both DDS kernels, which load their weights
  before the wait. Slower on the H100 decode benchmark (Llama-2-7B shapes, batch 1, CUDA graphs:
  W4A16 2.707 -> 2.781 ms per step, W8A8 3.886 -> 3.972, DDS 90% 1.764 -> 1.828), so not the
  default; kept for other GPUs and sizes (docs/kernels-notes.md, "Programmatic dependent launch").
* ``0``: off.

In a CUDA graph the launch becomes a programmatic edge (CUDA >= 12.3).
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from compress_kernels._checks import interpreting


PDL_MODES = ("pair", "all", "0")


def pdl_mode() -> str:
    """``COMPRESS_KERNELS_PDL``: one of :data:`PDL_MODES`, ``pair`` when unset."""
    mode = os.environ.get("COMPRESS_KERNELS_PDL", "pair")
    if mode not in PDL_MODES:
        raise ValueError(f"COMPRESS_KERNELS_PDL: expected one of {list(PDL_MODES)}, got {mode!r}")
    return mode


def pdl_enabled(device: torch.device, pair: bool = False) -> bool:
    """Launch with PDL on ``device``: a kernel of one of the producer + consumer pairs above (``pair``)
    in mode ``pair`` or ``all``, any other PDL-capable kernel in mode ``all``; CUDA, sm_90 or later."""
    mode = pdl_mode()
    if mode == "0" or (mode == "pair" and not pair) or interpreting() or device.type != "cuda":
        return False
    return torch.cuda.get_device_capability(device)[0] >= 9


def launch_options(use_pdl: bool) -> dict:
    """Extra keyword arguments of a Triton launch: ``launch_pdl`` only when it is on."""
    return {"launch_pdl": True} if use_pdl else {}


@triton.jit
def wait_for_inputs(USE_PDL: tl.constexpr):
    """Block until the previous kernel has completed and its writes are visible (no-op without PDL)."""
    if USE_PDL:
        tl.extra.cuda.gdc_wait()


@triton.jit
def let_dependents_launch(USE_PDL: tl.constexpr):
    """Allow the next PDL kernel on the stream to be scheduled (no-op without PDL)."""
    if USE_PDL:
        tl.extra.cuda.gdc_launch_dependents()
