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

from ..decay.per_head import causal_mask, powers, scale_rows
from ..decay.per_token import gate_mask
from ..registry import register
from ._common import gamma_pow, torch_method


@register("block-based", "Bb", complexity="O(N·B_c·(r+d) + N·r·d)", language="torch",
          decays=("per_head", "per_token"),
          summary="Algorithm 2: blocks in sequence, intra-block quadratic + running r×d state",
          options={"block_size": 256})
@torch_method
def block_based(b, c, v, lg, block_size: int = 256, gate=None):
    """Shapes and gamma as in :func:`leetrepro.causal_linear_decoder`; ``block_size`` = B_c;
    ``gate``: per-token gates (module docstring)."""
    batch, heads, n, _ = b.shape
    kw = dict(dtype=b.dtype, device=b.device)
    out = torch.empty(batch, heads, n, v.shape[-1], **kw)
    state = torch.zeros(batch, heads, b.shape[-1], v.shape[-1], **kw)
    size = min(block_size, n)
    # a block's mask and row weights depend only on its length: build them once, slice the last
    mask, w_in = causal_mask(size, lg, **kw), powers(lg, size, start=1, **kw)
    for s in range(0, n, size):
        e = min(n, s + size)
        ln = e - s
        bi, ci, vi = b[:, :, s:e], c[:, :, s:e], v[:, :, s:e]
        if gate is not None:
            G = gate[:, :, s:e].cumsum(-1)  # the block's own running sums
            out[:, :, s:e] = ((bi @ ci.transpose(-1, -2)) * gate_mask(G, dtype=b.dtype)) @ vi \
                + (bi * torch.exp(G)[..., None]) @ state
            state = state * torch.exp(G[..., -1])[..., None, None] \
                + (ci * torch.exp(G[..., -1:] - G)[..., None]).transpose(-1, -2) @ vi
            continue
        w_out = powers(lg, ln, reverse=True, **kw)  # λ^(L-1-k): c_k's weight once the block ends
        out[:, :, s:e] = ((bi @ ci.transpose(-1, -2)) * mask[..., :ln, :ln]) @ vi \
            + scale_rows(bi, None if w_in is None else w_in[:, :ln]) @ state
        state = state * gamma_pow(lg, ln) + scale_rows(ci, w_out).transpose(-1, -2) @ vi
    return out
