"""Generation in the paper's two models: prompts prefilled packed (``cu_seqlens``), then one token
per step through :func:`leetrepro.decode_step` over a pool of states per layer, greedy, with the
embedding as the output head (tied weights: the models here are their first two layers).

``method`` chooses the prefill (a registered method, packed; ``"original"``: each prompt alone
through the model's own PyTorch attention, its final state by one matrix product) and the step
(``decode_step``; ``"original"``: the model's recurrent form in PyTorch, state in fp32).
"""
from __future__ import annotations

import torch

from .._state import final_state
from ..api import causal_linear_decoder
from ..decode import decode_step
from ._generative import Generative
from .transnormer import original_blockwise


def positions_of(cu_seqlens: torch.Tensor) -> torch.Tensor:
    """Each packed row's position inside its own sequence."""
    lengths = cu_seqlens[1:] - cu_seqlens[:-1]
    starts = torch.repeat_interleave(cu_seqlens[:-1].long(), lengths.long())
    return torch.arange(int(cu_seqlens[-1]), device=cu_seqlens.device) - starts


@torch.no_grad()
def prefill(model, ids: torch.Tensor, cu_seqlens: torch.Tensor, pools, slots: torch.Tensor,
            method: str = "auto"):
    """Packed prompts ``ids (1, total)`` through ``model``; their final states into ``pools`` at
    ``slots``; returns each prompt's first generated token ``(prompts,)``."""
    pos = positions_of(cu_seqlens)
    bounds = cu_seqlens.tolist()
    idx = slots.long()

    def attend_for(i):
        def attend(q, k, v, gamma):
            if method == "original":
                return _original_prefill(q, k, v, gamma, bounds, pools[i], idx)
            o, s = causal_linear_decoder(q, k, v, gamma, method=method, cu_seqlens=cu_seqlens,
                                         output_final_state=True)
            pools[i].index_copy_(0, idx, s.to(pools[i].dtype))
            return o
        return attend
    h = model.hidden(ids, attend_for, pos)
    last = cu_seqlens[1:].long() - 1
    return _greedy(model, h[0, last])


@torch.no_grad()
def decode(model, tokens: torch.Tensor, positions: torch.Tensor, pools, slots: torch.Tensor,
           method: str = "auto"):
    """One step: ``tokens (batch,)`` at ``positions (batch,)`` of the sequences in ``slots``;
    returns the next tokens. The pools are updated in place."""
    idx = slots.long()

    def attend_for(i):
        def attend(q, k, v, gamma):
            if method == "original":
                return _original_step(q, k, v, gamma, pools[i], idx)
            return decode_step(q, k, v, gamma, pools[i], slots)
        return attend
    h = model.hidden(tokens[:, None], attend_for, positions[:, None])
    return _greedy(model, h[:, 0])


def _greedy(model, h):
    return (h @ model.embed.weight.t()).argmax(-1)


def _original_prefill(q, k, v, gamma, bounds, pool, idx):
    """Each prompt alone through TransNormerLLM's own blockwise attention (RetNet's q arrives
    row-scaled, which makes its parallel form this same operator), its final state by one matrix
    product."""
    lg = torch.log(gamma.double()).view(-1, 1, 1)
    outs = []
    for j in range(len(bounds) - 1):
        rows = slice(bounds[j], bounds[j + 1])
        qj, kj, vj = q[:, :, rows], k[:, :, rows], v[:, :, rows]
        outs.append(original_blockwise(qj, kj, vj, gamma))
        pool[idx[j]] = final_state(kj.to(pool.dtype), vj.to(pool.dtype), lg.to(pool.dtype))[0]
    return torch.cat(outs, 2)


def _original_step(q, k, v, gamma, pool, idx):
    """The recurrent form in PyTorch: S ← λ S + kᵀ v, o = q S (state fp32)."""
    f = pool.dtype
    s = pool[idx] * gamma.to(f).view(1, -1, 1, 1) + k.to(f).transpose(-1, -2) @ v.to(f)
    pool[idx] = s
    return (q.to(f) @ s).to(v.dtype)


__all__ = ["Generative", "decode", "positions_of", "prefill"]
