"""Shared test helpers for the kernel tests: random quantized and block-sparse operands, the error metric.

``pack_int4`` is written here independently of ``compress`` (``compress_kernels`` must not depend on
it): it packs q (K, N) in [-8, 7] as ``qweight[k // 8, n] |= (q[k, n] & 0xF) << (4 * (k % 8))``.
"""
from __future__ import annotations

import torch

BSR_BLOCK = 32
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # CPU: the Triton interpreter (tests/conftest.py)
DTYPES = (torch.float16, torch.bfloat16)
# ||y - ref|| / ||ref|| of W4A16 against the reference, which dequantizes to fp32: the paths that
# dequantize before the tensor-core product round the weight to x's dtype (fp16: 2^-11, bf16: 2^-8 per
# weight) and the output is cast to x's dtype (Triton's interpreter truncates fp32 -> bf16)
W4A16_TOL = {torch.float16: 2e-3, torch.bfloat16: 1e-2}
# ... and of W8A8, whose paths compute the reference's integers exactly: only the fp32 rounding order of
# the epilogue and the output cast differ (the interpreter truncates to bf16: one bf16 ulp = 2^-8)
W8A8_TOL = {torch.float16: 1e-3, torch.bfloat16: 1e-2}
# ... and of block-scaled W8A8: the reference's integers and, unsplit, its fp32 sums in its order (bit for bit in
# the interpreter on fp16); split-K sums in another order, the GPU contracts multiply-adds, and the interpreter
# truncates fp32 -> bf16 (one bf16 ulp = 2^-8)
W8A8_BLOCK_TOL = {torch.float16: 1e-3, torch.bfloat16: 1e-2}
BLOCK_EXACT = DEVICE == "cpu"  # the interpreter adds the rescaled K blocks as the reference does (no FMA contraction)
# ... and of W8A16: exact integer operands and fp32 accumulation, except where grouped scales dequantize the
# weight tile to x's dtype before the tensor-core product (as W4A16's paths do), and the output cast
W8A16_TOL = {torch.float16: 2e-3, torch.bfloat16: 1e-2}


