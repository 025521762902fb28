"""Mamba-2's per-row passes around the operator (``V' = dt·x`` and ``y = o + D·x``, with their
gradients), one pass each over x-sized tensors in any layout whose last dimension is contiguous.

PyTorch's products of a strided slice of a fused projection with a per-row factor, and the
gradients autograd makes of them (dV'·dt, x·dV' then its sum, dy·D, x·dy then its sum, and the
sum of the two dx), are each a pass of their own on a generic (not vectorised) elementwise
kernel; inside a Mamba-2 block they cost more than the operator's kernels. Here each direction
is one launch of ``kernels/ssd_rows.py`` on a GPU, and the same expressions in PyTorch
elsewhere. Shapes: x ``(batch, seqlen, heads, headdim)``, dt ``(batch, seqlen, heads)`` float32,
D ``(heads,)``.
"""
from __future__ import annotations

import os

import torch

from ._gpu import NoTriton, cdiv, launch, next_pow2, rows_contiguous, strided

try:
    from ..kernels import ssd_rows as row_kernels
except ImportError as err:  # without Triton: PyTorch's expressions
    row_kernels = NoTriton(err)


def _on_kernel(x: torch.Tensor) -> bool:
    """Whether the pass runs on the Triton kernel: a CUDA tensor, or Triton's interpreter
    asked for by name (``LEETREPRO_ROWS_KERNEL=1`` beside ``TRITON_INTERPRET=1``: the CPU
    tests), never by default on a CPU, where PyTorch's passes are as fast."""
    if isinstance(row_kernels, NoTriton):
        return False
    return x.is_cuda or (os.environ.get("TRITON_INTERPRET") == "1"
                         and os.environ.get("LEETREPRO_ROWS_KERNEL") == "1")


@torch.library.custom_op("leetrepro::ssd_rows", mutates_args=())
def ssd_rows(x: torch.Tensor, w: torch.Tensor, y: torch.Tensor | None, add: torch.Tensor | None,
             want_dw: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``(add + (y or x)·w, Σ_d x·y)``: the first in x's dtype, contiguous ``(batch, seqlen,
    heads, headdim)``, w (float32 ``(batch, seqlen, heads)``, any strides, 0 for a per-head
    factor) rounded to x's dtype; the second float32 ``(batch, seqlen, heads)`` with
    ``want_dw`` (empty without)."""
    batch, n, heads, d = x.shape
    if not _on_kernel(x) or x.numel() == 0:
        out = (x if y is None else y) * w.to(x.dtype)[..., None]
        out = (out if add is None else add + out).to(x.dtype).contiguous()
        dw = (x.float() * y.float()).sum(-1) if want_dw else x.new_empty(0, dtype=torch.float32)
        return out, dw
    x, y, add = (rows_contiguous(t) for t in (x, y, add))
    rows = batch * n * heads
    out = torch.empty(batch, n, heads, d, dtype=x.dtype, device=x.device)
    dw = torch.empty(batch, n, heads, dtype=torch.float32, device=x.device) if want_dw else \
        x.new_empty(0, dtype=torch.float32)
    block_d = next_pow2(d)
    block_t = max(1, 4096 // block_d)
    launch(row_kernels.axpy_rows, (cdiv(rows, block_t),),
           # (strided: the (batch, seqlen, heads) strides, as the kernels' (batch, heads, N))
           dict(X=strided(x), Y=strided(y), A=strided(add), W=strided(w.float()), OUT=out, DW=dw,
                SIZE=(rows, n, heads, d), BLOCK_T=block_t, BLOCK_D=block_d, HAS_Y=y is not None,
                HAS_A=add is not None, HAS_DW=want_dw), num_warps=4)
    return out, dw


@ssd_rows.register_fake
def _(x, w, y, add, want_dw):
    batch, n, heads, d = x.shape
    return (x.new_empty(batch, n, heads, d),
            x.new_empty((batch, n, heads) if want_dw else (0,), dtype=torch.float32))


class _ScaleRows(torch.autograd.Function):
    """V' = dt·x; backward dx = dt·dV' and ddt = Σ_d x·dV' in one pass. With ``alias``, x is a
    second output (a view), whose gradient (the skip's D·dy) is added to dx in that same pass:
    autograd would otherwise sum the two dx in a pass of its own (read two, write one)."""

    @staticmethod
    def forward(ctx, x, dt, alias):
        ctx.save_for_backward(x, dt)
        v = ssd_rows(x, dt, None, None, False)[0]
        return (v, x.view_as(x)) if alias else v

    @staticmethod
    def backward(ctx, dv, dx_other=None):
        x, dt = ctx.saved_tensors
        dx, ddt = ssd_rows(x, dt, dv, dx_other, ctx.needs_input_grad[1])
        return (dx if ctx.needs_input_grad[0] else None,
                ddt if ctx.needs_input_grad[1] else None, None)


class _Skip(torch.autograd.Function):
    """y = o + D·x (D per head); backward do = dy, dx = D·dy and dD = Σ x·dy in one pass."""

    @staticmethod
    def forward(ctx, o, x, D):
        w = D.float()[None, None].expand(x.shape[0], x.shape[1], -1)
        ctx.save_for_backward(x, w)
        return ssd_rows(x, w, None, o, False)[0]

    @staticmethod
    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        want_dD = ctx.needs_input_grad[2]
        if ctx.needs_input_grad[1] or want_dD:
            dx, dw = ssd_rows(x, w, dy, None, want_dD)
        return (dy if ctx.needs_input_grad[0] else None,
                dx if ctx.needs_input_grad[1] else None,
                dw.sum((0, 1)) if want_dD else None)


def scale_rows(x: torch.Tensor, dt: torch.Tensor) -> torch.Tensor:
    """``x · dt[..., None]`` (dt rounded to x's dtype), contiguous; differentiable in both."""
    return _ScaleRows.apply(x, dt, False)


def scale_rows_and_alias(x: torch.Tensor, dt: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(scale_rows(x, dt), x')``, x' a view of x to use in x's other place (the skip
    :func:`skip_rows`): x's two gradients are then summed in the pass that makes dt·dV', not in
    a pass of their own."""
    return _ScaleRows.apply(x, dt, True)


def skip_rows(o: torch.Tensor, x: torch.Tensor, D: torch.Tensor) -> torch.Tensor:
    """``o + D[:, None]·x`` in x's dtype, contiguous, for D ``(heads,)``; differentiable in all
    three. D ``(heads, headdim)`` takes PyTorch's ``addcmul``."""
    if D.dim() != 1:
        return torch.addcmul(o, D.to(o.dtype), x).to(x.dtype)
    return _Skip.apply(o, x, D)
