"""Heads in groups: B and C may hold ``(batch, groups, N, r)`` with groups dividing V's heads, head h
reading group ``h // (heads / groups)`` (Mamba-2's grouped B and C, grouped-query attention).
Methods with ``Method.groups`` read them in place; others get them expanded, and their gradients
summed back over each group's heads."""
from __future__ import annotations

import torch


def lane_heads(*tensors) -> int:
    """The heads of a call whose tensors ``(batch, heads or groups, …)`` may hold groups (a head
    shared by heads/groups lanes): the most any has (None ignored)."""
    return max(t.shape[1] for t in tensors if t is not None)


def expand_groups(x: torch.Tensor | None, heads: int) -> torch.Tensor | None:
    """x ``(batch, groups, …)`` with a head each: group g repeated for heads g·k … g·k + k − 1
    (k = heads / groups), a copy; x itself where it has a head each (or is None)."""
    if x is None or x.shape[1] == heads:
        return x
    return x.repeat_interleave(heads // x.shape[1], 1)


def sum_groups(x: torch.Tensor, groups: int) -> torch.Tensor:
    """The adjoint of :func:`expand_groups`: x ``(batch, heads, …)`` summed over each group's
    heads to ``(batch, groups, …)``, accumulated in float32 (or float64 for float64) and
    returned in x's dtype; x itself where it has a head a group."""
    if x.shape[1] == groups:
        return x
    wide = torch.float64 if x.dtype == torch.float64 else torch.float32
    return x.unflatten(1, (groups, -1)).sum(2, dtype=wide).to(x.dtype)
