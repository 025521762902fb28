"""One token of Mamba-3's SISO recurrence (``leetrepro.methods.mamba3_step``) in one pass, each
sequence's four states stepped in place at its slot of the pools:

    θ ← (θ + tanh(angles)·π·dt) mod 2π,   q̃ = R(θ)(q + q_bias),   k̃ = R(θ)(k + k_bias),
    S ← α S + (1 − λ) dt α · v_prev k̃_prevᵀ + λ dt · v k̃ᵀ,   y = (S q̃ + D v) · silu(z),

α = exp(ADT), λ = sigmoid(Trap), R(θ) turning each pair (2i, 2i + 1) of the first 2·A dims by θ_i;
then k̃_prev ← k̃ and v_prev ← v. A (sequence, head) program holds the head's state as its even
and odd columns ``[STEP_V, BLOCK_P / 2]`` each, STEP_V of its rows at a time (each row's output
is its own), read and written once. float32 inside.
"""
import collections

import triton
import triton.language as tl

#: :func:`mamba3_step`'s constexprs: its tiles (headdim, value dim, angles; powers of two), the
#: inputs the call has (D, z) and the state's rows a step of its loop (``STEP_V``)
StepConstants = collections.namedtuple(
    "StepConstants", "BLOCK_P BLOCK_V BLOCK_A HAS_D HAS_Z STEP_V")

PI = tl.constexpr(3.141592653589793)


@triton.jit
def _rotated(X, BIAS, cos, sin, i, ok):
    """The pairs (2i, 2i + 1) of the row at X plus its bias at BIAS, turned by (cos, sin)."""
    even = tl.load(X + 2 * i, mask=ok, other=0.0).to(tl.float32) + \
        tl.load(BIAS + 2 * i, mask=ok, other=0.0).to(tl.float32)
    odd = tl.load(X + 2 * i + 1, mask=ok, other=0.0).to(tl.float32) + \
        tl.load(BIAS + 2 * i + 1, mask=ok, other=0.0).to(tl.float32)
    return even * cos - odd * sin, even * sin + odd * cos


