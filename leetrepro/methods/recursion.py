"""recursion (Recur): Algorithms 3-4 (Appendix B.3, after HyperAttention), with decay.

The masked matrix splits into two masked halves and one unmasked off-diagonal block, computed by
right multiplication with decay weights (row i = mid + a, column j = left + k, i - j = (a+1) + (h-1-k)):

    O_2 += diag(λ^1..λ^h) B_2 ((diag(λ^(h-1)..λ^0) C_1)ᵀ V_1)

down to blocks of ``base`` rows, which use the quadratic formula. T(N) = 2T(N/2) + Θ(N·r·d), so
O(N log N) (Lemma 3.1). N is padded with zero rows to base·2^k (zeros add nothing to earlier rows),
so every split is into equal halves; all splits of one level are done in one batched product
(the same arithmetic as the depth-first recursion, without one Python call per node).

Per-token gates extend it at the same cost: with G the running gate sums local to each
segment of 2h rows and G_m their value at the first half's last row, the off-diagonal block's
weights are exp(G_i − G_m) on the rows and exp(G_m − G_j) on the columns (their product is
exp(G_i − G_j), and neither exponent is positive), the leaves' masks exp(G_i − G_j) within a
block.
"""
from __future__ import annotations

import math

import torch

from ..decay.blocks import of_blocks
from ..decay.per_head import scale_rows
from ..registry import register
from ._common import torch_method


def padded_length(n: int, base: int) -> int:
    """base·2^k ≥ n: the length the recursion runs on."""
    return base * 2 ** max(0, math.ceil(math.log2(max(1, math.ceil(n / base)))))


@register("recursion", "Recur", complexity="O(N log N · r·d)", language="torch",
          decays=("per_head", "per_token"),
          summary="Algorithms 3-4: halves recursively, off-diagonal block by right multiplication",
          options={"base": 32})
@torch_method
def recursion(b, c, v, decay, base: int = 32):
    """Shapes and gamma as in :func:`leetrepro.causal_linear_decoder`; ``base`` = termination size;
    ``decay``: per-head λ or per-token gates (module docstring)."""
    batch, heads, n, r = b.shape
    d = v.shape[-1]
    kw = dict(dtype=b.dtype, device=b.device)
    size = padded_length(n, base)
    base = min(base, size)
    b, c, v = (torch.nn.functional.pad(t, (0, 0, 0, size - n)) for t in (b, c, v))
    decay = decay.padded(size)

    def blocks(t, length):  # (batch, H, size, k) -> (batch, H, size/length, length, k)
        return t.view(batch, heads, size // length, length, t.shape[-1])

    # leaves: masked quadratic formula on every block of `base` rows at once
    mask = decay.batched(size // base, base, **kw).mask
    lb, lc, lv = blocks(b, base), blocks(c, base), blocks(v, base)
    out = ((lb @ lc.transpose(-1, -2)) * mask) @ lv
    out = out.view(batch, heads, size, d)
    half = base
    while half < size:
        seg = 2 * half
        sb, sc, sv = (t.view(batch, heads, size // seg, 2, half, t.shape[-1]) for t in (b, c, v))
        # (each half a block: the second's rows weighted from the first's end, the first's
        # columns to its end; their product is the pair's mask)
        w = decay.batched(size // half, half, masks=False, **kw)
        c1 = scale_rows(sc[:, :, :, 0], of_blocks(w.out_of, slice(0, None, 2)))
        b2 = scale_rows(sb[:, :, :, 1], of_blocks(w.into, slice(1, None, 2)))
        state = c1.transpose(-1, -2) @ sv[:, :, :, 0]  # (batch, H, segs, r, d)
        out.view(batch, heads, size // seg, 2, half, d)[:, :, :, 1] += b2 @ state
        half = seg
    return out[:, :, :n]
