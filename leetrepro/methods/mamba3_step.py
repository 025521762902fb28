"""One token of Mamba-3's SISO recurrence over a pool of states: each sequence's angle, SSM
state, last rotated key and last value at its slot, stepped in place (the decode step of
:class:`leetrepro.models.Mamba3Block`). One Triton pass on a GPU (``kernels/mamba3_step.py``),
PyTorch's expressions elsewhere (the same recurrence as :func:`leetrepro.reference.mamba3_reference`
writes, one row).
"""
from __future__ import annotations

import math

import torch

from ..decay.trapezoid import rotate_pairs
from ._gpu import NoTriton, launch, next_pow2, on_row_kernels

try:
    from ..kernels import mamba3_step as kernels
except ImportError as err:  # without Triton: PyTorch's expressions
    kernels = NoTriton(err)


def _pytorch(Q, K, V, ADT, DT, Trap, Q_bias, K_bias, Angles, D, Z, pools, slots):
    angle, ssm, k_state, v_state = pools
    rep = V.shape[1] // Q.shape[1]
    f = torch.float64 if V.dtype == torch.float64 else torch.float32
    theta = angle[slots].to(f) + torch.tanh(Angles.to(f)) * math.pi * DT.to(f)[..., None]
    theta = torch.remainder(theta, 2 * math.pi)
    q = rotate_pairs(Q.repeat_interleave(rep, 1).to(f) + Q_bias.to(f), theta)
    k = rotate_pairs(K.repeat_interleave(rep, 1).to(f) + K_bias.to(f), theta)
    alpha, lam, dt = torch.exp(ADT.to(f)), torch.sigmoid(Trap.to(f)), DT.to(f)
    v = V.to(f)
    S = alpha[..., None, None] * ssm[slots].to(f) \
        + ((1 - lam) * dt * alpha)[..., None, None] * v_state[slots].to(f)[..., :, None] \
        * k_state[slots].to(f)[..., None, :] \
        + (lam * dt)[..., None, None] * v[..., :, None] * k[..., None, :]
    y = (S * q[..., None, :]).sum(-1)
    if D is not None:
        y = y + D.to(f)[:, None] * v
    if Z is not None:
        y = y * torch.nn.functional.silu(Z.to(f))
    for pool, new in zip(pools, (theta, S, k, v)):
        pool[slots] = new.to(pool.dtype)
    return y.to(V.dtype)


def mamba3_step(Q: torch.Tensor, K: torch.Tensor, V: torch.Tensor, ADT: torch.Tensor,
                DT: torch.Tensor, Trap: torch.Tensor, Q_bias: torch.Tensor, K_bias: torch.Tensor,
                Angles: torch.Tensor, D: torch.Tensor | None, Z: torch.Tensor | None,
                pools: tuple, slots: torch.Tensor) -> torch.Tensor:
    """One token per sequence: Q, K ``(batch, q/k heads, headdim_qk)``; V, Z ``(batch, heads,
    headdim_v)``; ADT, DT, Trap ``(batch, heads)``; Q_bias, K_bias ``(heads, headdim_qk)``; Angles
    ``(batch, heads, A)``; D ``(heads,)``; ``pools`` the four of
    :meth:`leetrepro.models.Mamba3Block.state_pools` (angle, ssm ``(slots, heads, headdim_v,
    headdim_qk)``, k, v), each sequence's at ``slots[b]`` (int, distinct) stepped in place.
    Returns y ``(batch, heads, headdim_v)`` in V's dtype. O(batch·heads·headdim_v·headdim_qk)."""
    angle, ssm, k_state, v_state = pools
    floats = (torch.float16, torch.bfloat16, torch.float32)
    if not (on_row_kernels(V, kernels) and V.dtype in floats and ssm.dtype == torch.float32
            and angle.dtype == torch.float32 and all(p.is_contiguous() for p in pools)):
        return _pytorch(Q, K, V, ADT, DT, Trap, Q_bias, K_bias, Angles, D, Z, pools, slots)
    batch, heads, dv = V.shape
    p, a = Q.shape[-1], Angles.shape[-1]
    out = torch.empty(batch, heads, dv, dtype=V.dtype, device=V.device)
    # (tiny per-token tensors stacked: one pointer each for the kernel's pairs and triples)
    qk = torch.stack([Q, K]).contiguous()
    vz = (torch.stack([V, Z.to(V.dtype)]) if Z is not None else V[None]).contiguous()
    scal = torch.stack([t.float() for t in (ADT, DT, Trap)]).contiguous()
    bias = torch.stack([Q_bias, K_bias]).float().contiguous()
    launch(kernels.mamba3_step, (batch, heads),
           dict(QK=qk, VZ=vz, SCAL=scal, BIAS=bias, ANGLES=Angles.float().contiguous(),
                D=D.float().contiguous() if D is not None else scal, STATES=tuple(pools),
                SLOTS=slots.to(device=V.device, dtype=torch.int64).contiguous(), OUT=out,
                SIZE=(batch, heads, heads // Q.shape[1], p, dv, a),
                K=kernels.StepConstants(BLOCK_P=next_pow2(p), BLOCK_V=next_pow2(dv),
                                        BLOCK_A=next_pow2(a), HAS_D=D is not None,
                                        HAS_Z=Z is not None, STEP_V=step_rows(dv))),
           num_warps=warps(p, step_rows(dv)))
    return out


#: rows of a head's state a step of the decode step's program (None: all its rows at once). At
#: mamba_ssm's test heads (64 × 128) all at once take 16 warps at 128 registers a thread, one
#: program an SM: 0.316 ms a batch-64 step in a graph against a 0.032 ms floor (H200); 8 rows a
#: step compile to 4 warps at 64 registers, 8 programs an SM: 0.137 ms (4, 8 and 16 rows within
#: 0.5 % of each other; notes/mamba3.md)
STEP_ROWS = 8


def step_rows(dv: int) -> int:
    """The state's rows a loop step of the decode step's program (:data:`STEP_ROWS`)."""
    whole = next_pow2(dv)
    return whole if STEP_ROWS is None else min(whole, next_pow2(STEP_ROWS))


def warps(p: int, dv: int) -> int:
    """Warps of a program holding a ``(headdim_v, headdim_qk)`` state: compiled for sm_90 at
    64 × 128 (mamba_ssm's test heads), 4 spilled 388 bytes a thread, 8 none at 255 registers,
    16 none at 128 (``probes.regs --passes``)."""
    return max(4, min(16, next_pow2(p) * next_pow2(dv) // 512))
