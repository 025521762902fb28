"""mamba_ssm's ``selective_state_update`` (one token of Mamba-2's recurrence, the state laid out
``(headdim, dstate)`` as mamba_ssm and transformers keep it) in one pass, the state stepped in
place (``leetrepro.methods.state_update``):

    dt ← softplus(dt + dt_bias),   h ← exp(dt·A) ⊙ h + (dt·x) ⊗ B,   y = h·C + D·x   (· silu(z))

per (sequence, head) program: the head's whole state ``[BLOCK_P, BLOCK_N]`` read and written
once. Every tensor but the output comes as its pointer and strides (transformers passes dt, A, D and dt_bias
expanded over headdim and dstate: stride 0 is read as it is; its hybrid models' caches hand the
state on as a transposed view, dstate's stride not 1). float32 inside.
"""
import collections

import triton
import triton.language as tl

#: :func:`selective_state_update`'s constexprs: its tiles of the state (headdim, d_state, powers
#: of two) and the inputs the call has (D, z, dt_bias) and whether dt goes through softplus
StateConstants = collections.namedtuple(
    "StateConstants", "BLOCK_P BLOCK_N HAS_D HAS_Z HAS_BIAS SOFTPLUS")


@triton.jit
def _at(T, i, j, k):
    """T's element pointers at indices i, j, k of its first three dimensions (``(pointer,
    stride, stride, stride)``)."""
    ptr, s0, s1, s2 = T
    return ptr + i * s0 + j * s1 + k * s2


@triton.jit
def selective_state_update(STATE, X, DT, A, B, C, D, Z, DT_BIAS, OUT, SIZE, K: tl.constexpr):
    """STATE ``(batch, heads, P, N)`` (any strides); X, Z ``(batch, heads, P)``; OUT the same,
    contiguous; DT ``(batch, heads, P)``; A ``(heads, P, N)``; B, C ``(batch, groups, N)``; D, DT_BIAS
    ``(heads, P)``: each ``(pointer, strides…)``; ``SIZE = (heads, P, N, heads a group)``; grid
    (batch, heads); ``K``: :data:`StateConstants`."""
    BLOCK_P: tl.constexpr = K.BLOCK_P
    BLOCK_N: tl.constexpr = K.BLOCK_N
    HAS_D: tl.constexpr = K.HAS_D
    HAS_Z: tl.constexpr = K.HAS_Z
    HAS_BIAS: tl.constexpr = K.HAS_BIAS
    SOFTPLUS: tl.constexpr = K.SOFTPLUS
    H, P, N, PER = SIZE
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    g = h // PER
    p = tl.arange(0, BLOCK_P)
    n = tl.arange(0, BLOCK_N)
    ok_p, ok_n = p < P, n < N
    ok = ok_p[:, None] & ok_n[None, :]
    s_ptr, s_sb, s_sh, s_sp, s_sn = STATE
    at_state = s_ptr + b * s_sb + h * s_sh + p[:, None] * s_sp + n[None, :] * s_sn
    state = tl.load(at_state, mask=ok, other=0.0).to(tl.float32)
    x = tl.load(_at(X, b, h, p), mask=ok_p, other=0.0).to(tl.float32)
    dt = tl.load(_at(DT, b, h, p), mask=ok_p, other=0.0).to(tl.float32)
    if HAS_BIAS:
        bias_ptr, bias_sh, bias_sp = DT_BIAS
        dt += tl.load(bias_ptr + h * bias_sh + p * bias_sp, mask=ok_p, other=0.0).to(tl.float32)
    if SOFTPLUS:  # (as torch's softplus: the identity past 20, e^dt where 1 + e^dt rounds to 1)
        e = tl.exp(tl.minimum(dt, 20.0))
        dt = tl.where(dt > 20.0, dt, tl.where(dt < -15.0, e, tl.log(1.0 + e)))
    a_ptr, a_sh, a_sp, a_sn = A
    a = tl.load(a_ptr + h * a_sh + p[:, None] * a_sp + n[None, :] * a_sn, mask=ok,
                other=0.0).to(tl.float32)
    bv = tl.load(_at(B, b, g, n), mask=ok_n, other=0.0).to(tl.float32)
    cv = tl.load(_at(C, b, g, n), mask=ok_n, other=0.0).to(tl.float32)
    state = state * tl.exp(dt[:, None] * a) + (dt * x)[:, None] * bv[None, :]
    tl.store(at_state, state.to(s_ptr.dtype.element_ty), mask=ok)
    out = tl.sum(state * cv[None, :], axis=1)
    if HAS_D:
        d_ptr, d_sh, d_sp = D
        out += x * tl.load(d_ptr + h * d_sh + p * d_sp, mask=ok_p, other=0.0).to(tl.float32)
    if HAS_Z:
        z = tl.load(_at(Z, b, h, p), mask=ok_p, other=0.0).to(tl.float32)
        out = out * z / (1.0 + tl.exp(-z))
    tl.store(OUT + (b * H + h) * P + p, out.to(OUT.dtype.element_ty), mask=ok_p)
