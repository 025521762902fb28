"""A Mamba-3 block (SISO) on this project's operator: in-projection to z, x, B, C, dt, A, the
trapezoid mix and the rotary angles; RMS norms over B and C with per-head biases; the trapezoidal
recurrence through :func:`leetrepro.compat.mamba3_siso_combined`; the gate silu(z) and the
out-projection; with prefill and a decode step over a pool of states.

Shapes follow mamba_ssm 2.3's ``Mamba3`` module with its defaults (SISO, no norm on the
output, ``rope_fraction`` 0.5): d_inner = expand·d_model, heads = d_inner / headdim, the queries
C and keys B ``ngroups`` heads of d_state, ``A = −max(f(dd_A), A_floor)`` with f the heavy-tailed
``1 + x`` (x ≥ 0) / ``1 / (1 − x)`` (x < 0), dt = softplus(dd_dt + dt_bias), λ = sigmoid(trap),
the angles ``(d_state·rope_fraction) / 2`` per token shared by the heads. Written from the
paper's and mamba_ssm's descriptions, not copied. MIMO (rank > 1: each head's x and z projected
to several rows whose outputs are summed) is not built: its state update is a matrix product
of rank R per token, not this operator's rank-one pair of rows.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from ..compat import mamba3_rows, mamba3_siso_combined
from ..methods.mamba3_step import mamba3_step


def heavy_tail(x: torch.Tensor) -> torch.Tensor:
    """``1 + x`` for x ≥ 0, ``1 / (1 − x)`` below: positive, continuous, with a heavy tail."""
    return x.clamp_min(0) + torch.reciprocal(1 - x.clamp_max(0))


class Mamba3Block(nn.Module):
    """One Mamba-3 mixer (SISO). ``forward(u, cu_seqlens=None)``: u ``(batch, N, d_model)`` →
    ``(batch, N, d_model)``; ``prefill(u)`` also returns the decode states; ``step(u_t, pools,
    slots)`` one token of each sequence, its states at ``slots`` of the four pools updated in
    place. ``method`` and ``options``: the operator's. ``siso``: another recurrence of mamba_ssm's
    ``mamba3_siso_combined`` signature in its place (mamba_ssm's own kernels, to compare the same
    block), given neither ``method`` nor ``options``."""

    def __init__(self, d_model: int, *, d_state: int = 128, headdim: int = 64, expand: int = 2,
                 ngroups: int = 1, rope_fraction: float = 0.5, dt_min: float = 1e-3,
                 dt_max: float = 0.1, dt_init_floor: float = 1e-4, A_floor: float = 1e-4,
                 method: str = "auto", siso=None, **options):
        super().__init__()
        d_inner = expand * d_model
        if d_inner % headdim:
            raise ValueError(f"expand·d_model = {d_inner} must be a multiple of headdim {headdim}")
        heads = d_inner // headdim
        if heads % ngroups:
            raise ValueError(f"ngroups {ngroups} must divide the heads {heads}")
        if rope_fraction not in (0.5, 1.0):
            raise ValueError(f"rope_fraction must be 0.5 or 1.0 (mamba_ssm's), got {rope_fraction}")
        self.angles = int(d_state * rope_fraction) // 2
        if self.angles < 1:
            raise ValueError(f"d_state {d_state} × rope_fraction {rope_fraction} leaves no angle")
        self.d_inner, self.heads, self.headdim = d_inner, heads, headdim
        self.d_state, self.ngroups, self.A_floor = d_state, ngroups, A_floor
        self.method, self.options, self.siso = method, options, siso
        self.in_proj = nn.Linear(d_model, 2 * d_inner + 2 * ngroups * d_state + 3 * heads
                                 + self.angles, bias=False)
        dt = torch.exp(torch.rand(heads) * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min))
        dt = dt.clamp_min(dt_init_floor)
        self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))  # (softplus⁻¹ of dt)
        self.B_bias = nn.Parameter(torch.ones(heads, d_state))
        self.C_bias = nn.Parameter(torch.ones(heads, d_state))
        self.B_norm = nn.RMSNorm(d_state, eps=1e-5)
        self.C_norm = nn.RMSNorm(d_state, eps=1e-5)
        self.D = nn.Parameter(torch.ones(heads))
        self.out_proj = nn.Linear(d_inner, d_model, bias=False)

    def _inputs(self, u: torch.Tensor) -> dict:
        """mamba3_siso_combined's inputs from u ``(batch, N, d_model)``."""
        b, n, _ = u.shape
        gs = self.ngroups * self.d_state
        z, x, B, C, dd_dt, dd_A, trap, angles = self.in_proj(u).split(
            [self.d_inner, self.d_inner, gs, gs, self.heads, self.heads, self.heads, self.angles], -1)
        f = torch.float64 if u.dtype == torch.float64 else torch.float32
        A = (-heavy_tail(dd_A.to(f))).clamp_max(-self.A_floor)
        dt = torch.nn.functional.softplus(dd_dt.to(f) + self.dt_bias.to(f))
        return dict(
            Q=self.C_norm(C.reshape(b, n, self.ngroups, self.d_state)),
            K=self.B_norm(B.reshape(b, n, self.ngroups, self.d_state)),
            V=x.reshape(b, n, self.heads, self.headdim), ADT=(A * dt).transpose(1, 2),
            DT=dt.transpose(1, 2), Trap=trap.transpose(1, 2), Q_bias=self.C_bias,
            K_bias=self.B_bias, Angles=angles.to(f)[:, :, None].expand(b, n, self.heads, -1),
            D=self.D, Z=z.reshape(b, n, self.heads, self.headdim))

    def _recurrence(self, **kw):
        if self.siso is not None:
            return self.siso(**kw)
        return mamba3_siso_combined(**kw, method=self.method, **self.options)

    def forward(self, u: torch.Tensor, cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
        y = self._recurrence(**self._inputs(u), cu_seqlens=cu_seqlens)
        return self.out_proj(y.reshape(*u.shape[:2], self.d_inner).to(u.dtype))

    def prefill(self, u: torch.Tensor):
        """``(out, states)``: the block over u, and its states ``(angle (batch, heads, angles),
        ssm (batch, heads, headdim, d_state) float32, k (batch, heads, d_state), v (batch, heads,
        headdim))``, what :meth:`step` goes on from."""
        y, *states = self._recurrence(**self._inputs(u), return_final_states=True)
        out = self.out_proj(y.reshape(*u.shape[:2], self.d_inner).to(u.dtype))
        return out, tuple(s.detach() for s in states)

    def state_pools(self, slots: int, device=None) -> tuple:
        """Four empty pools of ``slots`` decode states (zeros), :meth:`prefill`'s layouts, the
        SSM states and angles in float32."""
        p = next(self.parameters())
        device = device or p.device
        f32 = dict(device=device, dtype=torch.float32)
        return (torch.zeros(slots, self.heads, self.angles, **f32),
                torch.zeros(slots, self.heads, self.headdim, self.d_state, **f32),
                torch.zeros(slots, self.heads, self.d_state, device=device, dtype=p.dtype),
                torch.zeros(slots, self.heads, self.headdim, device=device, dtype=p.dtype))

    @torch.no_grad()
    def step(self, u: torch.Tensor, pools: tuple, slots: torch.Tensor) -> torch.Tensor:
        """One token per sequence: u ``(batch, d_model)``; the states at ``slots`` of ``pools``
        (:meth:`state_pools`) stepped in place (:func:`leetrepro.methods.mamba3_step.mamba3_step`:
        one pass on a GPU). Returns ``(batch, d_model)``."""
        if u.dim() != 2:
            raise ValueError(f"u must be (batch, d_model) = one token per sequence, got "
                             f"{tuple(u.shape)}")
        if not isinstance(pools, (tuple, list)) or len(pools) != 4:
            raise ValueError("pools must be the four pools of state_pools()")
        x = self._inputs(u[:, None])
        if self.siso is not None:  # (the compared recurrence, one token through its entry point)
            states = tuple(p[slots] for p in pools)
            y, *new = self._recurrence(**x, Input_States=states, return_final_states=True)
            for pool, s in zip(pools, new):
                pool[slots] = s.to(pool.dtype)
        else:
            y = mamba3_step(**mamba3_rows(x, 0), pools=pools, slots=slots)
        return self.out_proj(y.reshape(u.shape[0], self.d_inner).to(u.dtype))
