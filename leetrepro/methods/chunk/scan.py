"""Chunk's entries: :func:`chunk_scan` (the registered method: checks, then its launch plan) and
:func:`chunk_state` (the final state alone, one pass over C and V).
"""
from __future__ import annotations


import torch

from ..._groups import lane_heads
from ...registry import GPU_DTYPES, register
from .._gpu import (NoTriton, cdiv, dot_precision, refuse_interpreted_bf16, rows_contiguous,
                    staged_state, strided)

from . import plans, tables

try:
    from ...kernels import _tiles as tiles, chunk_state as state_kernels
except ImportError as err:  # without Triton: a clear error when a kernel is called
    tiles = state_kernels = NoTriton(err)


@register("chunk-scan", "Chunk", complexity="O(N·(L·(r+d) + r·d))", language="triton",
          dtypes=GPU_DTYPES, devices=("cuda",), state=True, reverse=True, dual=True, varlen=True,
          scale=True, out=True, decays=("per_head", "per_token"), groups=True,
          summary="Triton: LA's chunked form, whole r×d state on chip; at batch 1 segment states "
                  "chained through a ring so every SM works; state in/out; reverse time",
          options={"fp32_precision": "tf32", "segment": None, "kernel": "auto", "config": None,
                   "gate_grad": "auto", "gate_grad_precision": "tf32x3"})
def chunk_scan(B, C, V, gamma, fp32_precision: str | None = None, segment: int | None = None,
               initial_state: torch.Tensor | None = None, output_final_state: bool = False,
               reverse: bool = False, dual: torch.Tensor | None = None,
               cu_seqlens: torch.Tensor | None = None, scale: float = 1.0, kernel: str = "auto",
               config: dict | None = None, out: torch.Tensor | None = None,
               out2: torch.Tensor | None = None, g: torch.Tensor | None = None,
               gate_pieces: tuple | None = None, gate_grad: str = "auto",
               gate_grad_precision: str | None = None, rows: tuple | None = None,
               norm: tuple | None = None, offsets: tuple | None = None):
    """Chunk-scan. Shapes and gamma as in :func:`leetrepro.causal_linear_decoder`; fp16, bf16, fp32.

    ``fp32_precision``: ``"tf32"`` (default, ≤ 5e-3), ``"tf32x3"`` (meets the fp32 contract) or
    ``"ieee"``. ``segment``: rows per segment (default :func:`segment_rows`; a multiple of BLOCK_N).
    ``initial_state``/``output_final_state``: see the module docstring. ``reverse``: the operator
    on the rows read backwards (the backward pass's dV and dC), no copies. ``dual``: a tensor E
    shaped like V; O becomes the pair (op(B, C, V), op(E, V, C)), both from one sweep (the second's
    state is the first's transposed): the backward's dV and dC together. Needs the whole state in
    one lane (r·d ≤ 128·128). ``cu_seqlens``: int32/int64 offsets of sequences packed along N of a
    batch of one, each with its own state (``initial_state``/final state ``(sequences, heads, r, d)``).

    Layouts: B, C, V (and ``dual``) are read in place in any layout whose last dimension is
    contiguous (time-major views, a fused projection's slices). O comes out dense in V's
    dimension order, the dual output in B's; ``out``/``out2``: tensors to write them into
    instead, any such layout (the backward writes each gradient in its input's layout).
    ``scale`` multiplies O (and the dual output) as it is stored. ``g``: per-token gates
    ``(batch, heads, N)`` float32, any strides, γ folded in (gamma None; :func:`leetrepro.ops.run`
    folds them and shifts them for reverse time): the portable kernel computes them.

    ``kernel``: ``"portable"`` (the Triton kernel, any GPU), ``"hopper"`` (the warp-specialised sm_90
    kernel, ``kernels/chunk_hopper.py``: fp16/bf16, and fp32 through tf32, r and d each 64, 128
    or 256, forward, reverse and dual (r = d ≤ 128; elsewhere ``dual`` runs as two of its
    sweeps), one pass per lane or segments; a ValueError naming what rules it out elsewhere,
    :func:`hopper_operand_unfit`) or ``"auto"`` (the Hopper kernel where :func:`hopper_wins`
    says it was measured faster on this GPU, else the portable one).

    ``config``: launch settings replacing the measured table's (:func:`chunk_config`), for sweeps.
    ``gate_grad`` (the backward with per-token gates): where the gates' gradient comes from.
    ``"auto"``: from the sweeps' pieces (one kernel fewer, no workspace beyond a float per row;
    in fp16/bf16 two more 16-bit products a chunk keep dg within 1.3× of the straddle kernel's
    error), except at fp32 and past ``ops.PIECES_MAX_WIDTH``: there the straddle kernel
    (:func:`gate_gradient`), as ``"straddle"`` asks always; ``"sweeps"``: the pieces always.
    ``gate_grad_precision``: the straddle kernel's fp32 products (default ``"tf32x3"``).
    ``rows``: ``(w, D)`` (a gated forward sweep): O = scale·op(B, C, w·V) + D·V, w float32
    ``(batch, heads, N)``, D float32 ``(heads,)`` (Mamba-2's dt and skip); ``(w, D, RD)``: its
    backward's reverse sweep, ``dual`` = x (``kernels/chunk_scan``).

    ``gate_pieces``: ``(W, rows, totals)`` (a gated backward sweep, the portable kernel): W,
    shaped like O (None with ``dual``, whose E serves), the row vectors whose dots make the gates'
    gradient's pieces, written into ``rows`` and ``totals`` (:func:`gate_piece_buffers`,
    :func:`gate_gradient_from_pieces`). ``norm``: ``(c, eps, den)``: normalised linear attention
    in the sweep (γ = 1, nothing else above; :func:`hopper_norm_unfit`), O_i = Σ_{j≤i} (B_i·C_j
    + c) V_j / (Σ_{j≤i} (B_i·C_j + c) + eps), its denominators into ``den`` (float32,
    contiguous). ``offsets``: O_i = Σ_{j≤i} (B_i·C_j + α_i β_j) V_j (:func:`_checked_offsets`).
    """
    # each tensor in its own layout (strides): only a last dimension not contiguous is copied
    B, C, V, dual = (rows_contiguous(t) for t in (B, C, V, dual))
    # O in V's dimension order, dense (time-major V: time-major O, the caller's reshape a
    # view); the dual output in B's; a head each (where V or B holds groups, dense head-major)
    if B.shape[1] == V.shape[1] == C.shape[1]:
        out = torch.empty_like(V) if out is None else out
        out2 = None if dual is None else (torch.empty_like(B) if out2 is None else out2)
    else:  # (groups)
        heads = lane_heads(B, C, V, dual)
        out = per_head_like(V, heads) if out is None else out
        out2 = None if dual is None else (per_head_like(B, heads) if out2 is None else out2)
    tensors = tables.Operands(B=B, C=C, V=V, O=out, E=dual, O2=out2,
                              S0=staged_state(initial_state, B), GAMMA=gamma, CU=cu_seqlens,
                              G=None if g is None else g.to(torch.float32), ROWS=rows, NORM=norm,
                              OFFSETS=None if offsets is None else
                              _checked_offsets(offsets, V, dual))
    if gate_pieces is not None:
        w, rows, totals = gate_pieces
        tensors = tensors._replace(E=dual if dual is not None else rows_contiguous(w),
                                   DG=(rows, totals))
    plan = plans.launch_plan(tensors, fp32_precision=fp32_precision, segment=segment, config=config,
                             output_final_state=output_final_state, reverse=reverse, kernel=kernel)
    sn = plan.run(tensors, float(scale))
    if dual is not None:
        out = (out, out2)
    return (out, sn) if output_final_state else out


