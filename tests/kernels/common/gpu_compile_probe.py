"""Compile what every op would launch on an H100 / H200, on a machine without a GPU (no interpreter).

    python -m tests.kernels.common.gpu_compile_probe          # one line per kernel compiled:
                                                              # name, warps, shared bytes, registers, stack bytes

Run without ``TRITON_INTERPRET`` (Triton's JIT must be the compiler, not the interpreter). The device facts
are the H100's (132 SMs, 50 MiB of L2, compute capability 9.0), so the dispatch tables pick what they
pick there (TMA, PDL and L2-prefetch paths included), and every launch goes through
:func:`compress_kernels.common.launch.compiling_for` with ``GPUTarget("cuda", 90, 128)``: each op's host
code runs on CPU tensors of layer-sized shapes and each kernel it would launch is compiled with Triton's own
``ptxas``, nothing run (PyTorch ops between launches do run, on the CPU). Shapes: 4096 x 4096 layers
at M = 1, 16, 64, 256 and 2,048 (W4A16 up to 256, and 8192 x 8192 at M = 1; DDS at 50% free blocks and 75%
in tiles of 4 block rows), Mixtral-like experts (H 1024, I 2048, 8 experts, top-2) at 1, 8 and 512 tokens,
the norm / GELU + quantize passes. A kernel that does not compile raises (exit status 1). Registers and
stack (spill) bytes per thread are read from each cubin with Triton's bundled ``cuobjdump``; the compile
specializes the arguments as the JIT launch does, so they match what the GPU machine reports (its Triton
3.6: the grouped W4A16 decode tiles 139 / 166 registers there and here).
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time

import torch

M_VALUES = (1, 16, 64, 256, 2048)
W4A16_MAX_M = 256  # from 256 rows W4A16 de-quantizes, then multiplies in PyTorch: on the CPU that takes minutes
K = N = 4096


def fake_hopper() -> None:
    """The device facts of an H100 for every device, CPU tensors included (the dispatch tables read them)."""
    import compress_kernels.common.device as device

    device._cuda_index = lambda _device: 0
    device._properties = lambda _index: (device.H100_SM_COUNT, device.H100_L2_BYTES, 9, device.H100_DRAM_BYTES_PER_S)


def tiled_block_sparse(n: int, k: int, sparsity: float, tile_rows: int, dtype) -> torch.Tensor:
    """A dense (n, k) weight whose absent 32 x 32 blocks come in tiles of ``tile_rows`` block rows."""
    gen = torch.Generator().manual_seed(0)
    tiles, cols = n // (32 * tile_rows), k // 32
    keep = (torch.rand(tiles, cols, generator=gen) >= sparsity).float()
    mask = keep.repeat_interleave(32 * tile_rows, 0).repeat_interleave(32, 1)
    return (torch.randn(n, k, generator=gen) * mask / k**0.5).to(dtype)


def dense_ops(dtype) -> None:
    import compress_kernels as ck
    from tests.kernels.helpers import random_block_weight, random_int4_weight, random_int8_weight, random_w8a16_weight

    w_q, w_scale = random_int8_weight(N, K)
    qweight, _, scales = random_int4_weight(K, N, 128)
    wb_q, wb_scale = random_block_weight(N, K)
    w16_q, w16_scale = random_w8a16_weight(N, K, grouped=False)
    w16g_q, w16g_scale = random_w8a16_weight(N, K, grouped=True)
    for m in M_VALUES:
        x = torch.randn(m, K).to(dtype)
        ck.w8a8_matmul(x, w_q, w_scale)
        if m <= W4A16_MAX_M:
            ck.w4a16_matmul(x, qweight, scales.to(dtype), 128)
        ck.w8a8_block_matmul(x, wb_q, wb_scale)
        ck.w8a16_matmul(x, w16_q, w16_scale)
        ck.w8a16_matmul(x, w16g_q, w16g_scale)
    big_qweight, _, big_scales = random_int4_weight(2 * K, 2 * N, 128)  # M = 1 on a larger layer: the one-row kernel
    ck.w4a16_matmul(torch.randn(1, 2 * K).to(dtype), big_qweight, big_scales.to(dtype), 128)


def block_sparse_ops(dtype) -> None:
    import compress_kernels as ck
    from tests.kernels.helpers import block_sparse_dense, bsr_parts, int4_block_sparse, int8_block_sparse

    free = bsr_parts(block_sparse_dense(N, K, 0.5, dtype, device="cpu"))
    tiles = bsr_parts(tiled_block_sparse(N, K, 0.75, 4, dtype))
    int8_parts, int8_scale, _ = int8_block_sparse(N, K, 0.5, device="cpu")
    int4_parts, int4_scales, _, _ = int4_block_sparse(N, K, 0.5, group_size=128, device="cpu")
    for m in M_VALUES:
        x = torch.randn(m, K).to(dtype)
        ck.bsr_matmul_parts(x, *free, N)
        ck.bsr_matmul_parts(x, *tiles, N, tile_rows=4)
        ck.bsr_w8a8_matmul_parts(x, *int8_parts, int8_scale, N)
        ck.bsr_w4a16_matmul(x, *int4_parts, int4_scales.to(dtype), N)


def moe_ops(dtype) -> None:
    import compress_kernels as ck
    from tests.kernels.helpers import random_moe_weights, random_routing

    ops = {"w4a16": ck.moe_w4a16, "w8a8": ck.moe_w8a8, "w8a16": ck.moe_w8a16}
    for scheme, group in (("w4a16", 128), ("w8a8", None), ("w8a16", None), ("w8a16", 128)):
        weights = random_moe_weights(scheme, 8, 1024, 2048, group)
        if scheme != "w8a8":
            weights = tuple(w.to(dtype) if w.is_floating_point() else w for w in weights)
        for tokens in (1, 8, 512):
            ids, topk_weights = random_routing(tokens, 8, 2)
            ops[scheme](torch.randn(tokens, 1024).to(dtype), ids, topk_weights, *weights)


def norm_quant_ops(dtype) -> None:
    import compress_kernels as ck

    x = torch.randn(64, K).to(dtype)
    ck.layer_norm_quantize(x, torch.ones(K, dtype=dtype), torch.zeros(K, dtype=dtype))
    ck.rms_norm_quantize(x, torch.ones(K, dtype=dtype))
    ck.gelu_quantize(x)


def resource_usage(kernel) -> tuple[int, int]:
    """(registers, stack bytes) per thread of a compiled kernel, from its cubin (Triton's bundled cuobjdump)."""
    import triton

    cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
        cubin.write(kernel.asm["cubin"])
        cubin.flush()
        report = subprocess.run([cuobjdump, "--dump-resource-usage", cubin.name], capture_output=True, text=True,
                                check=True).stdout
    found = re.search(r"REG:(\d+) STACK:(\d+)", report)
    if found is None:
        raise RuntimeError(f"cuobjdump gave no REG / STACK line for {kernel.metadata.name}: {report[-500:]}")
    return int(found.group(1)), int(found.group(2))


def main() -> int:
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        print("gpu_compile_probe: unset TRITON_INTERPRET (the JIT must compile, not interpret)", file=sys.stderr)
        return 2
    from triton.backends.compiler import GPUTarget

    from compress_kernels.common.launch import compiling_for

    fake_hopper()
    with compiling_for(GPUTarget("cuda", 90, 128)) as compiled:
        for dtype in (torch.float16, torch.bfloat16):
            for ops in (dense_ops, block_sparse_ops, moe_ops, norm_quant_ops):
                began, first = time.perf_counter(), len(compiled)
                ops(dtype)
                print(f"{ops.__name__} {dtype}: {len(compiled) - first} launches compiled in "
                      f"{time.perf_counter() - began:.1f} s", file=sys.stderr, flush=True)
    for name, kernel in compiled:
        print(name, kernel.metadata.num_warps, kernel.metadata.shared, *resource_usage(kernel))
    return 0


if __name__ == "__main__":
    sys.exit(main())