def rel_error(y: torch.Tensor, ref: torch.Tensor) -> float:
    """||y - ref|| / ||ref|| in float64 (0 when both are zero); NaN in y gives NaN, which fails any bound."""
    diff = (y.double() - ref.double()).norm()
    denom = ref.double().norm()
    return float(diff / denom) if denom > 0 else float(diff)


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """q (K, N) integers in [-8, 7] -> qweight (K/8, N) int32."""
    k, n = q.shape
    q32 = q.to(torch.int32).reshape(k // 8, 8, n)
    packed = torch.zeros((k // 8, n), dtype=torch.int32, device=q.device)
    for j in range(8):
        packed |= (q32[:, j, :] & 0xF) << (4 * j)
    return packed


def random_int4_weight(k: int, n: int, group_size: int, scale_dtype=torch.float32, device="cpu"):
    """Random (qweight (K/8, N) int32, q (K, N) int8, scales (K/G, N)) with positive scales."""
    q = torch.randint(-8, 8, (k, n), dtype=torch.int8, device=device)
    scales = (torch.rand(k // group_size, n, device=device) * 0.02 + 0.001).to(scale_dtype)
    return pack_int4(q), q, scales


def random_int8_weight(n: int, k: int, device="cpu"):
    """Random (w_q (N, K) int8, w_scale (N,) fp32)."""
    w_q = torch.randint(-127, 128, (n, k), dtype=torch.int8, device=device)
    w_scale = torch.rand(n, device=device) * 0.01 + 0.001
    return w_q, w_scale


def random_block_weight(n: int, k: int, device="cpu", seed: int = 0):
    """Random block-scaled int8 weight: (w_q (N, K) int8 in [-127, 127], w_scale (ceil(N/128), ceil(K/128)) fp32)."""
    gen = torch.Generator().manual_seed(seed)
    w_q = torch.randint(-127, 128, (n, k), generator=gen, dtype=torch.int8)
    w_scale = torch.rand(-(-n // 128), -(-k // 128), generator=gen) * 1e-2 + 1e-3
    return w_q.to(device), w_scale.to(device)


def random_w8a16_weight(n: int, k: int, grouped: bool, scale_dtype=torch.float32, device="cpu"):
    """Random (w_q (N, K) int8 over the whole int8 range, w_scale (N,) or, ``grouped``, (N, K/128))."""
    w_q = torch.randint(-128, 128, (n, k), dtype=torch.int8, device=device)
    shape = (n, k // 128) if grouped else (n,)
    return w_q, (torch.rand(shape, device=device) * 0.01 + 0.001).to(scale_dtype)


def check_w8a16_config(dtype, m, k, n, grouped, cfg, tol, device=DEVICE):
    """W8A16 ``launch`` with ``cfg`` on random inputs (a bias for odd M) against the reference; returns y."""
    from compress_kernels import reference
    from compress_kernels.w8a16.op import launch

    x = torch.randn(m, k, device=device).to(dtype)
    w_q, w_scale = random_w8a16_weight(n, k, grouped, device=device)
    bias = torch.randn(n, device=device).to(dtype) if m % 2 else None
    y = launch(x, w_q, w_scale, bias, config=cfg)
    assert y.shape == (m, n) and y.dtype == dtype
    assert rel_error(y, reference.w8a16_matmul_ref(x, w_q, w_scale, bias)) <= tol
    return y


def block_sparse_dense(n, k, sparsity, dtype, device=DEVICE, empty_rows=(), seed=0):
    """Dense (n, k) weight with round(sparsity * blocks) absent 32x32 blocks (and whole empty block rows)."""
    gen = torch.Generator().manual_seed(seed)
    rows, cols = n // BSR_BLOCK, k // BSR_BLOCK
    keep = torch.ones(rows * cols)
    keep[torch.randperm(rows * cols, generator=gen)[: round(sparsity * rows * cols)]] = 0
    keep = keep.reshape(rows, cols)
    for r in empty_rows:
        keep[r] = 0
    mask = keep.repeat_interleave(BSR_BLOCK, 0).repeat_interleave(BSR_BLOCK, 1)
    w = torch.randn(n, k, generator=gen) * mask / k**0.5
    return w.to(device=device, dtype=dtype)


def bsr_parts(w_dense, index_dtype=torch.int64):
    """BSR parts as the inference module keeps them: plain dense tensors (clones).

    Tensors returned straight by ``.values()`` of a sparse tensor trip Dynamo's automatic-dynamic
    bookkeeping (IndexError in torch/_dynamo/pgo.py, torch 2.13), so the module stores copies.
    """
    bsr = w_dense.to_sparse_bsr((BSR_BLOCK, BSR_BLOCK))
    return (bsr.crow_indices().to(index_dtype).clone(), bsr.col_indices().to(index_dtype).clone(),
            bsr.values().clone())


def check_w4a16_config(dtype, m, k, n, g, cfg, tol, device=DEVICE):
    """W4A16 ``launch`` with ``cfg`` on random inputs (a bias for odd M) against the reference; returns y."""
    from compress_kernels import reference
    from compress_kernels.w4a16.op import launch

    x = torch.randn(m, k, device=device).to(dtype)
    qweight, _, scales = random_int4_weight(k, n, g, device=device)
    bias = torch.randn(n, device=device).to(dtype) if m % 2 else None
    y = launch(x, qweight, scales, g, bias, config=cfg)
    assert y.shape == (m, n) and y.dtype == dtype
    assert rel_error(y, reference.w4a16_matmul_ref(x, qweight, scales, g, bias)) <= tol
    return y


def int8_block_sparse(n, k, sparsity, device=DEVICE, empty_rows=(), seed=0):
    """(BSR parts with int8 values, w_scale (n,), the dense int8 weight with its absent blocks zero)."""
    gen = torch.Generator().manual_seed(seed)
    rows, cols = n // BSR_BLOCK, k // BSR_BLOCK
    keep = torch.ones(rows * cols, dtype=torch.bool)
    keep[torch.randperm(rows * cols, generator=gen)[: round(sparsity * rows * cols)]] = False
    keep = keep.reshape(rows, cols)
    for r in empty_rows:
        keep[r] = False
    w_q = torch.randint(-127, 128, (n, k), generator=gen, dtype=torch.int8)
    w_q *= keep.repeat_interleave(BSR_BLOCK, 0).repeat_interleave(BSR_BLOCK, 1).to(torch.int8)
    blocks = w_q.reshape(rows, BSR_BLOCK, cols, BSR_BLOCK).permute(0, 2, 1, 3)  # (R, C, 32, 32)
    crow = torch.zeros(rows + 1, dtype=torch.int32)
    crow[1:] = keep.sum(1).cumsum(0)
    r_idx, c_idx = keep.nonzero(as_tuple=True)
    values = blocks[r_idx, c_idx].contiguous()
    w_scale = torch.rand(n, generator=gen) * 1e-2 + 1e-3
    parts = (crow.to(device), c_idx.to(torch.int32).to(device), values.to(device))
    return parts, w_scale.to(device), w_q.to(device)


def int4_block_sparse(n, k, sparsity, group_size=32, device=DEVICE, empty_rows=(), full_rows=(), seed=0,
                      scale_dtype=torch.float32, tile_rows=1):
    """Random 32x32-block-sparse int4 weight with group scales, as ``bsr_w4a16_matmul`` takes it, and its
    dense W4A16 form: ``(parts (crow, col, values (nnz, 32, 4) int32), block scales (nnz, 32), qweight (K/8, N)
    int32 with the absent blocks zero, scales (K/G, N))``. ``group_size`` None: one group per row (G = K).
    Block rows ``empty_rows`` keep no block, ``full_rows`` every block; ``tile_rows``: blocks absent in tiles
    of that many block rows. Packed here independently of the package: word r of row i of a block holds its
    channels 8r + j in nibble j."""
    gen = torch.Generator().manual_seed(seed)
    g = k if group_size is None else group_size
    rows, cols = n // BSR_BLOCK, k // BSR_BLOCK
    tiles = -(-rows // tile_rows)
    keep = torch.ones(tiles * cols, dtype=torch.bool)
    keep[torch.randperm(tiles * cols, generator=gen)[: round(sparsity * tiles * cols)]] = False
    keep = keep.reshape(tiles, cols).repeat_interleave(tile_rows, dim=0)[:rows]
    keep[list(empty_rows)] = False
    keep[list(full_rows)] = True
    q = torch.randint(-8, 8, (n, k), generator=gen, dtype=torch.int8)
    q *= keep.repeat_interleave(BSR_BLOCK, 0).repeat_interleave(BSR_BLOCK, 1).to(torch.int8)
    scales = (torch.rand(k // g, n, generator=gen) * 0.02 + 0.001).to(scale_dtype)  # (K/G, N)
    r_idx, c_idx = keep.nonzero(as_tuple=True)
    blocks = q.reshape(rows, BSR_BLOCK, cols, BSR_BLOCK).permute(0, 2, 1, 3)[r_idx, c_idx]  # (nnz, 32, 32)
    nibbles = (blocks.to(torch.int32) & 0xF).reshape(-1, BSR_BLOCK, BSR_BLOCK // 8, 8)
    values = torch.zeros(nibbles.shape[:-1], dtype=torch.int32)
    for j in range(8):
        values |= nibbles[..., j] << (4 * j)
    row_of = r_idx[:, None] * BSR_BLOCK + torch.arange(BSR_BLOCK)  # (nnz, 32): the output row of each block row
    block_scales = scales.T[row_of, (c_idx * BSR_BLOCK // g)[:, None]].contiguous()
    crow = torch.zeros(rows + 1, dtype=torch.int32)
    crow[1:] = keep.sum(1).cumsum(0)
    parts = (crow.to(device), c_idx.to(torch.int32).to(device), values.to(device))
    return parts, block_scales.to(device), pack_int4(q.T.contiguous()).to(device), scales.to(device)


def check_int4_block_row_shares(config, n, k, m, full_row, seed, device=DEVICE):
    """``bsr_w4a16``'s op with ``config`` (block rows shared by ``config.split`` programs) on an int4 weight whose
    block row 2 is empty and ``full_row`` full: the reference's result up to fp32 rounding, the bias added once
    (the empty row gives the bias alone), the same bits again (the ticket counters are left zeroed)."""
    from compress_kernels import reference
    from compress_kernels.bsr_w4a16.op import launch

    parts, scales, _, _ = int4_block_sparse(n, k, 0.3, 128, device, empty_rows=(2,), full_rows=(full_row,), seed=seed)
    x = torch.randn(m, k, device=device).half()
    bias = torch.randn(n, device=device).half()
    y = launch(x, *parts, scales, n, bias, config=config)
    assert rel_error(y, reference.bsr_w4a16_matmul_ref(x, *parts, scales, n, bias)) <= 1e-3
    assert torch.equal(y[:, 64:96], bias[64:96].expand(m, 32))
    assert torch.equal(launch(x, *parts, scales, n, bias, config=config), y)


def random_moe_weights(scheme: str, experts: int, hidden: int, inter: int, group_size=None, device="cpu", seed=0):
    """Random stacked expert weights of ``scheme`` ("w4a16", "w8a8", "w8a16") as the grouped MoE ops take them:
    (gate_up, gate_up scales, down, down scales) for a (2I, H) gate/up and (H, I) down weight per expert.
    ``group_size``: W4A16 G (None: per channel) or W8A16 128 (None: per channel); K is padded with zero
    weights as the inference modules pad it (W4A16: to a multiple of 8 and G; W8A16: of 8, or 128). Scales make
    each weight's standard deviation about 1/sqrt(K) (int4 codes have std 4.6, int8 codes 73), so activations
    stay O(1) through both projections and fp16 does not overflow at Mixtral's widths."""
    gen = torch.Generator().manual_seed(seed)

    def padded(k, multiple):
        return -(-k // multiple) * multiple

    def one(n, k):
        if scheme == "w4a16":
            kp = padded(k, 8 if group_size is None else group_size)
            q = torch.randint(-8, 8, (experts, kp, n), generator=gen, dtype=torch.int8)
            q[:, k:] = 0  # the padded input channels hold zero weights
            qweight = torch.stack([pack_int4(q[e]) for e in range(experts)])
            scales = (torch.rand(experts, kp // (group_size or kp), n, generator=gen) + 0.5) / (4.6 * k ** 0.5)
            return qweight.to(device), scales.to(device)
        kp = k if scheme == "w8a8" else padded(k, 8 if group_size is None else group_size)
        w_q = torch.randint(-127, 128, (experts, n, kp), generator=gen, dtype=torch.int8)
        w_q[:, :, k:] = 0
        shape = (experts, n) if group_size is None else (experts, n, kp // group_size)
        return w_q.to(device), ((torch.rand(shape, generator=gen) + 0.5) / (73.0 * k ** 0.5)).to(device)

    return (*one(2 * inter, hidden), *one(hidden, inter))


def random_routing(tokens: int, experts: int, top_k: int, device="cpu", seed=0):
    """(topk_ids (T, k) int64 of distinct experts per token, topk_weights (T, k) fp32 summing to 1 per token)."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.zeros(tokens, top_k, dtype=torch.int64)
    for t in range(tokens):
        ids[t] = torch.randperm(experts, generator=gen)[:top_k]
    weights = torch.rand(tokens, top_k, generator=gen) + 0.1
    return ids.to(device), (weights / weights.sum(-1, keepdim=True)).to(device)
