"""Programmatic dependent launch (PDL, Hopper and later): start a kernel before the previous one ends.

A kernel launched with ``launch_pdl=True`` may be scheduled while the kernel before it on the
stream is still finishing. Until it executes ``griddepcontrol.wait`` (:func:`wait_for_inputs`) it
must only read memory that no earlier kernel still writes (weights, scales, bias: fixed after
export) and write nothing; after the wait, the previous kernel has completed and its writes are
visible. :func:`let_dependents_launch` tells the hardware that the next PDL kernel may start its own
prologue; it gives no memory ordering (the next kernel still waits), so it can go anywhere.

PDL is used only where two of our kernels follow each other, one writing what the other reads:

* W8A8's per-token quantize pass (:mod:`compress_kernels.common.quantize`, also the LayerNorm /
  RMSNorm / GELU kernels of :mod:`compress_kernels.norm_quant`) and the int8 GEMM after it (the
  dense tiles, the TMA tiles, the block-sparse W8A8 kernel). On an H100 this took
  all-MiniLM-L6-v2's W8A8 forward at batch 1 (64 tokens, CUDA graph) from 0.313-0.316 ms to
  0.292-0.293 ms (dense fp16 0.290-0.295 ms). The first kernel lets the second launch after its
  last store: at its start instead, batch 8 got slower (0.363 -> 0.467 ms).
* W4A16's x permutation and the swapped nibble-pair GEMM after it (:mod:`compress_kernels.w4a16.wgmma`):
  8192x28672 at M = 64 121.3 -> 116.8 us.

Kernels that start a layer (the one-row kernels, DDS) do not use it: letting them load their weights
before the wait was slower on the H100 decode benchmark (Llama-2-7B shapes, batch 1: W4A16 2.707 ->
2.781 ms per step, W8A8 3.886 -> 3.972, DDS 90% 1.764 -> 1.828).

``COMPRESS_KERNELS_PDL``: ``pair`` (the default, as above) or ``0`` (off). PDL runs only on CUDA
devices of compute capability >= 9.0, never in the interpreter. In a CUDA graph the launch becomes a
programmatic edge (CUDA >= 12.3).
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from compress_kernels.common.checks import interpreting
from compress_kernels.common.device import hopper_or_newer

PDL_MODES = ("pair", "0")


def pdl_mode() -> str:
    """``COMPRESS_KERNELS_PDL``: one of :data:`PDL_MODES`, ``pair`` when unset."""
    mode = os.environ.get("COMPRESS_KERNELS_PDL", "pair")
    if mode not in PDL_MODES:
        raise ValueError(f"COMPRESS_KERNELS_PDL: expected one of {list(PDL_MODES)}, got {mode!r}")
    return mode


def pdl_enabled(device: torch.device) -> bool:
    """Launch a producer + consumer pair with PDL on ``device``: mode ``pair``, CUDA, sm_90 or later."""
    return pdl_mode() == "pair" and not interpreting() and hopper_or_newer(device)


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
