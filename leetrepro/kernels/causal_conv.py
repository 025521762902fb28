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
def _tap(t, seq, rows, by: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr,
         HAS_SEQ: tl.constexpr):
    """:func:`_shifted`, each row's value kept only where row i + by is of row i's sequence
    (``seq``: the tile's rows' sequence numbers, with ``HAS_SEQ``)."""
    shifted = _shifted(t, rows, by, BLOCK_T, BLOCK_C)
    if HAS_SEQ and by != 0:
        src = tl.minimum(tl.maximum(rows + by, 0), BLOCK_T - 1)
        shifted = tl.where((tl.gather(seq, src, axis=0) == seq)[:, None], shifted, 0.0)
    return shifted


@triton.jit
def _sequences(SEQ, b, at, N, BLOCK_T: tl.constexpr, HAS_SEQ: tl.constexpr):
    """The sequence number of each of the tile's rows (int32 ``(batch, N)``; −1 outside)."""
    if HAS_SEQ:
        return tl.load(SEQ + b * N + at, mask=(at >= 0) & (at < N), other=-1)
    else:
        return tl.zeros([BLOCK_T], tl.int32)


@triton.jit
def _tile_pre(x, seq, rows, W, cols, ok_c, bias, K: tl.constexpr, BLOCK_T: tl.constexpr,
              BLOCK_C: tl.constexpr, HAS_SEQ: tl.constexpr):
    """The convolution before its SiLU at each row i ≥ K − 1 of a tile x (rows before the
    sequence or past N loaded as 0; with ``HAS_SEQ``, rows of another sequence left out), from
    x's own rows."""
    acc = tl.zeros([BLOCK_T, BLOCK_C], tl.float32) + bias[None, :]
    for k in tl.static_range(K):
        w = tl.load(W + cols * K + k, mask=ok_c, other=0.0).to(tl.float32)
        acc += _tap(x, seq, rows, k - (K - 1), BLOCK_T, BLOCK_C, HAS_SEQ) * w[None, :]
    return acc


@triton.jit
def causal_conv_forward(X, W, BIAS, SEQ, OUT, SIZE, K: tl.constexpr, BLOCK_T: tl.constexpr,
                        BLOCK_C: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_SEQ: tl.constexpr):
    """OUT ``(batch, N, C)`` contiguous; X ``(pointer, batch stride, row stride)``; W ``(C, K)``
    contiguous; SEQ int32 ``(batch, N)`` with ``HAS_SEQ`` (packed sequences: a row reads only rows
    of its own); ``SIZE = (N, C)``. A program's tile of ``BLOCK_T`` rows starts K − 1 rows before
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
    seq = _sequences(SEQ, b, at, N, BLOCK_T, HAS_SEQ)
    pre = _tile_pre(x, seq, rows, W, cols, ok_c, _bias(BIAS, cols, ok_c, BLOCK_C, HAS_BIAS), K,
                    BLOCK_T, BLOCK_C, HAS_SEQ)
    out = pre / (1.0 + tl.exp(-pre))
    tl.store(OUT + (b * N + at)[:, None] * C + cols[None, :], out.to(OUT.dtype.element_ty),
             mask=ok & (rows >= K - 1)[:, None])


@triton.jit
def causal_conv_backward(X, W, BIAS, SEQ, DOUT, DX, PARTS, SIZE, K: tl.constexpr,
                         K_PAD: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr,
                         HAS_BIAS: tl.constexpr, HAS_SEQ: tl.constexpr):
    """DX ``(batch, N, C)`` contiguous (x's dtype); DOUT ``(pointer, batch stride, row
    stride)``; SEQ as the forward's; ``SIZE = (N, C, STEPS)``. A tile of ``BLOCK_T`` rows starts
    K − 1 rows before the ``BLOCK_T − 2(K − 1)`` whose dx it writes and ends K − 1 rows after
    them (pre from the rows before, dpre at the rows after); grid (batch, row groups of ``STEPS``
    tiles, channel blocks); PARTS float32 ``(K + 1, batch · row groups, C)``: each program's sums
    of dw's K columns and of dbias over its own rows."""
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
        seq = _sequences(SEQ, b, at, N, BLOCK_T, HAS_SEQ)
        pre = _tile_pre(x, seq, rows, W, cols, ok_c, bias, K, BLOCK_T, BLOCK_C, HAS_SEQ)
        sig = 1.0 / (1.0 + tl.exp(-pre))
        # (rows before K − 1 have no pre of their own: never read below)
        dpre = tl.where(ok & (rows >= K - 1)[:, None], dout * sig * (1.0 + pre * (1.0 - sig)),
                        0.0)
        dx = tl.zeros([BLOCK_T, BLOCK_C], tl.float32)
        for j in tl.static_range(K):  # (dpre at row t + j reaches dx[t] through w[K − 1 − j])
            w = tl.load(W + cols * K + (K - 1 - j), mask=ok_c, other=0.0).to(tl.float32)
            dx += _tap(dpre, seq, rows, j, BLOCK_T, BLOCK_C, HAS_SEQ) * w[None, :]
        own = tl.where(mine[:, None], dpre, 0.0)
        for k in tl.static_range(K):
            xk = _tap(x, seq, rows, k - (K - 1), BLOCK_T, BLOCK_C, HAS_SEQ)
            dw += tl.where((kk == k)[:, None], tl.sum(own * xk, axis=0)[None, :], 0.0)
        db += tl.sum(own, axis=0)
        tl.store(DX + (b * N + at)[:, None] * C + cols[None, :], dx.to(DX.dtype.element_ty),
                 mask=ok & mine[:, None])
    part = (b * tl.num_programs(1) + grp) * C + cols
    stride = tl.num_programs(0) * tl.num_programs(1) * C
    tl.store(PARTS + kk[:, None] * stride + part[None, :], dw,
             mask=(kk < K)[:, None] & ok_c[None, :])
    tl.store(PARTS + K * stride + part, db, mask=ok_c)


