"""FleetAttention (FA): Eq. (5) and its decayed form (Appendix C.1),

    O = Σ_{i=1..r} diag(b_i) · λ-cumsum(diag(c_i) V),

with b_i, c_i the i-th columns of B and C. O(N·r·d) time, O(N·d) extra memory (one rank at a time).
The λ-cumsum is evaluated without logarithms or negative powers of λ
(:func:`leetrepro.decay.per_head.discounted_cumsum`), so inputs of any sign give finite, correct results.
"""
from __future__ import annotations

import torch

from ..decay.per_head import discounted_cumsum
from ..registry import GPU_DTYPES, register
from ._common import torch_method
from ._gpu import NoTriton, cdiv, next_pow2, staged

try:
    from ..kernels import fleet_attn as fa_kernels
except ImportError as err:  # without Triton: a clear error when the kernel is called
    fa_kernels = NoTriton(err)


@register("FleetAttention_torch", "FA_torch", complexity="O(N·r·d)", language="torch",
          summary="Eq. (5): sum over ranks of diag(b_i)·λ-cumsum(diag(c_i) V)")
@torch_method
def fleet_attention_torch(b, c, v, decay):
    """Shapes and gamma as in :func:`leetrepro.causal_linear_decoder` (``decay``: its log λ)."""
    out = torch.zeros_like(v)
    for i in range(b.shape[-1]):
        out += b[..., i:i + 1] * discounted_cumsum(c[..., i:i + 1] * v, decay.lg)
    return out


def _launch(B, C, V, gamma, rank_groups: int):
    batch, heads, n, r = B.shape
    d = V.shape[-1]
    B, C, V, lam = staged(B, C, V, gamma)
    out = torch.zeros_like(V) if rank_groups > 1 else torch.empty_like(V)
    prefix = torch.zeros(batch * heads, r, d, dtype=torch.float32, device=V.device)  # the l^j
    block_d = min(64, next_pow2(d))
    per_program = cdiv(r, rank_groups)
    grid = (batch * heads, cdiv(d, block_d), cdiv(r, per_program))
    fa_kernels.fa_fwd_kernel[grid](B=B, C=C, V=V, O=out, L_WS=prefix, GAMMA=lam, N=n, R=r, D=d, H=heads,
                             RANKS_PER_PROGRAM=per_program, HAS_DECAY=lam is not None,
                             ACCUMULATE=rank_groups > 1, BLOCK_N=64, BLOCK_D=block_d, num_warps=4)
    return out


@register("FleetAttention", "FA", complexity="O(N·r·d)", language="triton", dtypes=GPU_DTYPES,
          devices=("cuda",),
          summary="Triton Algorithm 5: column × row blocks, prefix sums l^j carried, ranks summed "
                  "in one program (deterministic)")
def fleet_attention(B, C, V, gamma):
    """Triton FleetAttention (Algorithm 5, App. C.1). Shapes and gamma as in
    :func:`leetrepro.causal_linear_decoder`. Grid: (batch·heads, d / 64); each program sums all
    ranks itself, so results are bit-identical from run to run. Workspace: r·d fp32 per
    (batch, head) for the prefix sums."""
    return _launch(B, C, V, gamma, rank_groups=1)


@register("FleetAttention_modify", "FA_modify", complexity="O(N·r·d)", language="triton",
          dtypes=GPU_DTYPES, devices=("cuda",), unsafe=True,
          summary="UNSAFE (Appendix D, Table 9 only): ranks split across programs that add into O "
                  "without synchronisation; results are wrong",
          options={"rank_groups": 8})
def fleet_attention_modify(B, C, V, gamma, rank_groups: int = 8):
    """UNSAFE: FleetAttention_modify of Appendix D, kept only to reproduce Table 9.

    The ranks are split into ``rank_groups`` groups run by different programs, which add their
    partial sums into O with an unsynchronised load-add-store; updates are lost when they overlap,
    so the output is wrong (how wrong is part of what Table 9 reports). Never chosen by
    ``method="auto"``.
    """
    return _launch(B, C, V, gamma, rank_groups=rank_groups)
