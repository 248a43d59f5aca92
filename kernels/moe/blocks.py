"""In-kernel pieces the grouped MoE GEMMs share: a block's rows, the SwiGLU epilogue, the two stores.

Every grouped GEMM program owns one block of BLOCK_M slots of the routing's ``sorted_pairs`` (one
expert's, :mod:`compress_kernels.moe.routing`), one tile of output columns and, for the down projection,
one K split. The two projections differ only in where their rows come from and where they go:

* gate/up (``GATED``): row i of the block reads x at the token of its pair, ``sorted_pairs[i] // k``, and
  the epilogue writes ``act = SwiGLU(gate, up)`` at slot i of the activation buffer (P_pad, I), so the
  down projection reads its rows in block order with no gather;
* down: row i reads the activation at slot i and the epilogue writes the fp32 partial sum at the pair's
  own row of the partials (SPLIT_K, P, H), which the top-k combine kernel reads.

Padding slots (the sentinel pair P) read row 0 (any row would do) and are never stored (down), or are
stored into their own slot of the activation buffer, which nothing reads as a pair (gate/up).

SwiGLU (``transformers``' ``act_fn(gate) * up`` with SiLU, as its float layer rounds it)::

    g = rd(acc_gate)     u = rd(acc_up)     act = rd(rd(silu(g)) * u)     silu(g) = g / (1 + exp(-g))

in fp32, ``rd`` the rounding to the activation dtype: the gate/up layer's output, SiLU's and the
product's, each rounded once, as the float model's fp16 / bf16 ops give them.
"""
import triton
import triton.language as tl


@triton.jit
def block_rows(pairs_ptr, block, num_pairs, GATED: tl.constexpr, TOP_K: tl.constexpr, BLOCK_M: tl.constexpr):
    """(slots, pairs, valid, rows) of block ``block``: its BLOCK_M slots of the sorted pairs, the pair in
    each (``num_pairs`` for padding), which hold a pair, and the input row each reads (module docstring)."""
    return slot_rows(pairs_ptr, block * BLOCK_M, num_pairs, GATED, TOP_K, BLOCK_M)


@triton.jit
def slot_rows(pairs_ptr, first_slot, num_pairs, GATED: tl.constexpr, TOP_K: tl.constexpr, ROWS: tl.constexpr):
    """:func:`block_rows` of the ROWS slots from ``first_slot`` on."""
    slots = first_slot + tl.arange(0, ROWS)
    pairs = tl.load(pairs_ptr + slots)
    valid = pairs < num_pairs
    if GATED:
        rows = tl.where(valid, pairs // TOP_K, 0).to(tl.int64)
    else:
        rows = slots.to(tl.int64)
    return slots, pairs, valid, rows


@triton.jit
def holds_few_pairs(pairs_ptr, first_slot, num_pairs, SHORT_ROWS: tl.constexpr):
    """Whether the block from ``first_slot`` holds at most SHORT_ROWS pairs: an expert's pairs fill the first
    slots of its last block and the padding the rest, so it does when slot SHORT_ROWS is padding."""
    return tl.load(pairs_ptr + first_slot + SHORT_ROWS) >= num_pairs


@triton.jit
def swiglu(acc_gate, acc_up, DTYPE: tl.constexpr):
    """``rd(rd(silu(rd(gate))) * rd(up))`` of the fp32 sums, in DTYPE (module docstring)."""
    g = acc_gate.to(DTYPE).to(tl.float32)
    u = acc_up.to(DTYPE).to(tl.float32)
    act = (g / (1.0 + tl.exp(-g))).to(DTYPE).to(tl.float32)
    return (act * u).to(DTYPE)


@triton.jit
def store_activation(act, out_ptr, slots, offs_n, N, stride_om):
    """The (BLOCK_M, BLOCK_N) activation tile at its slots of the activation buffer (P_pad, N)."""
    tl.store(out_ptr + slots[:, None].to(tl.int64) * stride_om + offs_n[None, :], act, mask=(offs_n < N)[None, :])


@triton.jit
def store_partial(acc, out_ptr, pairs, valid, offs_n, N, pid_k, stride_os, stride_om):
    """The fp32 (BLOCK_M, BLOCK_N) partial of split ``pid_k`` at its pairs' rows of the partials (SPLIT_K, P, N)."""
    ptrs = out_ptr + pid_k.to(tl.int64) * stride_os + pairs[:, None].to(tl.int64) * stride_om + offs_n[None, :]
    tl.store(ptrs, acc, mask=valid[:, None] & (offs_n < N)[None, :])
