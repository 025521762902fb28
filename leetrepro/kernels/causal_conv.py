"""The Mamba-2 block's short causal depthwise convolution with its SiLU, on time-major rows, in
one pass, and its backward in one (``leetrepro.models._conv``):

    out[t, c] = silu(bias[c] + Σ_(k < K) w[c, k] · x[t − (K − 1) + k, c])    (x = 0 before t = 0)

per sequence of a batch, x ``(batch, N, C)`` at any row stride (its channels contiguous: a slice
of the in-projection read in place), out ``(batch, N, C)`` contiguous. The backward, with
pre = the convolution before its SiLU (taken again from x, not saved):

    dpre[t] = dout[t] · silu'(pre[t]),  dx[t] = Σ_k w[k] · dpre[t + K − 1 − k],
    dw[c, k] = Σ_t dpre[t] · x[t − (K − 1) + k],  dbias[c] = Σ_t dpre[t]

the last two summed per program (``STEPS`` tiles of rows × ``BLOCK_C`` channels) into float32
parts, then over programs by the caller in a fixed order. Products and sums in float32.

Each x and dout row is read once: a program loads a tile of rows with its K − 1 neighbours and
shifts it in registers (``tl.gather`` along the rows) for each tap, where reading each tap's
rows from memory (four loads of x a tap, sixteen for the backward's pre) left the backward
latency-bound at 21× its memory floor (H200, notes/gates.md).
"""
import triton
import triton.language as tl


@triton.jit
def _bias(BIAS, cols, ok_c, BLOCK_C: tl.constexpr, HAS_BIAS: tl.constexpr):
    if HAS_BIAS:
        return tl.load(BIAS + cols, mask=ok_c, other=0.0).to(tl.float32)
    else:
        return tl.zeros([BLOCK_C], tl.float32)


@triton.jit
def _shifted(t, rows, by: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr):
    """t's row i + by at row i (clamped to the tile: the rows it clamps are never used)."""
    if by == 0:
        return t
    src = tl.minimum(tl.maximum(rows + by, 0), BLOCK_T - 1)
    return tl.gather(t, src[:, None] + tl.zeros([BLOCK_T, BLOCK_C], tl.int32), axis=0)


@triton.jit
def _tile_pre(x, rows, W, cols, ok_c, bias, K: tl.constexpr, BLOCK_T: tl.constexpr,
              BLOCK_C: tl.constexpr):
    """The convolution before its SiLU at each row i ≥ K − 1 of a tile x (rows of one sequence,
    those before it or past N loaded as 0), from x's own rows."""
    acc = tl.zeros([BLOCK_T, BLOCK_C], tl.float32) + bias[None, :]
    for k in tl.static_range(K):
        w = tl.load(W + cols * K + k, mask=ok_c, other=0.0).to(tl.float32)
        acc += _shifted(x, rows, k - (K - 1), BLOCK_T, BLOCK_C) * w[None, :]
    return acc


@triton.jit
def causal_conv_forward(X, W, BIAS, OUT, SIZE, K: tl.constexpr, BLOCK_T: tl.constexpr,
                        BLOCK_C: tl.constexpr, HAS_BIAS: tl.constexpr):
    """OUT ``(batch, N, C)`` contiguous; X ``(pointer, batch stride, row stride)``; W ``(C, K)``
    contiguous; ``SIZE = (N, C)``. A program's tile of ``BLOCK_T`` rows starts K − 1 rows before
    the ``BLOCK_T − K + 1`` it writes; grid (batch, tiles, channel blocks)."""
    N, C = SIZE
    x_ptr, x_sb, x_st = X
    b = tl.program_id(0).to(tl.int64)
    rows = tl.arange(0, BLOCK_T)
    at = tl.program_id(1).to(tl.int64) * (BLOCK_T - K + 1) - (K - 1) + rows
    cols = tl.program_id(2) * BLOCK_C + tl.arange(0, BLOCK_C)
    ok_c = cols < C
    ok = ((at >= 0) & (at < N))[:, None] & ok_c[None, :]
    x = tl.load(x_ptr + b * x_sb + at[:, None] * x_st + cols[None, :], mask=ok,
                other=0.0).to(tl.float32)
    pre = _tile_pre(x, rows, W, cols, ok_c, _bias(BIAS, cols, ok_c, BLOCK_C, HAS_BIAS), K,
                      BLOCK_T, BLOCK_C)
    out = pre / (1.0 + tl.exp(-pre))
    tl.store(OUT + (b * N + at)[:, None] * C + cols[None, :], out.to(OUT.dtype.element_ty),
             mask=ok & (rows >= K - 1)[:, None])


