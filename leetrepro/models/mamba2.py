"""A Mamba-2 block (Dao & Gu, 2024) on this project's operator: in-projection to z, x, B, C and dt,
a short causal depthwise convolution over x, B and C, the state-space dual (SSD) through
:func:`leetrepro.compat.mamba_chunk_scan_combined`, a gated RMS norm and the out-projection;
with a decode path (the convolution's last inputs and the SSM state of each sequence, the latter
in a state pool stepped by :func:`leetrepro.decode_step` with each token's gate).

Shapes follow mamba_ssm's ``Mamba2`` module (``rmsnorm=True``, ``norm_before_gate=False``):
d_inner = expand·d_model, heads = d_inner / headdim, the convolution over
d_inner + 2·ngroups·d_state channels, ``A = −exp(A_log)``, dt = softplus(dt + dt_bias) clamped to
``dt_limit``, ``y = norm(ssd(x) · silu(z))`` with the RMS norm over each group of
d_inner / ngroups channels (mamba_ssm's ``RMSNormGated(group_size=d_inner // ngroups)``).
Written from the paper's description, not copied.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from .._groups import expand_groups
from ..compat import check_dt_limit, mamba_chunk_scan_combined
from ..decode import decode_step
from ._conv import causal_conv_silu, causal_conv_update
from ._norm import gated_rms_norm


class Mamba2Block(nn.Module):
    """One Mamba-2 mixer. ``forward(u)``: u ``(batch, N, d_model)`` → ``(batch, N, d_model)``;
    ``prefill(u)`` also returns the decode state; ``step(u_t, conv_state, pool, slots)`` one
    token of each sequence, its SSM state at ``pool[slots]`` updated in place. ``method`` and
    ``options``: the operator's (``method="auto"``: Chunk on a GPU). ``ssd``: another SSD of
    mamba_ssm's ``mamba_chunk_scan_combined`` signature in its place (mamba_ssm's own kernels,
    to compare the same block), given neither ``method`` nor ``options``."""

    def __init__(self, d_model: int, *, d_state: int = 64, headdim: int = 64, expand: int = 2,
                 ngroups: int = 1, d_conv: int = 4, dt_min: float = 1e-3, dt_max: float = 0.1,
                 dt_limit: tuple = (0.0, math.inf), chunk_size: int = 256, method: str = "auto",
                 ssd=None, **options):
        super().__init__()
        d_inner = expand * d_model
        if d_inner % headdim:
            raise ValueError(f"expand·d_model = {d_inner} must be a multiple of headdim {headdim}")
        self.heads, self.headdim, self.d_state, self.ngroups = d_inner // headdim, headdim, d_state, ngroups
        if self.heads % ngroups:
            raise ValueError(f"ngroups {ngroups} must divide the heads {self.heads}")
        self.d_inner, self.d_conv, self.dt_limit, self.chunk_size = d_inner, d_conv, dt_limit, chunk_size
        check_dt_limit(dt_limit)
        if ssd is None and method != "auto":
            from ..registry import get
            get(method)  # (an unknown method named now, not at the first forward)
        self.method, self.options, self.ssd = method, options, ssd
        conv_dim = d_inner + 2 * ngroups * d_state
        self.in_proj = nn.Linear(d_model, 2 * d_inner + 2 * ngroups * d_state + self.heads, bias=False)
        self.conv1d = nn.Conv1d(conv_dim, conv_dim, d_conv, groups=conv_dim, padding=d_conv - 1)
        # dt's bias: the inverse softplus of a dt drawn log-uniformly in [dt_min, dt_max]
        dt = torch.exp(torch.rand(self.heads) * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min))
        self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))
        self.A_log = nn.Parameter(torch.log(torch.empty(self.heads).uniform_(1, 16)))
        self.D = nn.Parameter(torch.ones(self.heads))
        self.norm_weight = nn.Parameter(torch.ones(d_inner))
        self.out_proj = nn.Linear(d_inner, d_model, bias=False)

    def _split(self, zxbcdt):
        n = self.ngroups * self.d_state
        return zxbcdt.split([self.d_inner, self.d_inner + 2 * n, self.heads], -1)

    def _ssd_inputs(self, xbc):
        n = self.ngroups * self.d_state
        x, B, C = xbc.split([self.d_inner, n, n], -1)
        lead = x.shape[:-1]
        return (x.reshape(*lead, self.heads, self.headdim),
                B.reshape(*lead, self.ngroups, self.d_state), C.reshape(*lead, self.ngroups, self.d_state))

    def _out(self, y, z):
        """The gated RMS norm over each group of d_inner / ngroups channels
        (:func:`leetrepro.models._norm.gated_rms_norm`: one pass each way on a GPU), then the
        out-projection."""
        return self.out_proj(gated_rms_norm(y, z, self.norm_weight, 1e-5,
                                            group_size=self.d_inner // self.ngroups))

    def forward(self, u: torch.Tensor, group=None) -> torch.Tensor:
        """u ``(batch, N, d_model)`` → ``(batch, N, d_model)``. With ``group`` (a
        ``torch.distributed`` process group), u is this rank's contiguous slice of a sequence
        cut across the group's ranks (rank order = sequence order): the convolution reads the
        K − 1 rows before the slice from the ranks that hold them
        (:func:`leetrepro.distributed.halo_rows`), the SSD passes its states across the ranks
        (:func:`leetrepro.distributed.mamba_chunk_scan_combined_sp`); a collective call, equal
        to the whole sequence on one process (the parameters' gradients summed over the ranks
        as a replicated parameter's are)."""
        if group is None:
            return self.prefill(u)[0]
        if self.ssd is not None:
            raise ValueError("a block with another SSD (ssd=) runs on one process only: "
                             "group= takes this project's")
        from ..distributed import halo_rows, mamba_chunk_scan_combined_sp
        batch, n, _ = u.shape
        z, xbc, dt = self._split(self.in_proj(u))
        k = self.d_conv - 1
        wide = torch.cat([halo_rows(xbc, k, group), xbc], 1)
        xbc = causal_conv_silu(wide, self.conv1d.weight, self.conv1d.bias)[:, k:]
        x, B, C = self._ssd_inputs(xbc)
        y = mamba_chunk_scan_combined_sp(
            x, dt, -torch.exp(self.A_log.float()), B, C, self.chunk_size, D=self.D,
            dt_bias=self.dt_bias, group=group, dt_softplus=True, dt_limit=self.dt_limit,
            method=self.method, **self.options)
        return self._out(y.reshape(batch, n, self.d_inner), z)

    def prefill(self, u: torch.Tensor):
        """``(out, conv_state (batch, conv channels, d_conv), ssm_state (batch, heads, d_state,
        headdim))``: the block over u, and what :meth:`step` goes on from."""
        batch, n, _ = u.shape
        z, xbc, dt = self._split(self.in_proj(u))
        conv_in = xbc.transpose(1, 2)
        conv_state = torch.nn.functional.pad(conv_in, (self.d_conv - n, 0))[..., -self.d_conv:] \
            if n < self.d_conv else conv_in[..., -self.d_conv:]
        # (time-major rows, each (x, B, C) row contiguous, as the convolution writes them)
        xbc = causal_conv_silu(xbc, self.conv1d.weight, self.conv1d.bias)
        x, B, C = self._ssd_inputs(xbc)
        ssd, own = (mamba_chunk_scan_combined, dict(method=self.method, **self.options)) \
            if self.ssd is None else (self.ssd, {})
        y, state = ssd(
            x, dt, -torch.exp(self.A_log.float()), B, C, self.chunk_size, D=self.D,
            dt_bias=self.dt_bias, dt_softplus=True, dt_limit=self.dt_limit,
            return_final_states=True, **own)
        out = self._out(y.reshape(batch, n, self.d_inner), z)
        # (the convolution's state copied: a view would keep the whole in-projection alive for
        # as long as a decode holds it)
        return out, conv_state.detach().clone(), state.transpose(-1, -2).detach()

    @torch.no_grad()
    def step(self, u: torch.Tensor, conv_state: torch.Tensor, pool: torch.Tensor,
             slots: torch.Tensor) -> torch.Tensor:
        """One token per sequence: u ``(batch, d_model)``; ``conv_state`` ``(batch, conv
        channels, d_conv)`` shifted in place; the SSM states at ``pool[slots]`` (float32
        ``(slots, heads, d_state, headdim)``) stepped in place by :func:`leetrepro.decode_step`
        with the token's gate dt·A. Returns ``(batch, d_model)``."""
        self._check_step(u, conv_state, pool, slots)
        z, xbc, dt = self._split(self.in_proj(u))
        xbc = causal_conv_update(xbc[..., None], conv_state, self.conv1d.weight,
                                 self.conv1d.bias)[..., 0]
        x, B, C = self._ssd_inputs(xbc)
        dt = torch.nn.functional.softplus(dt.float() + self.dt_bias.float())
        if tuple(self.dt_limit) != (0.0, math.inf):
            dt = dt.clamp(*self.dt_limit)
        # (the decode step reads a head each: the groups expanded, one token's worth)
        query, key = (expand_groups(t, self.heads)[:, :, None] for t in (C, B))  # (batch, heads, 1, N)
        v = (x.float() * dt[..., None]).to(x.dtype)[:, :, None]                   # (batch, heads, 1, P)
        y = decode_step(query.to(x.dtype), key.to(x.dtype), v, None, pool, slots,
                        g=(dt * -torch.exp(self.A_log.float()))[..., None])[:, :, 0]
        y = y + self.D[:, None].to(y.dtype) * x
        return self._out(y.reshape(u.shape[0], self.d_inner), z)

    def _check_step(self, u, conv_state, pool, slots) -> None:
        """:meth:`step`'s inputs in its own terms (the decode step checks the pool and slots)."""
        d_model = self.in_proj.in_features
        if not isinstance(u, torch.Tensor) or u.dim() != 2 or u.shape[1] != d_model:
            got = tuple(u.shape) if isinstance(u, torch.Tensor) else type(u).__name__
            raise ValueError(f"u must be one token per sequence, (batch, d_model) = (batch, "
                             f"{d_model}), got {got}"
                             + ("; for (batch, 1, d_model) pass u[:, 0]" if isinstance(
                                 u, torch.Tensor) and u.dim() == 3 and u.shape[1] == 1 else ""))
        want = (u.shape[0], self.conv1d.in_channels, self.d_conv)
        if not isinstance(conv_state, torch.Tensor) or tuple(conv_state.shape) != want:
            got = tuple(conv_state.shape) if isinstance(conv_state, torch.Tensor) else \
                type(conv_state).__name__
            raise ValueError(f"conv_state must be (batch, conv channels, d_conv) = {want}, as "
                             f"prefill returns it, got {got}")
        want = (self.heads, self.d_state, self.headdim)
        if not isinstance(pool, torch.Tensor) or pool.dim() != 4 or tuple(pool.shape[1:]) != want:
            got = tuple(pool.shape) if isinstance(pool, torch.Tensor) else type(pool).__name__
            raise ValueError(f"pool must be (slots, heads, d_state, headdim) = (slots, "
                             f"{', '.join(map(str, want))}), got {got}")
