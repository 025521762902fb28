"""Mamba-2's per-row passes around the operator, one pass each (``leetrepro.methods.ssd_rows``).

Rows are the (batch, seqlen, heads) rows of ``headdim`` values of mamba_ssm's layout; every
tensor comes as ``(pointer, batch stride, seqlen stride, head stride)`` (elements, the last
dimension contiguous), so the slices of a fused projection are read in place. One program takes
``BLOCK_T`` rows:

    OUT = A + Y·w + Y2·w2  (Y = X without ``HAS_Y``; A = 0 without ``HAS_A``; the last term
                            only with ``HAS_Y2``)
    DW  = Σ_d X·Y          (with ``HAS_DW``, float32)
    DW2 = Σ_d X·Y2         (with ``HAS_Y2`` and ``HAS_DW2``, float32)

with w, w2 float32 per row (dt; or D, a head's, its row strides 0) rounded to OUT's dtype first,
as PyTorch's product of x with ``w.to(x.dtype)`` has it; products and sums in float32. OUT is
contiguous ``(batch, seqlen, heads, headdim)``. Forward ``V' = dt·x`` and ``y = o + D·x``;
backward ``dx = dt·dV' + D·dy`` with ``ddt = Σ x·dV'`` and ``dD``'s rows Σ x·dy, one pass.
"""
import triton
import triton.language as tl


@triton.jit
def _offsets(T, rows, SIZE):
    """Each row's offset in a tensor ``T = (pointer, batch, seqlen, head strides)``."""
    ROWS, N, H, D = SIZE
    ptr, s_b, s_t, s_h = T
    return ptr + (rows // (N * H)) * s_b + ((rows // H) % N) * s_t + (rows % H) * s_h


@triton.jit
def axpy_rows(X, Y, A, W, OUT, DW, SECOND, SIZE, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr,
              HAS_Y: tl.constexpr, HAS_A: tl.constexpr, HAS_DW: tl.constexpr,
              HAS_Y2: tl.constexpr, HAS_DW2: tl.constexpr):
    """The module docstring's pass over rows ``BLOCK_T·pid …``; ``SIZE = (rows, seqlen, heads,
    headdim)``; ``SECOND = (Y2, W2, DW2)``, read with ``HAS_Y2``."""
    ROWS, N, H, D = SIZE
    rows = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    ok = rows < ROWS
    cols = tl.arange(0, BLOCK_D)
    mask = ok[:, None] & (cols < D)[None, :]
    x = tl.load(_offsets(X, rows, SIZE)[:, None] + cols[None, :], mask=mask, other=0.0)
    w = tl.load(_offsets(W, rows, SIZE), mask=ok, other=0.0)
    w = w.to(OUT.dtype.element_ty).to(tl.float32)
    if HAS_Y:
        y = tl.load(_offsets(Y, rows, SIZE)[:, None] + cols[None, :], mask=mask,
                    other=0.0).to(tl.float32)
    else:
        y = x.to(tl.float32)
    out = y * w[:, None]
    if HAS_A:
        out += tl.load(_offsets(A, rows, SIZE)[:, None] + cols[None, :], mask=mask,
                       other=0.0).to(tl.float32)
    if HAS_Y2:
        Y2, W2, DW2 = SECOND
        y2 = tl.load(_offsets(Y2, rows, SIZE)[:, None] + cols[None, :], mask=mask,
                     other=0.0).to(tl.float32)
        w2 = tl.load(_offsets(W2, rows, SIZE), mask=ok, other=0.0)
        out += y2 * w2.to(OUT.dtype.element_ty).to(tl.float32)[:, None]
        if HAS_DW2:
            tl.store(DW2 + rows, tl.sum(x.to(tl.float32) * y2, axis=1), mask=ok)
    tl.store(OUT + rows[:, None] * D + cols[None, :], out.to(OUT.dtype.element_ty), mask=mask)
    if HAS_DW:
        tl.store(DW + rows, tl.sum(x.to(tl.float32) * y, axis=1), mask=ok)