def _checked_offsets(offsets: tuple, V: torch.Tensor, dual) -> tuple:
    """:func:`chunk_scan`'s ``offsets``, a ValueError naming what is wrong. They are op(B', C',
    V) for B' = [B, α], C' = [C, β]: ``("rows", c, None)`` α = c, β = 1; ``("rows", c, x)`` α =
    x, β = 1; ``("cols", c, x)`` α = 1, β = x (x float32 ``(batch, heads, N)`` contiguous, c a
    float), in either direction of time; with ``dual``, ``("dual", c, x)``: O with the constant
    c, the dual output with the columns' x. The normaliser's gradients in the backward's sweeps
    (:mod:`leetrepro.methods.normalizer`). The Hopper kernel where it takes the call (bf16, d =
    128, :func:`hopper_norm_unfit`; the dual in one sweep), else the portable one, one segment
    a lane (the dual as two sweeps, :func:`_offset_halves`)."""
    kind, c, x = offsets
    if kind not in ("rows", "cols", "dual") or (kind != "rows" and x is None) or \
            (kind == "dual") != (dual is not None):
        raise ValueError(f"offsets must be ('rows', c, x or None) or ('cols', c, x), or with "
                         f"dual ('dual', c, x); got {offsets!r}"
                         f"{' with dual' if dual is not None else ''}")
    if x is not None and (x.dtype != torch.float32 or tuple(x.shape) != tuple(V.shape[:3]) or
                          not x.is_contiguous() or x.device != V.device):
        raise ValueError(f"offsets' x must be float32 (batch, heads, N) = {tuple(V.shape[:3])}, "
                         f"contiguous, on V's device; got {x.dtype} {tuple(x.shape)}")
    return kind, float(c), x