@triton.jit
def causal_conv_backward(X, W, BIAS, DOUT, DX, PARTS, SIZE, K: tl.constexpr,
                         K_PAD: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr,
                         HAS_BIAS: tl.constexpr):
    """DX ``(batch, N, C)`` contiguous (x's dtype); DOUT ``(pointer, batch stride, row
    stride)``; ``SIZE = (N, C, STEPS)``. A tile of ``BLOCK_T`` rows starts K − 1 rows before
    the ``BLOCK_T − 2(K − 1)`` whose dx it writes and ends K − 1 rows after them (pre from the
    rows before, dpre at the rows after); grid (batch, row groups of ``STEPS`` tiles, channel
    blocks); PARTS float32 ``(K + 1, batch · row groups, C)``: each program's sums of dw's K
    columns and of dbias over its own rows."""
    N, C, STEPS = SIZE
    OWN: tl.constexpr = BLOCK_T - 2 * (K - 1)
    b = tl.program_id(0).to(tl.int64)
    grp = tl.program_id(1).to(tl.int64)
    cols = tl.program_id(2) * BLOCK_C + tl.arange(0, BLOCK_C)
    ok_c = cols < C
    bias = _bias(BIAS, cols, ok_c, BLOCK_C, HAS_BIAS)
    d_ptr, d_sb, d_st = DOUT
    x_ptr, x_sb, x_st = X
    rows = tl.arange(0, BLOCK_T)
    mine = (rows >= K - 1) & (rows < K - 1 + OWN)
    kk = tl.arange(0, K_PAD)
    dw = tl.zeros([K_PAD, BLOCK_C], tl.float32)
    db = tl.zeros([BLOCK_C], tl.float32)
    for step in range(STEPS):
        at = (grp * STEPS + step) * OWN - (K - 1) + rows
        ok = ((at >= 0) & (at < N))[:, None] & ok_c[None, :]
        x = tl.load(x_ptr + b * x_sb + at[:, None] * x_st + cols[None, :], mask=ok,
                    other=0.0).to(tl.float32)
        dout = tl.load(d_ptr + b * d_sb + at[:, None] * d_st + cols[None, :], mask=ok,
                       other=0.0).to(tl.float32)
        pre = _tile_pre(x, rows, W, cols, ok_c, bias, K, BLOCK_T, BLOCK_C)
        sig = 1.0 / (1.0 + tl.exp(-pre))
        # (rows before K − 1 have no pre of their own: never read below)
        dpre = tl.where(ok & (rows >= K - 1)[:, None], dout * sig * (1.0 + pre * (1.0 - sig)),
                        0.0)
        dx = tl.zeros([BLOCK_T, BLOCK_C], tl.float32)
        for j in tl.static_range(K):  # (dpre at row t + j reaches dx[t] through w[K − 1 − j])
            w = tl.load(W + cols * K + (K - 1 - j), mask=ok_c, other=0.0).to(tl.float32)
            dx += _shifted(dpre, rows, j, BLOCK_T, BLOCK_C) * w[None, :]
        own = tl.where(mine[:, None], dpre, 0.0)
        for k in tl.static_range(K):
            xk = _shifted(x, rows, k - (K - 1), BLOCK_T, BLOCK_C)
            dw += tl.where((kk == k)[:, None], tl.sum(own * xk, axis=0)[None, :], 0.0)
        db += tl.sum(own, axis=0)
        tl.store(DX + (b * N + at)[:, None] * C + cols[None, :], dx.to(DX.dtype.element_ty),
                 mask=ok & mine[:, None])
    part = (b * tl.num_programs(1) + grp) * C + cols
    stride = tl.num_programs(0) * tl.num_programs(1) * C
    tl.store(PARTS + kk[:, None] * stride + part[None, :], dw,
             mask=(kk < K)[:, None] & ok_c[None, :])
    tl.store(PARTS + K * stride + part, db, mask=ok_c)
