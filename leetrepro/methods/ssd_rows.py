"""Mamba-2's per-row passes around the operator (``V' = dt·x`` and ``y = o + D·x``, with their
gradients), one pass each over x-sized tensors in any layout whose last dimension is contiguous.

PyTorch's products of a strided slice of a fused projection with a per-row factor, and the
gradients autograd makes of them (dV'·dt, x·dV' then its sum, dy·D, x·dy then its sum, and the
sum of the two dx), are each a pass of their own on a generic (not vectorised) elementwise
kernel; inside a Mamba-2 block they cost more than the operator's kernels. Here each direction
is one launch of ``kernels/ssd_rows.py`` on a GPU, and the same expressions in PyTorch
elsewhere. Shapes: x ``(batch, seqlen, heads, headdim)``, dt ``(batch, seqlen, heads)`` float32,
D ``(heads,)``. Before them the step sizes and the gates from dt's raw rows
(:func:`step_sizes_and_gates`), likewise one pass each way where PyTorch took about eight.
"""
from __future__ import annotations

import math

import torch

from .._direct import apply, direct, plain_backward
from ._gpu import NoTriton, cdiv, launch, next_pow2, on_row_kernels, rows_contiguous, strided

try:
    from ..kernels import ssd_rows as row_kernels
except ImportError as err:  # without Triton: PyTorch's expressions
    row_kernels = NoTriton(err)


def _on_kernel(x: torch.Tensor) -> bool:
    """Whether the pass runs on the Triton kernel (:func:`on_row_kernels`)."""
    return on_row_kernels(x, row_kernels)


#: the most heads a group for which :func:`sum_groups_like` launches its kernel. Up to 16 a
#: program sums its group's heads one after another (at Codestral's 8 groups of 16, about 0.2 ms
#: less than PyTorch's sum, cast and copy); past 16, only at a multiple of 8, it takes smaller row
#: blocks and issues 8 heads' loads at once: one after another, at Zamba2's one group of 80 heads
#: 256 programs each waited out 80 loads (282 µs for dB and dC against PyTorch's 105), unrolled
#: the SSD took 0.03 ms less than with PyTorch's sums there and 0.07 ms less at Falcon-H1's 64
#: (H200, bf16, graph, notes/gates.md). Other counts past 16: PyTorch's sums
GROUP_SUMS_MAX_HEADS = 128


