"""block-based (Bb): Algorithm 2 (Appendix B.2, after Transformer-VQ), generalised to decay.

Blocks of ``block_size`` rows are processed in order; each gets its intra-block part from the
masked quadratic formula and its inter-block part from the running state U = Σ_{j<s} λ^(s-1-j) c_jᵀ v_j:

    O_[i] = (B_[i] C_[i]ᵀ ⊙ M) V_[i] + diag(λ^1..λ^L) B_[i] U
    U    ← λ^L U + (diag(λ^(L-1)..λ^0) C_[i])ᵀ V_[i]

O(N·B_c·(r+d) + N·r·d) time, O(B_c² + r·d) extra memory per (batch, head).

Per-token gates extend it unchanged in cost: within a block the powers of λ become exp of
differences of the block's own running gate sums G (M = exp(G_i − G_j), row weights exp(G_i),
column weights exp(G_L − G_j)), and U decays by exp(G_L), the block's total gate.
"""
from __future__ import annotations

import torch

from ..decay.per_head import scale_rows
from ..registry import register
from ._common import torch_method


@register("block-based", "Bb", complexity="O(N·B_c·(r+d) + N·r·d)", language="torch",
          decays=("per_head", "per_token"),
          summary="Algorithm 2: blocks in sequence, intra-block quadratic + running r×d state",
          options={"block_size": 256})
@torch_method
def block_based(b, c, v, decay, block_size: int = 256):
    """Shapes and gamma as in :func:`leetrepro.causal_linear_decoder`; ``block_size`` = B_c;
    ``decay``: per-head λ or per-token gates (module docstring)."""
    batch, heads, n, _ = b.shape
    kw = dict(dtype=b.dtype, device=b.device)
    out = torch.empty(batch, heads, n, v.shape[-1], **kw)
    state = torch.zeros(batch, heads, b.shape[-1], v.shape[-1], **kw)
    for s, e, w in decay.blocks(n, min(block_size, n), **kw):
        bi, ci, vi = b[:, :, s:e], c[:, :, s:e], v[:, :, s:e]
        out[:, :, s:e] = ((bi @ ci.transpose(-1, -2)) * w.mask) @ vi \
            + scale_rows(bi, w.into) @ state
        state = state * w.total + scale_rows(ci, w.out_of).transpose(-1, -2) @ vi
    return out
