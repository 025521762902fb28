"""B, C and V from one fused projection, as views, with a backward that does not concatenate.

A model that projects x once, ``y = x @ W`` with ``W`` of ``heads·(2r + d)`` columns, and slices y
into B, C and V hands the operator three strided views of one tensor. Through ``split``, ``view``
and ``transpose`` autograd assembles y's gradient with a concatenation: one more pass over every
gradient, and a slow one (PyTorch's concatenation of strided slices: 3.0 ms for the 1.6 GB of a
b8 × 32 heads × 8192 × (128 + 128 + 128) projection on an H200, where the operator's whole
forward and backward take 1.9, notes/gates.md). The operator writes the three gradients into
one buffer laid out as y (eager calls with all three needing grad:
:func:`leetrepro.ops.gradient_buffers`), and the node here (:class:`_Views`) hands that buffer
on as y's gradient, no copy. :func:`split_projection` cuts y through it;
:func:`rejoined` puts any such views through it (the API does, in eager mode), however the
model cut them. Anything else (a frozen part, gradients summed from another use,
``torch.compile``, which fuses the concatenation itself) takes the ordinary path.
"""
from __future__ import annotations

import operator

import torch

from ._direct import apply, wrapped
from .ops import one_buffer


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
    views = _views(y, heads, r, d)
    if torch.compiler.is_compiling() or not (torch.is_grad_enabled() and y.requires_grad):
        return views
    return apply(_Views, y, tuple(_geometry(t) for t in views))


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


def rejoined(B: torch.Tensor, C: torch.Tensor, V: torch.Tensor) -> tuple:
    """``(B, C, V)`` as given, or the same views made again from their common base through
    :class:`_Views` where the operator's gradients, written into one buffer, can be that base's
    gradient as they are: all three views (not leaves) that need grad, of one plain tensor that
    needs grad, disjoint and covering its storage exactly (:func:`leetrepro.ops.one_buffer`: the
    slices of one fused projection, cut by ``split``, ``chunk``, indexing, ``view`` and
    ``transpose`` in any order). The base's gradient is then what autograd's path through the
    views would give (each element's gradient where the views put it), without its
    concatenation. For eager calls with gradients (the API's); O(1)."""
    base = B._base
    if base is None or C._base is not base or V._base is not base or \
            type(base) is not torch.Tensor or not base.requires_grad or wrapped(base) or \
            base.device.type == "meta" or \
            not all(t.requires_grad and t.grad_fn is not None for t in (B, C, V)) or \
            base.numel() * base.element_size() != base.untyped_storage().nbytes():
        return B, C, V
    if not one_buffer(B, C, V):
        return B, C, V
    return apply(_Views, base, (_geometry(B), _geometry(C), _geometry(V)))


def _geometry(t: torch.Tensor) -> tuple:
    return tuple(t.shape), t.stride(), t.storage_offset()


class _Views(torch.autograd.Function):
    """Views of y, each ``(shape, strides, storage offset)`` in y's storage. Backward: where the
    views' gradients are views of one buffer at those same places (the operator's shared
    gradient buffer), that buffer laid out as y is y's gradient, with no copy; else a zero
    gradient with each view's gradient copied in where the view lies."""

    @staticmethod
    def forward(ctx, y, geometry):
        ctx.layout = _geometry(y)
        ctx.geometry = geometry
        return tuple(y.as_strided(*g) for g in geometry)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, *grads):
        given = [x for x in grads if x is not None]
        if len(given) == len(grads):
            ptr = grads[0].untyped_storage().data_ptr()
            if all(x.untyped_storage().data_ptr() == ptr and _geometry(x) == where
                   for x, where in zip(grads, ctx.geometry)):
                # the operator wrote the views' gradients into one buffer laid out as y: it is
                # y's gradient
                return grads[0].as_strided(*ctx.layout), None
        # (a zero buffer over the span of y's storage that y covers, y and the views placed
        # in it as in that storage)
        shape, stride, first = ctx.layout
        span = 0 if 0 in shape else 1 + sum((n - 1) * s for n, s in zip(shape, stride))
        flat = given[0].new_zeros(span)
        for x, (x_shape, x_stride, offset) in zip(grads, ctx.geometry):
            if x is not None:
                flat.as_strided(x_shape, x_stride, offset - first).copy_(x)
        return flat.as_strided(shape, stride, 0), None
