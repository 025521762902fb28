"""B, C and V from one fused projection, as views, with a backward that does not concatenate.

A model that projects x once, ``y = x @ W`` with ``W`` of ``heads·(2r + d)`` columns, and slices y
into B, C and V hands the operator three strided views of one tensor. Through ``split``, ``view``
and ``transpose`` autograd assembles y's gradient with a concatenation: one more pass over every
gradient. :func:`split_projection` makes the same views, and its backward recognises the
gradients the operator wrote as views of one buffer laid out as y (eager calls with all three
needing grad: :func:`leetrepro.ops.gradient_buffers`): that buffer is y's gradient, no copy.
Anything else (a frozen part, gradients summed from another use, ``torch.compile``, which fuses
the concatenation itself) takes the ordinary path.
"""
from __future__ import annotations

import operator

import torch


def split_projection(y: torch.Tensor, heads: int, r: int, d: int | None = None):
    """``(B, C, V)`` views of a fused projection ``y`` ``(batch, N, heads·(2r + d))``, its last
    dimension laid out ``[B's heads | C's heads | V's heads]`` (``heads·r``, ``heads·r``,
    ``heads·d`` columns; ``d`` defaults to r): B, C ``(batch, heads, N, r)``, V
    ``(batch, heads, N, d)``, time-major strided views (no copy), as
    :func:`leetrepro.causal_linear_decoder` reads them in place.

    Differentiable; in eager mode, when the operator computes all three gradients, y's gradient
    is the buffer the operator wrote them into (no concatenation). O(1) time and memory."""
    if not isinstance(y, torch.Tensor):
        raise TypeError(f"y must be a torch.Tensor (batch, N, heads·(2r + d)), got {type(y).__name__}")
    heads, r = _count("heads", heads), _count("r", r)
    d = r if d is None else _count("d", d)
    if y.dim() != 3 or y.shape[-1] != heads * (2 * r + d):
        raise ValueError(f"y must be (batch, N, heads·(2r + d)) = (batch, N, {heads * (2 * r + d)})"
                         f" for heads={heads}, r={r}, d={d}; got {tuple(y.shape)}")
    if torch.compiler.is_compiling() or not (torch.is_grad_enabled() and y.requires_grad):
        return _views(y, heads, r, d)
    return _SplitProjection.apply(y, heads, r, d)


def _count(name: str, value) -> int:
    """A positive integer argument, or an error naming it."""
    try:
        if isinstance(value, bool):
            raise TypeError
        value = operator.index(value)  # ints, numpy's and torch's integers; never 2.0
    except TypeError:
        raise TypeError(f"{name} must be a positive int, got {value!r} "
                        f"({type(value).__name__})") from None
    if value < 1:
        raise ValueError(f"{name} must be a positive int, got {value}")
    return int(value)


def _views(y, heads, r, d):
    b, n, _ = y.shape
    parts = y.split([heads * r, heads * r, heads * d], dim=-1)
    return tuple(p.view(b, n, heads, w).transpose(1, 2) for p, w in zip(parts, (r, r, d)))


class _SplitProjection(torch.autograd.Function):
    @staticmethod
    def forward(ctx, y, heads, r, d):
        out = _views(y, heads, r, d)
        ctx.layout = (tuple(y.shape), y.stride(), y.storage_offset(),
                      tuple((t.stride(), t.storage_offset()) for t in out))
        ctx.dims = (heads, r, d)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dB, dC, dV):
        shape, stride, offset, views = ctx.layout
        grads = (dB, dC, dV)
        if all(g is not None for g in grads):
            ptr = dB.untyped_storage().data_ptr()
            if all(g.untyped_storage().data_ptr() == ptr and (g.stride(), g.storage_offset()) == v
                   for g, v in zip(grads, views)):
                # the operator wrote the three into one buffer laid out as y: it is y's gradient
                return dB.as_strided(shape, stride, offset), None, None, None
        heads, r, d = ctx.dims
        dy = next(g for g in grads if g is not None).new_zeros(shape)
        for part, g in zip(_views(dy, heads, r, d), grads):
            if g is not None:
                part.copy_(g)
        return dy, None, None, None
