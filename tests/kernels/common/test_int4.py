"""int4 unpacking (compress_kernels/common/int4.py): each helper gives the reference's integers.

A one-program kernel per helper unpacks a packed tile holding every value -8..7 in every nibble
position; under the interpreter the nibble planes take the plain-shift branch (the GPU runs the PTX,
checked by the W4A16 tests there)."""
import torch
import triton
import triton.language as tl

from compress_kernels import reference
from compress_kernels.common.checks import interpreting
from compress_kernels.common.int4 import nibble_planes, tile_partial, unpack_int4_tile
from tests.kernels.helpers import DEVICE, pack_int4

ROWS, COLS = 4, 16  # packed tile: (ROWS, COLS) int32 words, 8 * ROWS channels


@triton.jit
def _unpack_kernel(qw_ptr, out_ptr, ROWS: tl.constexpr, COLS: tl.constexpr):
    r = tl.arange(0, ROWS)[:, None]
    c = tl.arange(0, COLS)[None, :]
    w = unpack_int4_tile(tl.load(qw_ptr + r * COLS + c), 8 * ROWS, COLS, tl.float32)
    k = tl.arange(0, 8 * ROWS)[:, None]
    tl.store(out_ptr + k * COLS + c, w)


@triton.jit
def _planes_kernel(qw_ptr, out_ptr, ROWS: tl.constexpr, COLS: tl.constexpr, ASM: tl.constexpr):
    offs = tl.arange(0, ROWS)[:, None] * COLS + tl.arange(0, COLS)[None, :]
    p0, p1, p2, p3, p4, p5, p6, p7 = nibble_planes(tl.load(qw_ptr + offs), tl.float16, ASM)
    plane = ROWS * COLS
    tl.store(out_ptr + offs, p0)
    tl.store(out_ptr + plane + offs, p1)
    tl.store(out_ptr + 2 * plane + offs, p2)
    tl.store(out_ptr + 3 * plane + offs, p3)
    tl.store(out_ptr + 4 * plane + offs, p4)
    tl.store(out_ptr + 5 * plane + offs, p5)
    tl.store(out_ptr + 6 * plane + offs, p6)
    tl.store(out_ptr + 7 * plane + offs, p7)


@triton.jit
def _partial_kernel(qw_ptr, x_ptr, out_ptr, ROWS: tl.constexpr, COLS: tl.constexpr):
    r = tl.arange(0, ROWS)[:, None]
    xt = tl.load(x_ptr + r * 8 + tl.arange(0, 8)[None, :])  # (ROWS, 8): channel 8r + j
    part = tile_partial(tl.load(qw_ptr + r * COLS + tl.arange(0, COLS)[None, :]), xt, 8 * ROWS)
    tl.store(out_ptr + tl.arange(0, COLS), tl.sum(part, axis=0))


def _every_value():
    """q (8 ROWS, COLS) int8 with each of -8..7 in every nibble position, and its packed words."""
    q = ((torch.arange(8 * ROWS)[:, None] + torch.arange(COLS)[None, :]) % 16 - 8).to(torch.int8)
    return q, pack_int4(q).to(DEVICE)


def test_unpack_tile_gives_the_reference_integers():
    q, packed = _every_value()
    out = torch.empty(8 * ROWS, COLS, device=DEVICE)
    _unpack_kernel[(1,)](packed, out, ROWS, COLS)
    assert torch.equal(out.cpu(), reference.unpack_int4(packed.cpu()).float())


def test_nibble_planes_are_the_nibbles_of_every_word():
    q, packed = _every_value()
    out = torch.empty(8, ROWS, COLS, device=DEVICE, dtype=torch.float16)
    _planes_kernel[(1,)](packed, out, ROWS, COLS, not interpreting())
    planes = q.reshape(ROWS, 8, COLS).permute(1, 0, 2)  # plane j, row r = channel 8r + j
    assert torch.equal(out.cpu(), planes.half())


def test_tile_partial_is_the_exact_dot_of_x_with_the_nibbles():
    q, packed = _every_value()
    x = torch.randn(8 * ROWS, device=DEVICE).half().float()  # fp16 values: the products are exact in fp32
    out = torch.empty(COLS, device=DEVICE)
    _partial_kernel[(1,)](packed, x, out, ROWS, COLS)
    expected = (x.double().cpu()[:, None] * q.double()).sum(0)
    torch.testing.assert_close(out.double().cpu(), expected, rtol=1e-6, atol=1e-5)