def sum_groups_like(x: torch.Tensor, groups: int, like: torch.Tensor) -> torch.Tensor | None:
    """Each head's gradient x ``(batch, heads, N, r)`` (fp16/bf16/fp32, its last dimension
    contiguous) summed over each group's heads into a new tensor laid out as ``like``
    ``(batch, groups, N, r)`` (``torch.empty_like``: a time-major B's gradient is time-major), in
    x's dtype, the sums in float32 in head order: one launch of ``kernels/ssd_rows.py``'s
    ``group_sums`` where PyTorch took three passes (the sum in float32, its cast, the copy into
    like's layout). None where that kernel does not run (:func:`_on_kernel`; float64, a strided
    last dimension, more than :data:`GROUP_SUMS_MAX_HEADS` heads a group, or more than 16 and not
    a multiple of 8): the caller's PyTorch sums then. O(heads·N·r)."""
    if not _on_kernel(x) or x.dtype == torch.float64 or x.numel() == 0 or \
            x.shape[1] > groups * GROUP_SUMS_MAX_HEADS or \
            x.stride(-1) != 1 or like.stride(-1) != 1 or like.dtype != x.dtype:
        return None
    batch, heads, n, r = x.shape
    out = torch.empty_like(like)
    if out.stride(-1) != 1:
        return None
    block_r = next_pow2(r)
    per = heads // groups
    many = per > 16  # (past 16, more programs and their loads eight heads at a time)
    if many and per % 8:
        return None
    block_t = max(1, (1024 if many else 4096) // block_r)
    launch(row_kernels.group_sums, (batch * groups, cdiv(n, block_t)),
           dict(X=x, OUT=out, XS=tuple(x.stride()[:3]), OS=tuple(out.stride()[:3]),
                SIZE=(n, r, groups, per), BLOCK_T=block_t, BLOCK_R=block_r,
                UNROLL=8 if many else 1),
           num_warps=4)
    return out


@torch.library.custom_op("leetrepro::ssd_rows", mutates_args=())
def ssd_rows(x: torch.Tensor, w: torch.Tensor, y: torch.Tensor | None, add: torch.Tensor | None,
             want_dw: bool, w2: torch.Tensor | None = None, y2: torch.Tensor | None = None,
             want_dw2: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(add + (y or x)·w + y2·w2, Σ_d x·y, Σ_d x·y2)``: the first in x's dtype, contiguous
    ``(batch, seqlen, heads, headdim)``, w and w2 (float32 ``(batch, seqlen, heads)``, any
    strides, 0 for a per-head factor) unrounded (the sum in float32, or float64 for float64 x,
    rounded once to x's dtype), the y2 term only with y2 given; the others float32 ``(batch,
    seqlen, heads)`` with ``want_dw`` (``want_dw2``), empty without."""
    batch, n, heads, d = x.shape
    second = y2 is not None
    want_dw2 = second and want_dw2
    if not _on_kernel(x) or x.numel() == 0:
        acc = torch.promote_types(x.dtype, torch.float32)  # (float64 stays float64)
        out = (x if y is None else y).to(acc) * w.to(acc)[..., None]
        out = out if add is None else add.to(acc) + out
        if second:
            out = out + y2.to(acc) * w2.to(acc)[..., None]
        dw, dw2 = ((x.float() * t.float()).sum(-1) if want else x.new_empty(0, dtype=torch.float32)
                   for t, want in ((y, want_dw), (y2, want_dw2)))
        return out.to(x.dtype).contiguous(), dw, dw2
    x, y, add, y2 = (rows_contiguous(t) for t in (x, y, add, y2))
    rows = batch * n * heads
    out = torch.empty(batch, n, heads, d, dtype=x.dtype, device=x.device)
    dw, dw2 = (torch.empty(batch, n, heads, dtype=torch.float32, device=x.device) if want else
               x.new_empty(0, dtype=torch.float32) for want in (want_dw, want_dw2))
    block_d = next_pow2(d)
    block_t = max(1, 4096 // block_d)
    launch(row_kernels.axpy_rows, (cdiv(rows, block_t),),
           # (strided: the (batch, seqlen, heads) strides, as the kernels' (batch, heads, N))
           dict(X=strided(x), Y=strided(y), A=strided(add), W=strided(w.float()), OUT=out, DW=dw,
                SECOND=(strided(y2), strided(w2.float()), dw2) if second else (None, None, None),
                SIZE=(rows, n, heads, d), BLOCK_T=block_t, BLOCK_D=block_d, HAS_Y=y is not None,
                HAS_A=add is not None, HAS_DW=want_dw, HAS_Y2=second, HAS_DW2=want_dw2),
           num_warps=4)
    return out, dw, dw2


@ssd_rows.register_fake
def _(x, w, y, add, want_dw, w2=None, y2=None, want_dw2=False):
    batch, n, heads, d = x.shape
    return (x.new_empty(batch, n, heads, d),
            x.new_empty((batch, n, heads) if want_dw else (0,), dtype=torch.float32),
            x.new_empty((batch, n, heads) if y2 is not None and want_dw2 else (0,),
                        dtype=torch.float32))


_ssd_rows = direct(ssd_rows)  # (eager calls skip the dispatcher: leetrepro._direct)


def per_head(D: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """D ``(heads,)`` as a float32 per-row factor of x's ``(batch, seqlen, heads)`` rows
    (strides 0 over batch and seqlen)."""
    return D.float()[None, None].expand(x.shape[0], x.shape[1], -1)


def scaled(x: torch.Tensor, dt: torch.Tensor) -> torch.Tensor:
    """``x · dt[..., None]`` (in float32, rounded once to x's dtype), contiguous, one pass,
    outside autograd:
    :func:`scale_rows`' forward, and V' made again by a node that saved x and dt
    (``compat._SSDRowsInSweep``)."""
    return _ssd_rows(x, dt, None, None, False)[0]


def scale_and_skip_gradients(x, dt, D, dv, dy, want_ddt: bool, want_dD: bool) -> tuple:
    """``(dx, ddt, dD)`` of V' = dt·x and y = o + D·x (D ``(heads,)``) from dV' and dy, in one
    pass: dx = dt·dV' + D·dy, ddt = Σ_d x·dV' (float32, with ``want_ddt``) and dD = Σ x·dy over
    every row, in D's dtype (with ``want_dD``; else None)."""
    dx, ddt, dD = _ssd_rows(x, dt, dv, None, want_ddt, per_head(D, x), dy, want_dD)
    return dx, ddt, dD.sum((0, 1)).to(D.dtype) if want_dD else None


class _ScaleRows(torch.autograd.Function):
    """V' = dt·x; backward dx = dt·dV' and ddt = Σ_d x·dV' in one pass. With ``alias``, x is a
    second output (a view) for the skip, whose gradient is added to dx in that same pass:
    autograd would otherwise sum the two dx in a pass of their own (read two, write one). With
    ``D`` (heads,) too, that alias is only :class:`_SkipOnAlias`' and its gradient is the skip's
    dy itself: this pass makes dt·dV' + D·dy and D's rows Σ x·dy, and the skip's backward moves
    nothing (read x, dV', dy and write dx, where two passes read five tensors and wrote two)."""

    @staticmethod
    def forward(x, dt, alias, D):
        v = scaled(x, dt)
        return (v, x.view_as(x)) if alias else v

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, dt, _, D = inputs
        ctx.save_for_backward(x, dt, D)

    @staticmethod
    @plain_backward
    def backward(ctx, dv, d_alias=None):
        x, dt, D = ctx.saved_tensors
        want_dx, want_ddt = ctx.needs_input_grad[:2]
        want_dD = D is not None and ctx.needs_input_grad[3] and d_alias is not None
        if D is not None and d_alias is not None:
            dx, ddt, dD = scale_and_skip_gradients(x, dt, D, dv, d_alias, want_ddt, want_dD)
        else:
            dx, ddt, _ = _ssd_rows(x, dt, dv, d_alias, want_ddt)
            dD = None
        return dx if want_dx else None, ddt if want_ddt else None, None, dD


class _SkipOnAlias(torch.autograd.Function):
    """y = o + D·x' for the alias x' of :class:`_ScaleRows` with D: backward do = dy, and dy as
    x''s gradient, which that class's backward multiplies by D (and takes dD from)."""

    @staticmethod
    def forward(o, x_alias, D):
        return _ssd_rows(x_alias, per_head(D, x_alias), None, o, False)[0]

    @staticmethod
    def setup_context(ctx, inputs, output):
        pass

    @staticmethod
    def backward(ctx, dy):
        return dy, dy, None


class _Skip(torch.autograd.Function):
    """y = o + D·x (D per head); backward do = dy, dx = D·dy and dD = Σ x·dy in one pass."""

    @staticmethod
    def forward(o, x, D):
        return _ssd_rows(x, per_head(D, x), None, o, False)[0]

    @staticmethod
    def setup_context(ctx, inputs, output):
        _, x, D = inputs
        ctx.save_for_backward(x, D)

    @staticmethod
    @plain_backward
    def backward(ctx, dy):
        x, D = ctx.saved_tensors
        w = per_head(D, x)
        want_dD = ctx.needs_input_grad[2]
        if ctx.needs_input_grad[1] or want_dD:
            dx, dw, _ = _ssd_rows(x, w, dy, None, want_dD)
        return (dy if ctx.needs_input_grad[0] else None,
                dx if ctx.needs_input_grad[1] else None,
                dw.sum((0, 1)) if want_dD else None)


def scale_rows(x: torch.Tensor, dt: torch.Tensor) -> torch.Tensor:
    """``x · dt[..., None]`` (in float32, rounded once to x's dtype), contiguous; differentiable
    in both."""
    return apply(_ScaleRows, x, dt, False, None)


def scale_rows_and_alias(x: torch.Tensor, dt: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(scale_rows(x, dt), x')``, x' a view of x to use in x's other place (the skip
    :func:`skip_rows`): x's two gradients are then summed in the pass that makes dt·dV', not in
    a pass of their own."""
    return apply(_ScaleRows, x, dt, True, None)


def scale_rows_and_skip(x: torch.Tensor, dt: torch.Tensor, D: torch.Tensor) -> tuple:
    """``(V', skip)``: V' = ``scale_rows(x, dt)`` and ``skip(o)`` = :func:`skip_rows` ``(o, x,
    D)``, differentiable in x, dt, D and o, their backward one pass over x-sized tensors (x,
    dV', dy read, dx written: dt·dV' + D·dy, with dt's and D's gradients). D ``(heads,)``; a
    ``(heads, headdim)`` D takes :func:`scale_rows_and_alias` and PyTorch's ``addcmul``."""
    if D.dim() != 1:
        v, x_alias = scale_rows_and_alias(x, dt)
        return v, lambda o: skip_rows(o, x_alias, D)
    v, x_alias = apply(_ScaleRows, x, dt, True, D)
    return v, lambda o: apply(_SkipOnAlias, o, x_alias, D)


def skip_rows(o: torch.Tensor, x: torch.Tensor, D: torch.Tensor) -> torch.Tensor:
    """``o + D[:, None]·x`` in x's dtype, contiguous, for D ``(heads,)``; differentiable in all
    three. D ``(heads, headdim)`` takes PyTorch's ``addcmul``."""
    if D.dim() != 1:
        return torch.addcmul(o, D.to(o.dtype), x).to(x.dtype)
    return apply(_Skip, o, x, D)


def _limit(low: float, high: float) -> bool:
    return (low, high) != (0.0, math.inf)


@torch.library.custom_op("leetrepro::dt_gates", mutates_args=())
def dt_gates(raw: torch.Tensor, bias: torch.Tensor | None, A: torch.Tensor, softplus: bool,
             low: float, high: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(dt, g)``, float32 ``(batch, seqlen, heads)`` contiguous: dt = clamp(softplus(raw +
    bias), low, high) (softplus and the clamp where asked: ``softplus``, (low, high) ≠ (0,
    inf)), g = dt·A; raw ``(batch, seqlen, heads)`` any strides and float dtype, bias and A
    ``(heads,)``."""
    if not _on_kernel(raw) or raw.numel() == 0:
        dt = raw.to(torch.float32, copy=True) if bias is None else raw.float() + bias.float()
        dt = torch.nn.functional.softplus(dt) if softplus else dt
        dt = dt.clamp(low, high) if _limit(low, high) else dt
        return dt.contiguous(), (dt * A.float()).contiguous()
    batch, n, heads = raw.shape
    dt, g = (torch.empty(batch, n, heads, dtype=torch.float32, device=raw.device)
             for _ in range(2))
    block_h = next_pow2(heads)
    block_t = max(1, 4096 // block_h)
    launch(row_kernels.dt_gates, (cdiv(batch * n, block_t),),
           dict(RAW=raw, BIAS=bias, A=A, DT=dt, G=g, STRIDES=tuple(raw.stride()),
                SIZE=(batch * n, n, heads), LIMIT=(float(low), float(high)),
                K=row_kernels.DtConstants(BLOCK_T=block_t, BLOCK_H=block_h,
                                          HAS_BIAS=bias is not None, SOFTPLUS=softplus,
                                          HAS_LIMIT=_limit(low, high))), num_warps=4)
    return dt, g


@dt_gates.register_fake
def _(raw, bias, A, softplus, low, high):
    return tuple(raw.new_empty(raw.shape, dtype=torch.float32) for _ in range(2))


@torch.library.custom_op("leetrepro::dt_gates_backward", mutates_args=())
def dt_gates_backward(raw: torch.Tensor, bias: torch.Tensor | None, A: torch.Tensor,
                      ddt: torch.Tensor | None, dg: torch.Tensor | None, softplus: bool,
                      low: float, high: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`dt_gates`' backward from dt's gradient ``ddt`` and g's ``dg`` (float32, either may
    be None): ``(raw's gradient in raw's dtype, contiguous; bias's and A's, float32
    (heads,))``, the sums over rows per program of the kernel then over programs, in a fixed
    order."""
    batch, n, heads = raw.shape
    if not _on_kernel(raw) or raw.numel() == 0:
        pre = raw.float() if bias is None else raw.float() + bias.float()
        sp = torch.nn.functional.softplus(pre) if softplus else pre
        slope = torch.where(pre > 20, 1.0, torch.sigmoid(pre)) if softplus else 1.0
        dt = sp.clamp(low, high) if _limit(low, high) else sp
        grad = torch.zeros_like(pre) if ddt is None else ddt.float()
        if dg is not None:
            grad = grad + dg.float() * A.float()
        draw = grad * slope
        if _limit(low, high):
            draw = torch.where((sp >= low) & (sp <= high), draw, 0.0)
        da = (dg.float() * dt).sum((0, 1)) if dg is not None else pre.new_zeros(heads)
        return draw.to(raw.dtype).contiguous(), draw.sum((0, 1)), da
    block_h = next_pow2(heads)
    block_t = max(1, 4096 // block_h)
    programs = cdiv(batch * n, block_t)
    draw = torch.empty(batch, n, heads, dtype=raw.dtype, device=raw.device)
    parts = torch.empty(2, programs, heads, dtype=torch.float32, device=raw.device)
    zero = (0, 0, 0)
    launch(row_kernels.dt_gates_backward, (programs,),
           dict(RAW=raw, BIAS=bias, A=A, DDT=ddt, DG=dg, DRAW=draw, PARTS=parts,
                STRIDES=tuple(raw.stride()),
                GRAD_STRIDES=(tuple(ddt.stride()) if ddt is not None else zero) +
                (tuple(dg.stride()) if dg is not None else zero),
                SIZE=(batch * n, n, heads), LIMIT=(float(low), float(high)),
                K=row_kernels.DtConstants(BLOCK_T=block_t, BLOCK_H=block_h,
                                          HAS_BIAS=bias is not None, SOFTPLUS=softplus,
                                          HAS_LIMIT=_limit(low, high), HAS_DDT=ddt is not None,
                                          HAS_DG=dg is not None)),
           num_warps=4)
    return draw, parts[0].sum(0), parts[1].sum(0)  # (two tensors: outputs may not alias)


@dt_gates_backward.register_fake
def _(raw, bias, A, ddt, dg, softplus, low, high):
    heads = raw.shape[-1]
    return (raw.new_empty(raw.shape), raw.new_empty(heads, dtype=torch.float32),
            raw.new_empty(heads, dtype=torch.float32))


_dt_gates, _dt_gates_backward = direct(dt_gates), direct(dt_gates_backward)


class _StepSizes(torch.autograd.Function):
    """:func:`dt_gates` with its backward :func:`dt_gates_backward`."""

    @staticmethod
    def forward(raw, bias, A, softplus, low, high):
        return _dt_gates(raw, bias, A, softplus, low, high)

    @staticmethod
    def setup_context(ctx, inputs, output):
        raw, bias, A, *args = inputs
        ctx.save_for_backward(raw, bias, A)
        ctx.args = tuple(args)

    @staticmethod
    @plain_backward
    def backward(ctx, ddt, dg):
        raw, bias, A = ctx.saved_tensors
        need_raw, need_bias, need_a = ctx.needs_input_grad[:3]
        if not (need_raw or need_bias or need_a):
            return None, None, None, None, None, None
        draw, dbias, da = _dt_gates_backward(raw, bias, A, ddt, dg, *ctx.args)
        return (draw if need_raw else None, dbias.to(bias.dtype) if need_bias else None,
                da.to(A.dtype) if need_a else None, None, None, None)


def step_sizes_and_gates(dt: torch.Tensor, A: torch.Tensor, dt_bias: torch.Tensor | None = None,
                         softplus: bool = False, limit: tuple = (0.0, math.inf)) -> tuple:
    """Mamba-2's step sizes and gates from dt's raw rows ``(batch, seqlen, heads)``: ``(dt, g)``,
    float32 ``(batch, seqlen, heads)``, dt = clamp(softplus(dt + dt_bias), *limit) (each where
    asked for), g = dt·A; differentiable in dt, A and dt_bias (zero through the clamp where it
    acts, as PyTorch's). One pass each way on a GPU (:func:`dt_gates`), where PyTorch's
    composition took about four launches forward and eight back over these rows."""
    low, high = (float(v) for v in limit)
    return apply(_StepSizes, dt, dt_bias, A, bool(softplus), low, high)
