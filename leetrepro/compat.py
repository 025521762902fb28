"""Drop-in entry points for users of flash-linear-attention: swapping the import is the whole change.

    from fla.ops.simple_gla import chunk_simple_gla      # before
    from leetrepro import chunk_simple_gla               # after

Same signature, layout and conventions as flash-linear-attention's ``chunk_simple_gla`` (with a
per-head ``g_gamma``; the per-token gates ``g`` are a different operator and are refused), computed
by :func:`leetrepro.causal_linear_decoder` (``method="auto"``: Chunk on a GPU), differentiable.
"""
from __future__ import annotations

import torch

from ._inputs import memo_by_tensor
from .api import causal_linear_decoder

#: exp(g_gamma) per g_gamma tensor (and version), so that a model calling every layer with the
#: same g_gamma hands the operator the same gamma tensor (its checks are then cached: no host sync)
_DECAYS: dict = {}


def chunk_simple_gla(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     g: torch.Tensor | None = None, g_gamma: torch.Tensor | None = None,
                     scale: float | None = None, initial_state: torch.Tensor | None = None,
                     output_final_state: bool = False, cu_seqlens: torch.Tensor | None = None,
                     head_first: bool = False, **options):
    """flash-linear-attention's ``chunk_simple_gla``, computed by this project.

    Args:
        q, k: ``(batch, T, heads, K)``; v: ``(batch, T, heads, V)`` (``head_first=True``:
            ``(batch, heads, T, K)``). Read in place, whatever the layout, by the Chunk kernel.
        g: per-token log gates: not supported (a different operator); must be None.
        g_gamma: ``(heads,)`` log decay per head (λ = exp(g_gamma) in (0, 1]); None: no decay.
        scale: multiplies q·kᵀ; default ``K ** -0.5``. Applied as O is written (free).
        initial_state: ``(N, heads, K, V)``, N the batch or the number of packed sequences.
        output_final_state: also return the final state ``(N, heads, K, V)`` (float32).
        cu_seqlens: int32 offsets of sequences packed along T of a batch of one.
        **options: passed to :func:`leetrepro.causal_linear_decoder` (``method=``, …).

    Returns:
        ``(o, final_state)``: o in q's layout and v's dtype, final_state None unless asked for.
    """
    if g is not None:
        raise NotImplementedError(
            "chunk_simple_gla with per-token gates g is a different operator (gated linear "
            "attention); leetrepro computes the per-head decay g_gamma only")
    if scale is None:
        scale = q.shape[-1] ** -0.5
    gamma = None if g_gamma is None else _decay(g_gamma)
    if head_first:
        B, C, V = q, k, v
    else:
        B, C, V = (x.transpose(1, 2) for x in (q, k, v))
    res = causal_linear_decoder(B, C, V, gamma, initial_state=initial_state,
                                output_final_state=output_final_state, cu_seqlens=cu_seqlens,
                                scale=scale, **options)
    o, final = res if output_final_state else (res, None)
    return (o if head_first else o.transpose(1, 2)), final


def _decay(g_gamma: torch.Tensor) -> torch.Tensor:
    if not isinstance(g_gamma, torch.Tensor):
        return torch.exp(torch.as_tensor(g_gamma, dtype=torch.float64))
    if g_gamma.requires_grad:
        raise ValueError("g_gamma requires grad: the decays are fixed here (no gradient flows to "
                         "them); pass g_gamma.detach() or a buffer")
    return memo_by_tensor(_DECAYS, g_gamma, lambda t: torch.exp(t.detach().to(torch.float64)))
