"""mamba_ssm's ``selective_state_update``: one token of Mamba-2's recurrence over a state kept
``(headdim, dstate)`` (mamba_ssm's and transformers' layout), in one Triton pass on a GPU
(``kernels/state_update.py``), PyTorch's expressions elsewhere.
"""
from __future__ import annotations

import torch

from ._gpu import NoTriton, launch, next_pow2, on_row_kernels, strided

try:
    from ..kernels import state_update as kernels
except ImportError as err:  # without Triton: PyTorch's expressions
    kernels = NoTriton(err)

DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _pytorch(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus):
    heads = x.shape[1]
    dt = dt.float() + (dt_bias.float() if dt_bias is not None else 0)
    dt = torch.nn.functional.softplus(dt) if dt_softplus else dt
    per = heads // B.shape[1]
    Bh, Ch = (t.float().repeat_interleave(per, 1) for t in (B, C))  # (batch, heads, dstate)
    xf = x.float()
    new = state.float() * torch.exp(dt[..., None] * A.float()) + \
        (dt * xf)[..., None] * Bh[:, :, None, :]
    state.copy_(new.to(state.dtype))
    out = (new @ Ch[..., None])[..., 0]
    if D is not None:
        out = out + xf * D.float()
    if z is not None:
        out = out * torch.nn.functional.silu(z.float())
    return out.to(x.dtype)


def selective_state_update(state: torch.Tensor, x: torch.Tensor, dt: torch.Tensor,
                           A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
                           D: torch.Tensor | None = None, z: torch.Tensor | None = None,
                           dt_bias: torch.Tensor | None = None,
                           dt_softplus: bool = False) -> torch.Tensor:
    """One token: state ``(batch, heads, headdim, dstate)`` stepped in place,
    ``h ← exp(dt·A) h + (dt·x) ⊗ B`` with ``dt ← softplus(dt + dt_bias)`` (``dt_softplus``);
    returns ``h C + D x`` (times silu(z) with z) ``(batch, heads, headdim)`` in x's dtype.
    x, dt, z ``(batch, heads, headdim)``; A ``(heads, headdim, dstate)``; B, C ``(batch, groups,
    dstate)``, groups dividing heads; D, dt_bias ``(heads, headdim)`` (mamba_ssm's shapes; any
    strides, expanded views read in place). mamba_ssm's 3-D form (no heads dimension) is taken as
    one head. O(batch·heads·headdim·dstate)."""
    if x.dim() == 2:  # (mamba_ssm's form without heads: one head)
        one = [t.unsqueeze(1) if t is not None else None for t in (x, dt, z)]
        out = selective_state_update(state.unsqueeze(1), one[0], one[1], A.unsqueeze(0),
                                     B.unsqueeze(1), C.unsqueeze(1),
                                     None if D is None else D.unsqueeze(0), one[2],
                                     None if dt_bias is None else dt_bias.unsqueeze(0),
                                     dt_softplus)
        return out[:, 0]
    batch, heads, p = x.shape
    n = state.shape[-1]
    # (per-head values as mamba_ssm also takes them, expanded in place: views, no copies)
    dt = dt[..., None].expand(batch, heads, p) if dt.dim() == 2 else dt
    A = A[:, None, None].expand(heads, p, n) if A.dim() == 1 else A
    D = D[:, None].expand(heads, p) if D is not None and D.dim() == 1 else D
    dt_bias = dt_bias[:, None].expand(heads, p) if dt_bias is not None and dt_bias.dim() == 1 \
        else dt_bias
    # (any state strides: Zamba2's and Falcon-H1's caches hand on a transposed view, whose
    # PyTorch expressions took 1.9x the kernels' time of a batch-64 generate, H200, notes)
    if not (on_row_kernels(x, kernels) and state.dtype in DTYPES and x.dtype in DTYPES
            and heads % B.shape[1] == 0):
        return _pytorch(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus)
    out = torch.empty(batch, heads, p, dtype=x.dtype, device=x.device)
    block_p, block_n = next_pow2(p), next_pow2(n)
    launch(kernels.selective_state_update, (batch, heads),
           # (the state with its four strides, each other tensor with its first three; D and
           # dt_bias, (heads, headdim), two)
           dict(STATE=(state, *state.stride()), X=strided(x), DT=strided(dt), A=strided(A), B=strided(B),
                C=strided(C), D=strided(D if D is not None else x)[:3],
                Z=strided(z if z is not None else x),
                DT_BIAS=strided(dt_bias if dt_bias is not None else x)[:3], OUT=out,
                SIZE=(heads, p, n, heads // B.shape[1]),
                K=kernels.StateConstants(BLOCK_P=block_p, BLOCK_N=block_n, HAS_D=D is not None,
                                         HAS_Z=z is not None, HAS_BIAS=dt_bias is not None,
                                         SOFTPLUS=bool(dt_softplus))),
           # (compiled for sm_90: no spills at headdim 64 × dstate 128 on 8 warps, 24 bytes at
           # 64 × 256; 16 warps spilled 200)
           num_warps=max(1, min(8, block_p * block_n // 1024)))
    return out
