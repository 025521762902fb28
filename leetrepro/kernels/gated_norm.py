"""The gated RMS norm of a Mamba-2 block's output, ``out = (y·silu(z)) · rstd · w`` with ``rstd =
1/√(mean((y·silu(z))²) + eps)`` over each group of ``GS`` channels of a row (mamba_ssm's
``group_size``: d_inner / ngroups; one group is the whole row), in one pass, and its backward in
one (``leetrepro.models._norm``).

Rows are the ``(batch·seqlen)`` rows of ``D = G·GS`` channels; y, z and the gradient of out come
as ``(pointer, row stride)`` (the last dimension contiguous: z is a slice of the in-projection,
read in place). Grid (row blocks, groups): a program takes one group of ``ROWS`` rows one after
another, the group's channels at once (``BLOCK_G`` ≥ GS). Products and sums in float32; out, dy
and dz in their tensors' dtypes.
"""
import triton
import triton.language as tl


@triton.jit
def _gated(Y, Z, row, base, cols, ok):
    """(y, z, silu(z), σ(z)) of a row's group, float32 (``base``: the group's first channel,
    folded into the row's pointer: an offset in every column's address spilled a row of 8192 on
    sm_90)."""
    y_ptr, y_sr = Y
    z_ptr, z_sr = Z
    y = tl.load(y_ptr + base + row * y_sr + cols, mask=ok, other=0.0).to(tl.float32)
    z = tl.load(z_ptr + base + row * z_sr + cols, mask=ok, other=0.0).to(tl.float32)
    sig = 1.0 / (1.0 + tl.exp(-z))
    return y, z, z * sig, sig


@triton.jit
def gated_norm_forward(Y, Z, W, OUT, RSTD, SIZE, eps, BLOCK_G: tl.constexpr,
                       ROWS: tl.constexpr):
    """OUT (rows, D) contiguous in its dtype and RSTD float32 (rows, G); ``SIZE = (rows, G,
    GS)``."""
    R, G, GS = SIZE
    D = G * GS
    grp = tl.program_id(1)
    base = grp * GS
    cols = tl.arange(0, BLOCK_G)
    ok = cols < GS
    w = tl.load(W + base + cols, mask=ok, other=0.0).to(tl.float32)
    first = tl.program_id(0).to(tl.int64) * ROWS
    for i in range(ROWS):
        row = first + i
        if row < R:
            y, z, s, sig = _gated(Y, Z, row, base, cols, ok)
            g = y * s
            rstd = 1.0 / tl.sqrt(tl.sum(g * g, axis=0) / GS + eps)
            tl.store(OUT + base + row * D + cols, (g * rstd * w).to(OUT.dtype.element_ty),
                     mask=ok)
            tl.store(RSTD + row * G + grp, rstd)


@triton.jit
def gated_norm_backward(DOUT, Y, Z, W, RSTD, DY, DZ, DW, SIZE, BLOCK_G: tl.constexpr,
                        ROWS: tl.constexpr):
    """DY, DZ (rows, D) contiguous in their dtypes; DW float32 (row blocks, D): each program's
    sum of dout·n over its rows (n = y·silu(z)·rstd), in its group's columns; DOUT as
    ``(pointer, row stride)``."""
    R, G, GS = SIZE
    D = G * GS
    grp = tl.program_id(1)
    base = grp * GS
    cols = tl.arange(0, BLOCK_G)
    ok = cols < GS
    d_ptr, d_sr = DOUT
    dw = tl.zeros([BLOCK_G], tl.float32)
    first = tl.program_id(0).to(tl.int64) * ROWS
    for i in range(ROWS):
        row = first + i
        if row < R:
            y, z, s, sig = _gated(Y, Z, row, base, cols, ok)
            rstd = tl.load(RSTD + row * G + grp)
            # (z's factor of dz taken now: y, z and σ(z) are not held across the group's sum)
            q = y * sig * (1.0 + z * (1.0 - sig))
            n = y * s * rstd
            dout = tl.load(d_ptr + base + row * d_sr + cols, mask=ok, other=0.0).to(tl.float32)
            dw += dout * n
            # (w read a row at a time, from cache: held across rows it spilled at D = 8192)
            dn = dout * tl.load(W + base + cols, mask=ok, other=0.0).to(tl.float32)
            dg = rstd * (dn - n * (tl.sum(dn * n, axis=0) / GS))
            tl.store(DY + base + row * D + cols, (dg * s).to(DY.dtype.element_ty), mask=ok)
            tl.store(DZ + base + row * D + cols, (dg * q).to(DZ.dtype.element_ty), mask=ok)
    tl.store(DW + base + tl.program_id(0).to(tl.int64) * D + cols, dw, mask=ok)