def per_head_like(x: torch.Tensor, heads: int) -> torch.Tensor:
    """An uninitialised output for each of ``heads`` lanes, shaped like x otherwise: like x
    (``torch.empty_like``, x's dimension order) where x has a head a lane, else dense."""
    if x.shape[1] == heads:
        return torch.empty_like(x)
    return x.new_empty(x.shape[0], heads, *x.shape[2:])


def chunk_state(C: torch.Tensor, V: torch.Tensor, gamma: torch.Tensor | None, *,
                reverse: bool = False, fp32_precision: str | None = None,
                segment: int | None = None, g: torch.Tensor | None = None) -> torch.Tensor:
    """The state the rows add, without the outputs: ``Σ_j λ^(N-1-j) c_jᵀ v_j`` (``reverse``: the rows
    read backwards, ``Σ_j λ^j c_jᵀ v_j``), float32 ``(batch, heads, r, d)``; C ``(batch, heads or
    groups, N, r)`` (groups read in place by each of their heads),
    V ``(batch, heads, N, d)``, fp16/bf16/fp32 on a GPU, gamma None or float64 ``(H,)``; ``g``:
    per-token gates ``(batch, heads, N)`` instead (γ folded in, read at each row: in reverse the
    caller shifts them), the weights exp of the gates' sum after each row in reading order.

    Reads C and V once, in place in any layout whose last dimension is contiguous
    (``kernels/chunk_state.py``); N is cut into segments as Chunk cuts it, and
    the segments' sums are weighted by λ^(N - end) (or their gates after them) and added in a
    fixed order (``segment``: rows per segment, a multiple of the row block; default as
    Chunk's). O(N·r·d) time, O(segments·batch·heads·r·d) workspace."""
    refuse_interpreted_bf16(V.dtype, "chunk_state")
    batch, groups, n, r = C.shape
    heads, d = V.shape[1], V.shape[-1]
    if n == 0 or C.numel() == 0 or V.numel() == 0:
        return V.new_zeros(batch, heads, r, d, dtype=torch.float32)
    C, V = rows_contiguous(C), rows_contiguous(V)  # any other layout read in place
    g = None if g is None else g.to(torch.float32)
    precision = dot_precision(V.dtype, fp32_precision)
    cfg = tables.chunk_config(r, d, V.dtype, precision, gamma is not None, device=V.device)
    lanes, segment = tables._lanes_and_segment(cfg, batch, heads, n, d, segment, V.device)
    n_db = cdiv(d, cfg["BLOCK_D"])
    n_seg = cdiv(n, segment)
    ws = torch.empty(lanes, n_seg, cfg["BLOCK_R"], cfg["BLOCK_D"], dtype=torch.float32,
                     device=V.device)
    state_kernels.chunk_state_kernel[(lanes, n_seg)](
        C=strided(C), V=strided(V), P=ws, DECAY=(gamma, strided(g)),
        SIZE=(n, r, d, heads, segment),
        K=tiles.constants(cfg, HAS_DECAY=gamma is not None, REVERSE=reverse, PRECISION=precision,
                          HAS_GATE=g is not None, GROUPS=(1, heads // groups, 1, 1)),
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    ws = ws.view(batch, heads, n_db, n_seg, cfg["BLOCK_R"], cfg["BLOCK_D"])
    if g is not None:  # each segment decays by the gates after it, in reading order
        read = g.flip(-1) if reverse else g
        totals = torch.nn.functional.pad(read, (0, n_seg * segment - n)).view(
            batch, heads, n_seg, segment).sum(-1)
        after = totals.flip(-1).cumsum(-1).flip(-1) - totals
        s = torch.einsum("bhksrd,bhs->bhkrd", ws, torch.exp(after))
    elif gamma is None:
        s = ws.sum(3)
    else:
        ends = torch.clamp(torch.arange(1, n_seg + 1, device=V.device) * segment, max=n)
        w = torch.exp((n - ends).to(torch.float64)[None, :] * torch.log(gamma.to(torch.float64))[:, None])
        s = torch.einsum("bhksrd,hs->bhkrd", ws, w.to(torch.float32))
    # (batch, heads, d blocks, BLOCK_R, BLOCK_D) -> (batch, heads, r, d)
    return s.permute(0, 1, 3, 2, 4).reshape(batch, heads, cfg["BLOCK_R"], -1)[:, :, :r, :d].contiguous()