@triton.jit
def causal_conv_update(X, STATE, W, BIAS, OUT, SIZE, XS, SS, OS, BLOCK_C: tl.constexpr,
                       BLOCK_W: tl.constexpr, HAS_BIAS: tl.constexpr, SILU: tl.constexpr):
    """L new rows of each channel shifted into its window of the last K inputs, in place, and their
    outputs: with ``new = [state, x]`` (K + L values a channel),

        out[t, c] = act(bias[c] + Σ_(k < K) w[c, k] · new[t + 1 + k, c]),   state ← new[L:]

    x ``(batch, C, L)`` and out at strides ``XS`` / ``OS`` (batch, channel, row), the state
    ``(batch, C, K)`` at ``SS``, w ``(C, K)`` contiguous; SIZE = (C, K, L). A program takes
    ``BLOCK_C`` channels of one batch row, all its old window read before any is written."""
    C, K, L = SIZE
    b = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    ok_c = cols < C
    taps = tl.arange(0, BLOCK_W)
    ok = ok_c[:, None] & (taps < K)[None, :]
    s_at = STATE + b * SS[0] + cols[:, None] * SS[1] + taps[None, :] * SS[2]
    state = tl.load(s_at, mask=ok, other=0.0)
    w = tl.load(W + cols[:, None] * K + taps[None, :], mask=ok, other=0.0).to(tl.float32)
    bias = _bias(BIAS, cols, ok_c, BLOCK_C, HAS_BIAS)
    x_at = X + b * XS[0] + cols * XS[1]
    for t in range(L):
        # (tap k reads new[t + 1 + k]: the old window's position t + 1 + k, else x's row
        # t + 1 + k − K)
        at = t + 1 + taps
        old = tl.gather(state, tl.minimum(at, BLOCK_W - 1)[None, :]
                        + tl.zeros([BLOCK_C, BLOCK_W], tl.int32), axis=1)
        new = tl.load(x_at[:, None] + (at - K)[None, :] * XS[2],
                      mask=ok & (at >= K)[None, :], other=0.0)
        win = tl.where((at < K)[None, :], old.to(tl.float32), new.to(tl.float32))
        pre = tl.sum(win * w, axis=1) + bias
        if SILU:
            pre = pre * tl.sigmoid(pre)
        tl.store(OUT + b * OS[0] + cols * OS[1] + t * OS[2], pre.to(OUT.dtype.element_ty),
                 mask=ok_c)
    # (the window's new last K: old positions L + j where L + j < K, else x's row L + j − K)
    at = L + taps
    old = tl.gather(state, tl.minimum(at, BLOCK_W - 1)[None, :]
                    + tl.zeros([BLOCK_C, BLOCK_W], tl.int32), axis=1)
    new = tl.load(x_at[:, None] + (at - K)[None, :] * XS[2], mask=ok & (at >= K)[None, :],
                  other=0.0)
    tl.store(s_at, tl.where((at < K)[None, :], old, new.to(old.dtype)), mask=ok)