@triton.jit
def mamba3_step(QK, VZ, SCAL, BIAS, ANGLES, D, STATES, SLOTS, OUT, SIZE, K: tl.constexpr):
    """QK ``(2, batch, q/k heads, P)`` (q then k), VZ ``(1 or 2, batch, heads, DV)`` (v, then z
    with ``HAS_Z``), SCAL ``(3, batch, heads)`` float32 (ADT, dt, Trap), BIAS ``(2, heads, P)``
    (q's, k's), ANGLES ``(batch, heads, A)``, D ``(heads,)``, OUT ``(batch, heads, DV)``, all
    contiguous; STATES the pools ``(angle (slots, heads, A) float32, ssm (slots, heads, DV, P)
    float32, k (slots, heads, P), v (slots, heads, DV))`` contiguous, SLOTS ``(batch,)`` int64;
    ``SIZE = (batch, heads, heads a q/k head, P, DV, A)``; grid (batch, heads). ``STEP_V``:
    the state's rows a step of the program's loop over them (a power of two, at most
    BLOCK_V: all at once). ``K``: :data:`StepConstants`."""
    BLOCK_P: tl.constexpr = K.BLOCK_P
    BLOCK_V: tl.constexpr = K.BLOCK_V
    BLOCK_A: tl.constexpr = K.BLOCK_A
    HAS_D: tl.constexpr = K.HAS_D
    HAS_Z: tl.constexpr = K.HAS_Z
    STEP_V: tl.constexpr = K.STEP_V
    NB, H, PER, P, DV, A = SIZE
    ANG_S, SSM_S, K_S, V_S = STATES
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    slot = tl.load(SLOTS + b).to(tl.int64)
    HQK = H // PER
    i = tl.arange(0, BLOCK_P // 2)
    a = tl.arange(0, BLOCK_A)
    ok_i = i < P // 2
    adt = tl.load(SCAL + b * H + h)
    dt = tl.load(SCAL + (NB + b) * H + h)
    trap = tl.load(SCAL + (2 * NB + b) * H + h)
    # the angles: a running sum mod 2π (tanh by exp: no overflow, ±1 at the ends)
    at_theta = ANG_S + (slot * H + h) * A + a
    raw = tl.load(ANGLES + (b * H + h) * A + a, mask=a < A, other=0.0).to(tl.float32)
    theta = tl.load(at_theta, mask=a < A, other=0.0) + \
        (1.0 - 2.0 / (tl.exp(2.0 * raw) + 1.0)) * PI * dt
    theta = theta - 2 * PI * tl.floor(theta / (2 * PI))
    tl.store(at_theta, theta, mask=a < A)
    # each pair's angle: θ_i for i < A, 0 past them (unrotated)
    pick = tl.where(i[:, None] == a[None, :], theta[None, :], 0.0)
    ang = tl.sum(pick, axis=1)
    cos, sin = tl.cos(ang), tl.sin(ang)
    g = h // PER
    q_e, q_o = _rotated(QK + (b * HQK + g) * P, BIAS + h * P, cos, sin, i, ok_i)
    k_e, k_o = _rotated(QK + ((NB + b) * HQK + g) * P, BIAS + (H + h) * P, cos, sin, i, ok_i)
    # the state, its even and odd columns, STEP_V of its rows at a time
    at_k = K_S + (slot * H + h) * P + 2 * i
    kp_e = tl.load(at_k, mask=ok_i, other=0.0).to(tl.float32)
    kp_o = tl.load(at_k + 1, mask=ok_i, other=0.0).to(tl.float32)
    alpha = tl.exp(adt)
    lam = 1.0 / (1.0 + tl.exp(-trap))
    beta, gamma = (1.0 - lam) * dt * alpha, lam * dt
    for c0 in range(0, BLOCK_V, STEP_V):
        c = c0 + tl.arange(0, STEP_V)
        ok_c = c < DV
        at_s = SSM_S + ((slot * H + h) * DV + c[:, None]) * P + 2 * i[None, :]
        ok = ok_c[:, None] & ok_i[None, :]
        s_e = tl.load(at_s, mask=ok, other=0.0)
        s_o = tl.load(at_s + 1, mask=ok, other=0.0)
        at_v = V_S + (slot * H + h) * DV + c
        vp = tl.load(at_v, mask=ok_c, other=0.0).to(tl.float32)
        v = tl.load(VZ + (b * H + h) * DV + c, mask=ok_c, other=0.0).to(tl.float32)
        s_e = alpha * s_e + (beta * vp)[:, None] * kp_e[None, :] + \
            (gamma * v)[:, None] * k_e[None, :]
        s_o = alpha * s_o + (beta * vp)[:, None] * kp_o[None, :] + \
            (gamma * v)[:, None] * k_o[None, :]
        tl.store(at_s, s_e, mask=ok)
        tl.store(at_s + 1, s_o, mask=ok)
        tl.store(at_v, v.to(V_S.dtype.element_ty), mask=ok_c)
        y = tl.sum(s_e * q_e[None, :] + s_o * q_o[None, :], axis=1)
        if HAS_D:
            y += tl.load(D + h).to(tl.float32) * v
        if HAS_Z:
            z = tl.load(VZ + ((NB + b) * H + h) * DV + c, mask=ok_c, other=0.0).to(tl.float32)
            y = y * z / (1.0 + tl.exp(-z))
        tl.store(OUT + (b * H + h) * DV + c, y.to(OUT.dtype.element_ty), mask=ok_c)
    tl.store(at_k, k_e.to(K_S.dtype.element_ty), mask=ok_i)
    tl.store(at_k + 1, k_o.to(K_S.dtype.element_ty), mask=ok_i)
