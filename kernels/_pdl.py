"""Programmatic dependent launch (PDL, Hopper and later): start a kernel before the previous one ends.

A kernel launched with ``launch_pdl=True`` may be scheduled while the kernel before it on the
stream is still finishing. Until it executes ``griddepcontrol.wait`` (:func:`wait_for_inputs`) it
must only read memory that no earlier kernel still writes (weights, scales, bias: fixed after
export) and write nothing; after the wait, the previous kernel has completed and its writes are
visible. :func:`let_dependents_launch` tells the hardware that the next PDL kernel may start its own
prologue; it gives no memory ordering (the next kernel still waits), so it can go anywhere.

Why: at decode a layer is a chain of small kernels, and each of ours starts by streaming weights
that do not depend on the previous kernel. With PDL the launch latency and the first weight loads of
our kernel overlap the tail of the one before (a norm, an activation, the quantize pass). Users:
the one-row W4A16 and W8A8 kernels, W8A8's quantize pass and GEMM, and both DDS kernels.

Opt-in while unmeasured: ``COMPRESS_KERNELS_PDL=1`` turns it on for CUDA devices of compute
capability >= 9.0; the interpreter and older GPUs never use it. In a CUDA graph the launch becomes
a programmatic edge (CUDA >= 12.3).
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from kernels._checks import interpreting


def pdl_enabled(device: torch.device) -> bool:
    """Launch with PDL on ``device``: opted in (``COMPRESS_KERNELS_PDL=1``), CUDA, sm_90 or later."""
    if os.environ.get("COMPRESS_KERNELS_PDL", "0") != "1" or interpreting() or device.type != "cuda":
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
