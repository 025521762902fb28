"""Chunk-scan (Chunk): this project's kernel for the operator, lightningAttention-2's chunked form
made single-pass for every batch size (design and measurements in NOTES.md).

For chunks of L rows with state H (r × d, fp32) entering chunk [s, s+L):
    O_[s:s+L] = (B C ᵀ ⊙ M)_chunk V_chunk + diag(λ^1..λ^L) B_chunk H,
    H ← λ^L H + (diag(λ^(L-1)..λ^0) C_chunk)ᵀ V_chunk.
At batch·heads too small to fill the GPU, each head's N rows are split into segments whose states
are chained through a two-slot ring buffer (``kernels/chunk_scan.py``): B, V, O once and C, V twice
(segments short enough for the second read to hit L2 measured slower on the H100: their
pipelines are too short; NOTES.md). At batch·heads ≥ 2 × SMs: one pass, exactly the four tensors.
Time O(N·(L·(r+d) + r·d)); extra memory O(batch·heads·r·d) (the ring, two states per lane).

State in and out (for prompts processed in pieces and for generation): ``initial_state`` S0
``(batch, heads, r, d)`` and ``output_final_state=True`` returning ``(O, S_N)`` (S_N in float32) with
    S_N = λ^N S0 + Σ_j λ^(N-1-j) c_jᵀ v_j,   O_i += λ^(i+1) b_i S0,
the convention of RetNet's recurrent form and flash-linear-attention (S_t = λ S_{t-1} + c_tᵀ v_t,
o_t = b_t S_t), so running two halves with the state passed on equals running the whole.
"""
from __future__ import annotations

import functools
import itertools
import os
import typing

import torch

from .._device import persistent
from .._groups import lane_heads
from ..registry import GPU_DTYPES, on_change, register
from .. import tuning
from ..tuning import CHUNK_TABLE, DUAL_TABLE, HOPPER
from ._gpu import (NoTriton, cdiv, dot_precision, gpu_tag, launch, next_pow2,
                   refuse_interpreted_bf16, rows_contiguous, rows_for_pieces, segment_rows,
                   sm_count, staged_state, strided, wave_pieces)

try:
    from triton.runtime.errors import OutOfResources

    from ..kernels import (_tiles as tiles, chunk_scan as scan_kernels,
                           chunk_state as state_kernels, gate_rows as rows_kernels,
                           gate_straddle as straddle_kernels)
except ImportError as err:  # without Triton: a clear error when a kernel is called
    tiles = scan_kernels = state_kernels = straddle_kernels = rows_kernels = NoTriton(err)
    OutOfResources = NoTriton.Error
#: whether Triton (and so the portable kernels) imported
HAS_TRITON = not isinstance(straddle_kernels, NoTriton)
try:
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from ..kernels import chunk_hopper as hopper_kernels
except ImportError as err:  # (a Triton without Gluon's Hopper modules: the portable kernel only)
    hopper_kernels = TensorDescriptor = NoTriton(err)

def operand_kind(dtype: torch.dtype, precision: str) -> str:
    """``"half"`` (fp16/bf16), ``"tf32"`` or ``"exact"`` (fp32 with tf32x3 or ieee dots)."""
    if dtype != torch.float32:
        return "half"
    return "tf32" if precision == "tf32" else "exact"


def tuned_table(device) -> dict:
    """``{(kind, decay): (BLOCK_N, stages)}`` measured on the GPU of ``device``
    (``data/<gpu>/chunk_config.csv``), or {} where that GPU has none."""
    return tuning.launch_table(device, "chunk_config.csv", ("block_n", "stages"))


def chunk_config(r: int, d: int, dtype: torch.dtype, precision: str, decay: bool,
                 dual: bool = False, device=None, config: dict | None = None) -> dict:
    """Tile sizes: the whole r × d state on chip when it fits (r·d ≤ 128·128), else column blocks
    (which re-read B and C once per block); rows and stages from the table measured on this GPU
    (:func:`tuned_table`), else :data:`leetrepro.tuning.CHUNK_TABLE` (``DUAL_TABLE`` for the
    dual sweep).
    ``config``: entries that replace those (``BLOCK_N``, ``num_warps``, ``num_stages``,
    ``segment``; the sweeps of ``make tune`` pass them as :func:`chunk_scan`'s option), and the
    Hopper kernel's ``DC`` (:func:`hopper_split`)."""
    cfg = dict(_config(r, d, dtype, precision, decay, dual,
                       None if device is None else torch.device(device)))
    return cfg | (config or {})


def block_d(r: int, d: int) -> int:
    """The portable kernel's value columns per lane: all of d while the r × d state fits one
    program (r·d ≤ 128·128), else blocks of 16384 / r (its lanes are (batch·head, block))."""
    return min(next_pow2(d), max(16, 16384 // next_pow2(r)))


#: the widest block of value columns a sweep carrying the gates' gradient's pieces takes: a
#: 64-row sweep over 256 columns in one program spills 3.7 KB a thread beside the pieces' rows
#: (sm_90, ``probes.regs``), over 128 of them 0.8 KB, as the 128-column sweeps do
PIECE_COLS = 128


def piece_cols(r: int, d: int) -> int:
    """The value columns per lane of a sweep carrying the pieces (r-wide rows, d columns):
    :func:`block_d`, at most :data:`PIECE_COLS`."""
    return min(block_d(r, d), PIECE_COLS)


@functools.lru_cache(maxsize=1024)
def _config(r, d, dtype, precision, decay, dual, device) -> tuple:
    block_r, cols = next_pow2(r), block_d(r, d)
    kind = operand_kind(dtype, precision)
    tuned = {} if dual else tuned_table(device)
    block_n, stages = DUAL_TABLE[kind] if dual else tuned.get((kind, decay), CHUNK_TABLE[(kind, decay)])
    if block_r > 128:  # a 256-row state leaves shared memory for 32-row tiles only
        block_n = 32
    return tuple(dict(BLOCK_N=block_n, BLOCK_R=block_r, BLOCK_D=cols,
                      num_warps=8 if block_r * cols >= 8192 else 4, num_stages=stages).items())


def _segment(segment: int | None, cfg: dict, n: int, lanes: int, device) -> int:
    """Rows per segment: the caller's, else a ``segment`` entry of ``cfg`` (a sweep's override,
    popped), else :func:`segment_rows`; a ValueError unless a positive multiple of the row block
    (one segment may hold any N)."""
    override = cfg.pop("segment", None)
    if segment is None:
        segment = override if override is not None else \
            segment_rows(n, lanes, cfg["BLOCK_N"], sm_count(device))  # one program per SM
    if segment <= 0 or (segment < n and segment % cfg["BLOCK_N"]):
        raise ValueError(f"option segment={segment} is invalid: it must be a positive multiple of "
                         f"{cfg['BLOCK_N']} (this call's row block)")
    return segment


def _lanes_and_segment(cfg: dict, batch: int, heads: int, n: int, d: int, segment: int | None,
                       device) -> tuple[int, int]:
    """The portable kernel's lanes (batch·heads × value-column blocks of ``cfg``) and rows per
    segment (:func:`_segment`)."""
    lanes = batch * heads * cdiv(d, cfg["BLOCK_D"])
    return lanes, _segment(segment, cfg, n, lanes, device)


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
    # view); the dual output in B's; a head each
    # (where V or B holds groups, dense head-major)
    if B.shape[1] == V.shape[1] == C.shape[1]:
        out = torch.empty_like(V) if out is None else out
        out2 = None if dual is None else (torch.empty_like(B) if out2 is None else out2)
    else:  # (groups)
        heads = lane_heads(B, C, V, dual)
        out = per_head_like(V, heads) if out is None else out
        out2 = None if dual is None else (per_head_like(B, heads) if out2 is None else out2)
    tensors = Operands(B=B, C=C, V=V, O=out, E=dual, O2=out2, S0=staged_state(initial_state, B),
                       GAMMA=gamma, CU=cu_seqlens,
                       G=None if g is None else g.to(torch.float32), ROWS=rows, NORM=norm,
                       OFFSETS=None if offsets is None else _checked_offsets(offsets, V, dual))
    if gate_pieces is not None:
        w, rows, totals = gate_pieces
        tensors = tensors._replace(E=dual if dual is not None else rows_contiguous(w),
                                   DG=(rows, totals))
    plan = launch_plan(tensors, fp32_precision=fp32_precision, segment=segment, config=config,
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


_UNGROUPED = (1, 1, 1, 1)


def groups_of(t, heads: int) -> tuple:
    """The heads sharing one head of B, C, V and E of a call's :class:`Operands`: the kernels'
    ``GROUPS`` (1: a head a lane, and for an absent E)."""
    return tuple(1 if x is None else heads // x.shape[1] for x in (t.B, t.C, t.V, t.E))


#: int32 counters by (device, stream): the buffer and its views by (flags, ring) counts
_COUNTERS: dict = {}


def zeroed_counters(device: torch.device, nflags: int, ring: int) -> tuple:
    """``(flags, sync)``: ``nflags`` zero int32 counters (the lanes' repair flags) and ``ring``
    more (the ring's flags and ticket), None where a count is 0: views of one buffer per device
    and stream that every launch of the kernels leaves zero (``kernels/chunk_scan.py``,
    ``kernels/chunk_hopper.py``), so that a call spends no zeroing launch of its own (a launch's
    host time; calls on one stream run in order, so none sees another's counters). While a CUDA
    graph is captured, a buffer of the call's own (its zeroing captured with it)."""
    if not (nflags or ring):
        return None, None
    count = nflags + ring
    if device.type == "cuda":
        if torch.cuda.is_current_stream_capturing():
            buf = torch.zeros(count, dtype=torch.int32, device=device)
            return (buf[:nflags] if nflags else None), (buf[nflags:] if ring else None)
        where = (device, torch._C._cuda_getCurrentRawStream(
            device.index if device.index is not None else torch.cuda.current_device()))
    else:
        where = (device, 0)
    entry = _COUNTERS.get(where)
    if entry is None or entry[0].numel() < count:
        grown = max(count, 2 * entry[0].numel() if entry else 4096)
        # (kept across calls: made outside a CUDA graph's pool, or reduce-overhead refuses it)
        entry = _COUNTERS[where] = (persistent(
            lambda: torch.zeros(grown, dtype=torch.int32, device=device), device), {})
    views = entry[1].get((nflags, ring))
    if views is None:
        buf = entry[0]
        views = entry[1][(nflags, ring)] = ((buf[:nflags] if nflags else None),
                                            (buf[nflags:count] if ring else None))
    return views


#: calls of up to this many rows (batch · heads · N) on the portable kernel repair their non-finite
#: rows within their launch (b1 × 32 heads × N = 8192: calls short enough that a repair launch's
#: host time would weigh, NOTES.md); longer ones flag lanes for a repair launch
SELF_REPAIR_ROWS = 1 << 18
#: the head dimensions (r and d) the Hopper kernel takes
HOPPER_DIMS = (64, 128, 256)


def _widest_dc(r: int, d: int) -> int:
    """The most value columns a Hopper program holds: 128 up to r = 128 where d has them, else 64
    (each consumer's R × DC/2 fp32 state at most 64 registers a thread, :func:`hopper_tiles`)."""
    return 128 if r <= 128 and d >= 128 else 64


@functools.lru_cache(maxsize=None)
def hopper_tiles(r: int, d: int, dtype: torch.dtype, dual: bool,
                 dc: int | None = None, pieces: bool = False,
                 e_ring: bool = False, gates: bool = False,
                 norm: bool = False) -> tuple[int, int] | None:
    """``(DC, STAGES)``: the value columns a program holds (its two consumers DC/2 each) and the
    ring's slots, or None where two slots do not fit shared memory (fp32 at r = 256).

    A consumer's R × DC/2 fp32 state stays at ≤ 64 registers a thread (128 × 64 or 256 × 32):
    DC = 128 up to r = 128, 64 at r = 256 (and for d = 64); d/DC programs share a lane's B and C.
    ``dc``: fewer columns than that (32 or 64; ``config``'s DC, :func:`hopper_split`), a
    ValueError where it cannot take them.
    Shared memory (:data:`leetrepro._device.SM90_SHARED_BYTES`): a ring slot holds the chunk's B,
    C (BLOCK_N × r each) and V (BLOCK_N × DC), and with ``dual`` E (BLOCK_N × d); beside the ring,
    fp16/bf16 keep the state's two copies (r × DC/2 each), O's staging (4 × BLOCK_N × DC/2) and
    the weighted V (2 × BLOCK_N × DC/2); fp32 the state's copies in halves and O staged in the
    ring. At r = d = 128: 3 slots of 48 KB in fp16/bf16 (224 KB), 2 with the dual output or fp32.
    ``pieces`` (the gates' gradient's pieces, fp16/bf16): the state's copies and the weighted v
    twice (their remainders), 2 slots at r = d = 128; ``e_ring`` (with ``pieces``, not ``dual``):
    their row vectors E in the ring too (BLOCK_N × DC a slot); ``gates``: the chunk's gates'
    float32 tile sums too (BLOCK_N a slot), and 1152 bytes more kept free for the padding the
    allocator lays out around their buffer (compiled for sm_90: 0.35-2.1 KB over the slots and
    fixed buffers beside the 1 KB always kept; a launch at 4 slots of 33 KB asked 72 bytes too
    many, H200). :class:`HopperLaunch` takes the gates, then E, out of the ring wherever a launch
    still asks too much. ``norm`` (normalised linear attention, :func:`chunk_scan`'s ``norm``):
    in place of the weighted V, Σk's and c·Σv's operands and a tile of ones (16 columns each).
    """
    from .._device import SM90_SHARED_BYTES
    bn, size = HOPPER["BLOCK_N"], dtype.itemsize
    widest = _widest_dc(r, d)
    if dc is None:
        dc = widest
    elif dc not in (32, 64, 128) or dc > widest or (dual and dc != d):
        raise ValueError(f"DC={dc} is invalid at r = {r}, d = {d}: a power of two from 32 to "
                         f"{widest}{' equal to d (the dual output)' if dual else ''}")
    dh = dc // 2
    slot = bn * (2 * r + dc + (d if dual else dc if pieces and e_ring else 0)) * size + \
        (4 * bn if gates else 0)
    if dtype == torch.float32:
        fixed = 2 * dh * (r // 2 if r > 64 else r) * size
    else:
        fixed = (2 * r * dh + 4 * bn * dh + 2 * bn * dh) * size
        if norm:
            fixed += (2 * 16 * (r + dh + bn) - 2 * bn * dh) * size
        if pieces:
            fixed += (2 * r * dh + 2 * bn * dh) * size
    stages = min(HOPPER["MAX_STAGES"],
                 (SM90_SHARED_BYTES - 1024 - (1152 if gates else 0) - fixed) // slot)
    return (dc, stages) if stages >= 2 else None


def hopper_constants(*, r: int, d: int, dtype: torch.dtype, decay: bool, has_s0: bool,
                     store_sn: bool, split: bool, reverse: bool, dual: bool,
                     dc: int | None = None, gates: bool = False,
                     groups: tuple = (1, 1, 1, 1), gate_grad: bool = False,
                     rows: bool = False, late_pairs: bool | None = None,
                     unhoist: bool | None = None, norm: bool = False) -> dict:
    """The Hopper kernel's constexprs for a call (its launch and the register check compile the
    same kernel): the tiles of :func:`hopper_tiles` (``dc`` value columns a program, default
    the widest), and the repair launch's value columns per lane (the portable kernel's,
    :func:`block_d`); ``gate_grad``: the sweep writes the gates' gradient's pieces; ``rows``:
    it takes V's row weights and the skip (:func:`chunk_scan`'s ``rows``); ``late_pairs``:
    forward in time with the pieces, the own pairs after O's store (default: where r and the
    program's value columns are among :data:`HOPPER_LATE_PAIRS`); ``unhoist``: the consumers'
    staging buffers addressed where they are used (default: where r and the program's value
    columns are among :data:`HOPPER_UNHOISTED`); ``norm``: normalised linear attention
    (:func:`chunk_scan`'s ``norm``, :func:`hopper_norm_unfit`)."""
    dc, stages = hopper_tiles(r, d, dtype, dual, dc, pieces=gate_grad, norm=norm)
    late_pairs = (r, dc) in HOPPER_LATE_PAIRS if late_pairs is None else late_pairs
    unhoist = (r, dc) in HOPPER_UNHOISTED if unhoist is None else unhoist
    # (the pieces' row vectors E in the ring where two slots of it fit, and the gates there too
    # where that costs no slot: their tiles then come with the chunk's, STAGES ahead, not by
    # loads the consumers wait on each chunk)
    with_e = gate_grad and not dual and HOPPER_E_RING and \
        hopper_tiles(r, d, dtype, False, dc, pieces=True, e_ring=True)
    if with_e:
        stages = with_e[1]
    with_g = gates and HOPPER_GATES_RING and \
        hopper_tiles(r, d, dtype, dual, dc, pieces=gate_grad, e_ring=bool(with_e), gates=True)
    g_ring = bool(with_g) and with_g[1] == stages
    return hopper_kernels.Constants(
        BLOCK_N=HOPPER["BLOCK_N"], R=r, D=d, DC=dc, FLAG_COLS=block_d(r, d), STAGES=stages,
        HAS_DECAY=decay, HAS_S0=has_s0, STORE_SN=store_sn, HALF_RANGE=dtype == torch.float16,
        SPLIT=split, REVERSE=reverse, DUAL=dual, HAS_GATE=gates, GROUPS=groups,
        GATE_GRAD=gate_grad, E_RING=bool(with_e), G_RING=bool(g_ring), ROWS=rows,
        LATE_PAIRS=bool(gate_grad and not reverse and late_pairs), UNHOIST=bool(unhoist),
        NORM=norm)


def hopper_split(*, r: int, d: int, dtype: torch.dtype, dual: bool, lanes: int, n: int,
                 slots: int, dc: int | None = None, segment: int | None = None) -> tuple[int, int]:
    """``(DC, rows per segment)``: how the Hopper kernel spreads ``lanes`` (batch·heads) of N rows
    over the GPU's ``slots`` (SMs: one 197-224 KB program each).

    DC: the widest that fits (:func:`hopper_tiles`) unless the caller's ``dc`` (``config``'s
    ``DC``; not for the dual output, which holds the whole state) asks for fewer: a lane's d/DC
    programs take consecutive tickets, so they run at once and read its B and C from L2 after
    the first. More programs that way do not pay at batch 1 (NOTES.md: each recomputes the scores
    for fewer columns, and the sweep's chain of MMAs binds). Segments: N cut so that the units
    fill the SMs (:func:`wave_pieces`), none shorter than ``HOPPER["MIN_SEGMENT"]`` rows, or the
    caller's ``segment`` in 64-row blocks."""
    if dc is None or dual:
        dc = hopper_tiles(r, d, dtype, dual)[0]
    else:
        hopper_tiles(r, d, dtype, dual, dc)  # (a ValueError for a DC it cannot take)
    if segment is None:
        units = lanes * (d // dc)
        pieces = 1 if units >= 2 * slots else wave_pieces(units, slots)
        # no segment under eight tiles: at 8-16 lanes and N ≤ 4096, 512-row segments on half
        # the SMs beat 256-row ones on all (NOTES.md, "Segments of at least eight tiles")
        pieces = max(1, min(pieces, n // HOPPER["MIN_SEGMENT"]))
        segment = rows_for_pieces(n, pieces, HOPPER["BLOCK_N"])
    elif segment < n and segment % HOPPER["BLOCK_N"]:  # the portable kernel's, in 64-row blocks
        segment = rows_for_pieces(n, cdiv(n, segment), HOPPER["BLOCK_N"])
    return dc, segment


def hopper_unfit(B, C, V, gamma, *, dual=None, cu_seqlens=None, precision: str = "tf32",
                 outputs: tuple = (), gates: bool = False, rows: bool = False) -> str | None:
    """Why the Hopper kernel cannot take this call (a phrase), or None when it can: an sm_90 GPU,
    and operands it takes (:func:`hopper_operand_unfit`). Reverse time and the dual output are its
    own; ``rows`` (V's row weights and the skip) where :data:`HOPPER_ROWS` is on."""
    if V.device.type != "cuda" or os.environ.get("TRITON_INTERPRET") == "1":
        return "it needs a CUDA GPU (not the interpreter)"
    if _capability(V.device.index if V.device.index is not None else torch.cuda.current_device()) \
            != (9, 0):
        return "it needs an sm_90 GPU (H100, H200)"
    if gates and V.dtype == torch.float32:
        return "its per-token gates take float16/bfloat16"
    unfit = _hopper_rows_unfit(B, V, rows) if rows else None
    if unfit:
        return unfit
    return hopper_operand_unfit(B, C, V, dual=dual, cu_seqlens=cu_seqlens, precision=precision,
                                outputs=outputs)


#: normalised linear attention's forward (:func:`chunk_scan`'s ``norm``) on the Hopper kernel
#: where it takes the call (:func:`hopper_norm_unfit`); off: the portable kernel's sweep
HOPPER_NORM = True


def hopper_norm_unfit(B, C, V, dual=None) -> str | None:
    """Why the Hopper kernel cannot take normalised linear attention's forward over these
    operands (a phrase), or None: :func:`hopper_unfit`'s, then bf16, r of 64 or 128 and d of
    128 (one program a lane holds every value column; fp16's range and fp32's tf32 operands
    stay on the portable kernel), and :data:`HOPPER_NORM` on."""
    if not HOPPER_NORM:
        return "HOPPER_NORM is off"
    unfit = hopper_unfit(B, C, V, None, dual=dual, outputs=(V,))
    if unfit:
        return unfit
    if V.dtype != torch.bfloat16 or B.shape[-1] not in (64, 128) or V.shape[-1] != 128:
        return "its normalised sweep takes bfloat16 with r of 64 or 128 and d = 128"
    return None


def misaligned(t: torch.Tensor) -> bool:
    """Whether a tensor's base or a stride but the last is not a multiple of 16 bytes (the
    Hopper kernel's TMA takes neither)."""
    return bool(t.data_ptr() % 16 or any(st * t.element_size() % 16 for st in t.stride()[:-1]))


def _hopper_rows_unfit(B, V, mode: int = 1) -> str | None:
    """Why the Hopper kernel, where it takes a gated call, does not take V's row weights and the
    skip with it (:func:`hopper_unfit`'s ``rows``; ``mode`` 2: E's row weights and the row
    dots of a reverse sweep), or None."""
    if mode == 2:  # (compiled for sm_90 and checked at Mamba-2's 64 × 64 heads only)
        if not HOPPER_ROW_DOTS:
            return "E's row weights and the row dots are the portable kernel's " \
                   "(HOPPER_ROW_DOTS off)"
        if B.shape[-1] != 64 or V.shape[-1] != 64:
            return "it takes E's row weights and the row dots at r = d = 64"
        return None
    if not HOPPER_ROWS:
        return "V's row weights and the skip are the portable kernel's (HOPPER_ROWS off)"
    if B.shape[-1] > 128 or V.shape[-1] > 64:
        # (compiled for sm_90 the sweep spills with them there: 112-304 bytes a thread at
        # r = 256, 12-140 at r = d = 128; none at r ≤ 128, d = 64)
        return "it takes V's row weights and the skip at r ≤ 128 and d = 64"
    return None


def rows_unfit(B, C, V) -> str | None:
    """Why V's row weights and the skip (:func:`chunk_scan`'s ``rows``) cannot join the forward
    sweep a gated call would run anyway, or None: a GPU or Triton's interpreter, and where the
    Hopper kernel takes the call without them, it takes them too (else the rows would move the
    call to the slower portable kernel). The call without them reads a V' of its own, dense, so
    a V not 16-byte aligned (a slice of odd width) is refused where the Hopper kernel runs."""
    if not HAS_TRITON or (V.device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1"):
        return "it needs Triton on a GPU or its interpreter"
    if hopper_unfit(B, C, V, None, gates=True) is None:  # (the rows' own conditions alone then)
        return _hopper_rows_unfit(B, V)
    if V.device.type == "cuda" and misaligned(V) and _capability(
            V.device.index if V.device.index is not None else torch.cuda.current_device()) == (9, 0):
        return "V is not 16-byte aligned: the Hopper kernel would not take it"
    return None


def _dual_apart(B, C, V, E, gamma, kernel: str, fp32_precision, cu_seqlens=None,
                segment: int | None = None, config: dict | None = None) -> bool:
    """Whether a call with the dual output runs as two sweeps of the Hopper kernel rather than
    one dual sweep of the portable kernel: where the Hopper kernel takes both plain sweeps
    (op(B, C, V) and op(E, V, C)) but not the dual output (r ≠ d, r = d = 256, fp32) and would
    run them (``kernel="hopper"``, :func:`force_kernel`, or for ``"auto"`` the measured table's
    dual row of this call's regime and head shape). Two Hopper sweeps read C and V twice, and
    still beat the portable dual sweep (NOTES.md); two portable sweeps would not."""
    if kernel == "portable" or _FORCED[0] == "portable":
        return False
    precision = dot_precision(V.dtype, fp32_precision)
    call = dict(precision=precision, cu_seqlens=cu_seqlens)
    if not (hopper_unfit(B, C, V, gamma, dual=E, **call) is not None
            and hopper_unfit(B, C, V, gamma, **call) is None
            and hopper_unfit(E, V, C, gamma, **call) is None):
        return False
    # the plain sweep's own plan: its segments decide the regime of the measured table
    batch, _, n, r = B.shape
    heads = lane_heads(B, C, V)
    cfg = chunk_config(r, V.shape[-1], V.dtype, precision, gamma is not None, device=V.device,
                       config=config)
    split = _lanes_and_segment(cfg, batch, heads, n, V.shape[-1], segment, V.device)[1] < n
    if kernel == "auto" and _FORCED[0] is None:  # the table's dual row: two sweeps against one
        return hopper_wins(V.device, V.dtype, gamma is not None, split, n, True, r, V.shape[-1],
                           _few(B, C, V, cu_seqlens), _grouped(B, C, V))
    return _use_hopper(kernel, B, C, V, gamma, split, **call)


def hopper_operand_unfit(B, C, V, *, dual=None, cu_seqlens=None, precision: str = "tf32",
                         outputs: tuple = ()) -> str | None:
    """Why the Hopper kernel cannot take these operands, or None: fp16/bf16, or fp32 through tf32
    (``precision`` as :func:`leetrepro.methods._gpu.dot_precision` names it) without the dual
    output, r and d each 64, 128 or 256 (fp32: r ≤ 128), the dual output at r = d ≤ 128 only,
    no packed sequences, each tensor's base and strides 16-byte aligned (TMA), the ``outputs``
    it would write (O, the dual output) too."""
    if V.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        return f"it takes float16/bfloat16/float32, got {V.dtype}"
    if V.dtype == torch.float32 and precision != "tf32":
        return f"it takes float32 through tf32 only, got fp32_precision={precision!r}"
    if V.dtype == torch.float32 and dual is not None:
        return "its dual output takes float16/bfloat16 (four fp32 tiles a row block do not fit)"
    r, d = B.shape[-1], V.shape[-1]
    if r not in HOPPER_DIMS or d not in HOPPER_DIMS:
        return f"it needs r and d each 64, 128 or 256, got r = {r}, d = {d}"
    if dual is not None and not (r == d <= 128):
        return f"its dual output needs r = d ≤ 128 (the whole state in one program), got r = {r}, d = {d}"
    if hopper_tiles(r, d, V.dtype, dual is not None) is None:
        return f"its tiles at r = {r} do not fit shared memory in {V.dtype} (two ring slots)"
    if cu_seqlens is not None:
        return "cu_seqlens is the portable kernel's"
    named = (("B", B), ("C", C), ("V", V), ("dual", dual))
    named += tuple(zip(("O", "the dual output"), outputs))
    for name, t in named:
        if t is None:
            continue
        if misaligned(t):
            return f"{name}'s base and strides must be 16-byte aligned"
    return None


@functools.lru_cache(maxsize=None)
def _capability(index: int) -> tuple:
    return torch.cuda.get_device_capability(index)


#: at batch 1, below this N an eager call's host time is a large part of it (the Hopper kernel's
#: launch costs more of it than the portable one's, NOTES.md): its own regime in ``make tune``'s table
SHORT_SPLIT_N = 32768


#: one pass per lane over fewer lanes than this many waves of the GPU's SMs (a training
#: micro-batch: batch × heads of a few hundred) is a regime of its own in the kernel table: there
#: the time is each lane's chunk loop, where over many waves it is the kernels' throughput (at
#: r = d = 64 the Hopper kernel 1.3-1.95× faster at 128-320 lanes on the H200, tied at 1024,
#: NOTES.md)
FEW_LANES_WAVES = 3


def few_lanes(lanes: int, device) -> bool:
    """Whether ``lanes`` (batch × heads, or sequences × heads) are fewer than
    :data:`FEW_LANES_WAVES` waves of ``device``'s SMs."""
    return lanes < FEW_LANES_WAVES * sm_count(device)


def regime(split: bool, n: int, dual: bool = False, few: bool = False,
           grouped: bool = False) -> str:
    """``"one"`` (one pass per lane; ``"one-few"`` over :func:`few_lanes`; ``-groups`` appended
    where B and C are read in groups), ``"split"`` (N cut into segments) or ``"split-short"``
    (segments, N < :data:`SHORT_SPLIT_N`), prefixed ``"dual-"`` for a dual output (the backward's
    dV and dC in one sweep, on either kernel): the rows of the kernel table. Reverse time shares
    the forward's rows (the same kernel, the same work)."""
    if split:
        name = "split" if n >= SHORT_SPLIT_N else "split-short"
    else:
        name = ("one-few" if few else "one") + ("-groups" if grouped else "")
    return "dual-" + name if dual else name


def hopper_wins(device, dtype: torch.dtype, decay: bool, split: bool, n: int,
                dual: bool = False, r: int = 128, d: int = 128, few: bool = False,
                grouped: bool = False) -> bool:
    """Whether ``make tune`` measured the Hopper kernel faster than the portable one on this GPU
    for this dtype, mask, :func:`regime` and head shape r × d (``data/<gpu>/chunk_kernel.csv``,
    :func:`leetrepro.bench.sweep.kernel_table`); False where nothing was measured. A dual row
    compares what ``kernel="hopper"`` runs for a dual call (its dual sweep at r = d ≤ 128, else
    two of its plain sweeps) with the portable dual sweep. A head shape the table has no rows
    for reads r = d = 128's (tables measured before the shapes were swept hold only those); a
    dual call without its own row reads the plain sweep's; one pass per lane over
    :func:`few_lanes` (``few``) or over more, without rows of its own (tables measured before
    the micro-batch regime; head shapes whose every measured shape had few lanes), reads the
    other's; B and C in groups (``grouped``) without rows of their own read a head each's; a
    table without a dtype column has one row for fp16 and bf16."""
    kind = "half" if dtype != torch.float32 else "tf32"
    table = tuning.kernel_table(gpu_tag(device))
    shape = (r, d) if (r, d) in table["shapes"] else (128, 128)
    rows = table["rows"]
    name = str(dtype).split(".")[-1]
    for du in ((dual, False) if dual else (False,)):
        for fw in ((False,) if split else (few, not few)):
            for gr in ((grouped, False) if grouped and not split else (False,)):
                for dt in (name, ""):
                    key = (kind, dt, decay, regime(split, n, du, fw, gr), *shape)
                    if key in rows:
                        return rows[key] == "hopper"
    return False


def _use_hopper(kernel, B, C, V, gamma, split: bool, **call) -> bool:
    """Whether this call runs the Hopper kernel: ``kernel`` as :func:`chunk_scan` says, and for
    ``"auto"`` where it can, the kernel :func:`force_kernel` names if any, else :func:`hopper_wins`."""
    if kernel == "portable":
        return False
    unfit = hopper_unfit(B, C, V, gamma, **call)
    if kernel == "hopper":
        if unfit:
            raise ValueError(f"kernel='hopper' cannot run this call: {unfit}")
        return True
    if kernel != "auto":
        raise ValueError(f"option kernel={kernel!r} is invalid; use 'auto', 'portable' or 'hopper'")
    if unfit is not None:
        return False
    if _FORCED[0] is not None:  # the correctness matrix's switch (force_kernel)
        return _FORCED[0] == "hopper"
    # (gates read the decay's rows: their work per chunk is the decay's, not the 0-1 mask's)
    return hopper_wins(V.device, V.dtype, gamma is not None or bool(call.get("gates")), split,
                       B.shape[2], call.get("dual") is not None, B.shape[-1], V.shape[-1],
                       _few(B, C, V, call.get("cu_seqlens")), _grouped(B, C, V))


def _grouped(B, C, V) -> bool:
    """Whether a call reads B or C in groups (fewer heads than its lanes)."""
    heads = lane_heads(B, C, V)
    return B.shape[1] != heads or C.shape[1] != heads


def _few(B, C, V, cu_seqlens) -> bool:
    """:func:`few_lanes` of a call: its sequences × heads."""
    seqs = B.shape[0] if cu_seqlens is None else cu_seqlens.numel() - 1
    return few_lanes(seqs * lane_heads(B, C, V), V.device)


#: the kernel ``kernel="auto"`` takes wherever it can run, whatever the table says (None: the table)
_FORCED: list = [None]


def force_kernel(kernel: str | None) -> None:
    """Make every ``kernel="auto"`` call take ``"hopper"`` wherever that kernel can run, or
    ``"portable"`` always; None: follow the measured table again. For the correctness matrix
    (``gpu_check --chunk-kernel``), which reaches Chunk through every path (API, autograd, ops):
    ``"hopper"`` also takes a gated backward's pieces there at any number of lanes
    (:func:`hopper_pieces`)."""
    if kernel not in (None, "hopper", "portable"):
        raise ValueError(f"force_kernel({kernel!r}): use 'hopper', 'portable' or None")
    _FORCED[0] = kernel


class Operands(typing.NamedTuple):
    """A call's tensors, as the kernels name them: B, C, V, the output O, the dual output's E and
    O2 (None without it), the float32 initial state S0, γ (float64 ``(H,)``), the packed
    sequences' offsets CU and the per-token gates G (float32 ``(batch, heads, N)``, any strides;
    each None where the call has none)."""
    B: torch.Tensor
    C: torch.Tensor
    V: torch.Tensor
    O: torch.Tensor
    E: torch.Tensor | None
    O2: torch.Tensor | None
    S0: torch.Tensor | None
    GAMMA: torch.Tensor | None
    CU: torch.Tensor | None
    G: torch.Tensor | None = None
    #: the gates' gradient's pieces ``(rows, totals)`` a backward sweep writes
    #: (:func:`gate_piece_buffers`; its row vectors are E), or None
    DG: tuple | None = None
    #: V's row weights and the skip ``(w, D)`` of a forward sweep (:func:`chunk_scan`'s
    #: ``rows``), or None
    ROWS: tuple | None = None
    #: normalised linear attention's ``(c, eps, denominators)`` (:func:`chunk_scan`'s ``norm``),
    #: or None
    NORM: tuple | None = None
    #: the scores' rank-one offsets ``(kind, c, x)`` (:func:`chunk_scan`'s ``offsets``: kind
    #: "rows" with x a float32 ``(batch, heads, N)`` or None for the constant c, "cols" with x),
    #: or None
    OFFSETS: tuple | None = None


def _norm_code(t: Operands) -> int:
    """What the sweep carries beside the operator, as the plans' signature and the kernels' ``NORM``
    take it: 0 nothing, 1 the normaliser (:func:`chunk_scan`'s ``norm``), 2 rows' offsets, 3
    columns' offsets, 4 a constant offset (``offsets``)."""
    if t.NORM is not None:
        return 1
    if t.OFFSETS is None:
        return 0
    kind, _, x = t.OFFSETS
    return 5 if kind == "dual" else 3 if kind == "cols" else 2 if x is not None else 4


#: the Hopper kernel's ``NORM`` of each :func:`_norm_code` (a constant offset: the rows' mode
#: without a row of them; the portable kernel takes the codes themselves, but the dual's 5:
#: :func:`_offset_halves`)
_KERNEL_NORM = (0, 1, 2, 3, 2, 5)


def _offset_halves(t: Operands) -> tuple[Operands, Operands]:
    """A dual call's offsets (``("dual", c, β)``) as its two plain calls': O's with the constant c
    on its rows, the dual output's (op(E, V, C), :func:`_transposed`) with β on its columns."""
    _, c, beta = t.OFFSETS
    return (t._replace(E=None, O2=None, OFFSETS=("rows", c, None)),
            _transposed(t)._replace(OFFSETS=("cols", 0.0, beta)))


class HopperLaunch:
    """The Hopper kernel's launch for one call signature (part of its :class:`LaunchPlan`):
    everything but the tensors. Its TMA descriptors are made on the first launch with Triton's
    public ``TensorDescriptor`` (its checks run then) and kept; each launch sets their ``base`` to
    the call's tensors (the plan is keyed by their shapes, strides and 16-byte alignment, which is
    all the checks read) and clears it after, so that the plan keeps no caller's tensor alive."""

    def __init__(self, *, units: int, grid: tuple, size: tuple, consts, blocks: tuple,
                 layouts: tuple, serial: int):
        self.units = units      # programs a pass: lanes × blocks of DC value columns
        self.grid = grid        # one program per unit, or per unit and segment
        self.size = size        # (N, H, LANES, SEG)
        self.consts = consts    # the kernel's constants (:func:`hopper_constants`)
        self.blocks = blocks    # the TMA block's columns of B, C, V, O, E, O2 (None: no operand)
        self.layouts = layouts  # their shared-memory layouts
        self.key = ("hopper", serial)  # the compiled kernel's key for :func:`launch`
        self.descriptors = None
        self.g_descriptor = None  # (the gates' tile sums, with the kernel's G_RING)

    def launch(self, t: Operands, *, sn, flags, sync, ws, scale: float) -> None:
        """One launch over ``t``'s tensors, the final states into ``sn``, with the lanes' repair
        ``flags`` and, with segments, the ring ``ws`` and its flags and ticket ``sync``. A launch
        that asks for more shared memory than the SM has (raised as the kernel loads, before
        anything runs: :func:`hopper_tiles` counts the slots, not the allocator's padding) is
        made again without the gates' tile sums in the ring, then without E there (their loads
        instead), from this call on."""
        while True:
            try:
                return self._launch(t, sn=sn, flags=flags, sync=sync, ws=ws, scale=scale)
            except OutOfResources:
                if not self._without_ring():
                    raise

    def _without_ring(self) -> bool:
        """The gates', else E's, tiles out of the ring (their slots' bytes freed), the kernel
        compiled anew; False where neither is there."""
        if self.consts.G_RING:
            self.consts = self.consts._replace(G_RING=False)
        elif self.consts.E_RING:
            self.consts = self.consts._replace(E_RING=False)
            self.blocks = self.blocks[:4] + (None,) + self.blocks[5:]
            self.layouts = self.layouts[:4] + (None,) + self.layouts[5:]
            self.descriptors = None
        else:
            return False
        self.key = ("hopper", next(_SERIALS))
        return True

    def _launch(self, t: Operands, *, sn, flags, sync, ws, scale: float) -> None:
        # (E without a block of its own: the pieces' row vectors read by pointers, not TMA)
        tensors = tuple(x if cols is not None else None
                        for x, cols in zip((t.B, t.C, t.V, t.O, t.E, t.O2), self.blocks))
        descs = self.descriptors
        if descs is None:
            descs = self.descriptors = tuple(
                None if x is None else TensorDescriptor(x, list(x.shape), list(x.stride()),
                                                        [1, 1, HOPPER["BLOCK_N"], cols], layout)
                for x, cols, layout in zip(tensors, self.blocks, self.layouts))
        for desc, x in zip(descs, tensors):
            if desc is not None:
                desc.base = x
        gates = None if t.G is None else tile_gate_sums(t.G, HOPPER["BLOCK_N"], self.consts.REVERSE)
        g_desc = None
        if self.consts.G_RING:  # (a tile a row: TMA boxes of one tile's sums)
            bn = HOPPER["BLOCK_N"]
            tiles = gates.view(*gates.shape[:2], -1, bn)
            if self.g_descriptor is None:
                self.g_descriptor = TensorDescriptor(tiles, list(tiles.shape),
                                                     list(tiles.stride()), [1, 1, 1, bn],
                                                     _gates_layout(bn))
            g_desc = self.g_descriptor
            g_desc.base = tiles
        pieces = None
        if self.consts.GATE_GRAD:  # (E's rows in place; the pieces' rows, a block per consumer)
            rows = t.DG[0]
            pieces = (t.E, *t.E.stride()[:3], rows, rows.stride(0))
        weights = None
        if self.consts.ROWS:  # (the row weights and the skip; the row dots' (2, blocks, lanes,
            # N), a block per consumer's DC/2 columns)
            w, skip = t.ROWS[:2]
            weights = (w, *w.stride()[:3], skip)
            if self.consts.ROWS == 2:
                weights = weights + (t.ROWS[2], t.ROWS[2].stride(1), t.ROWS[2].stride(0))
        norm = None
        if self.consts.NORM:  # (c, eps, the denominators, the segments' published sums, the
            # offsets' row)
            c, eps, den, off = (*t.NORM, None) if t.NORM is not None else \
                (t.OFFSETS[1], 0.0, None, t.OFFSETS[2])
            n, _, lanes, segment = self.size
            width, segs = 2 * self.consts.R + self.consts.D, cdiv(n, segment)
            sums = torch.empty(lanes, segs, width, dtype=torch.float32, device=t.V.device) \
                if segs > 1 else t.V
            norm = (float(c), float(eps), den, sums, segs * width if segs > 1 else 0, off)
        try:
            launch(hopper_kernels.chunk_hopper_kernel, self.grid,
                   dict(b_desc=descs[0], c_desc=descs[1], v_desc=descs[2], o_desc=descs[3],
                        e_desc=descs[4], o2_desc=descs[5], STATES=(t.S0, sn),
                        RING=(ws, sync, flags), DECAY=(t.GAMMA, gates), SIZE=self.size,
                        scale=scale, PIECES=pieces, g_desc=g_desc, K=self.consts,
                        ROWS=weights if norm is None else norm), self.key,
                   num_warps=HOPPER["num_warps"], maxnreg=HOPPER["maxnreg"])
        finally:
            for desc in descs + (g_desc,):
                if desc is not None:
                    desc.base = None


def _hopper_launch(*, n, r, d, heads, lanes, segment, dc, dtype, decay, has_s0, store_sn,
                   reverse, dual, serial: int, gates: bool = False,
                   groups: tuple = (1, 1, 1, 1), gate_grad: bool = False,
                   rows: bool = False, norm: bool = False) -> HopperLaunch:
    """The :class:`HopperLaunch` of a call: ``lanes`` (batch·heads) of N rows in segments of
    ``segment`` rows (N: one pass per lane), ``dc`` value columns a program
    (:func:`hopper_split`)."""
    n_seg = cdiv(n, segment)
    consts = hopper_constants(r=r, d=d, dtype=dtype, decay=decay, has_s0=has_s0,
                              store_sn=store_sn, split=n_seg > 1, reverse=reverse, dual=dual,
                              dc=dc, gates=gates, groups=groups, gate_grad=gate_grad, rows=rows,
                              norm=norm)
    dh = consts.DC // 2
    # (E's block: the dual output's input, or the pieces' row vectors in the ring, in the
    # consumers' halves)
    blocks = (r, r, dh, dh) + ((d // 2, r // 2) if dual else (dh, None) if consts.E_RING else
                               (None, None))
    gdt = gluon_dtype(dtype)
    units = lanes * (d // consts.DC)
    return HopperLaunch(
        units=units, grid=(units * n_seg,), size=(n, heads, lanes, segment), consts=consts,
        blocks=blocks,
        layouts=tuple(None if c is None else _tma_layout(HOPPER["BLOCK_N"], c, gdt) for c in blocks),
        serial=serial)


def tile_gate_sums(g: torch.Tensor, block: int, reverse: bool) -> torch.Tensor:
    """The Hopper kernel's gates: running sums of g ``(batch, heads, N)`` within each tile of
    ``block`` rows, in logical order (``reverse``: from each tile's last row back), float32
    ``(batch, heads, whole tiles)`` contiguous, the rows past N zeros (they add nothing). One
    launch on a GPU (or under Triton's interpreter: ``kernels/gate_rows.py``), where PyTorch
    took three to five (a cast, the padding, flips, the sums; about 25 µs a sweep at Codestral's
    2 × 128 heads × 8192, H200, notes/gates.md); PyTorch elsewhere. O(N) a lane."""
    b, h, n = g.shape
    whole = cdiv(n, block)
    if not isinstance(rows_kernels, NoTriton) and n and (
            g.is_cuda or os.environ.get("TRITON_INTERPRET") == "1"):
        out = torch.empty(b, h, whole * block, dtype=torch.float32, device=g.device)
        strides = tuple(g.stride())
        # (the key: what Triton specialises on, the integers by value; every sweep launches
        # this, so the launch skips binding its arguments one by one)
        launch(rows_kernels.tile_sums_kernel, (b * h, cdiv(whole, GATE_ROWS_TILES)),
               dict(G=g, OUT=out, SIZE=(n, h, whole), STRIDES=strides,
                    BLOCK_N=block, TILES=GATE_ROWS_TILES, REVERSE=reverse),
               key=(g.dtype, g.data_ptr() % 16 == 0, n, h, whole, strides, block,
                    GATE_ROWS_TILES, reverse, g.device), num_warps=4)
        return out
    tiles = torch.nn.functional.pad(g.to(torch.float32), (0, whole * block - n))
    tiles = tiles.view(b, h, -1, block)
    if reverse:
        return tiles.flip(-1).cumsum(-1).flip(-1).view(b, h, -1)
    return tiles.cumsum(-1).view(b, h, -1)


def gluon_dtype(dtype: torch.dtype):
    """The Gluon dtype of a torch dtype the Hopper kernel takes (fp16, bf16, fp32)."""
    from triton.experimental.gluon import language as gl
    return {torch.float16: gl.float16, torch.bfloat16: gl.bfloat16,
            torch.float32: gl.float32}[dtype]


@functools.lru_cache(maxsize=None)
def _gates_layout(block: int):
    """The shared-memory layout of the gates' (1, 1, 1, block) float32 TMA tile: unswizzled, so
    that the consumers read it as a vector by rows and by columns."""
    from triton.experimental.gluon import language as gl
    return gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=4)


@functools.lru_cache(maxsize=None)
def _tma_layout(rows: int, cols: int, gdt):
    """The shared-memory layout of a (1, 1, rows, cols) TMA tile (computed once: host time on
    every call otherwise)."""
    from triton.experimental.gluon import language as gl
    return gl.NVMMASharedLayout.get_default_for([1, 1, rows, cols], gdt)


class LaunchPlan:
    """What :func:`chunk_scan` launches for one call signature, decided on its first call and held
    in :data:`_PLANS`, then run with each call's tensors (:meth:`run`): the kernel, the tiles and
    segments, whether the launch repairs its own non-finite lanes, the counters and ring it needs,
    and every argument of the portable kernel but the tensors (the Hopper kernel's:
    :class:`HopperLaunch`). A function of what :func:`launch_plan` keys on only."""

    def __init__(self, *, lanes: int, state_shape: tuple, grid: tuple,
                 hopper: HopperLaunch | None, self_repair: bool, ring: int,
                 ws_shape: tuple | None, strides: tuple, size: tuple, consts, split: bool,
                 options: dict, store_sn: bool, serial: int, halves: tuple | None = None):
        self.kernel = "portable" if hopper is None else "hopper"
        self.lanes = lanes              # (batch·heads or sequences·heads) × value-column blocks
        self.state_shape = state_shape  # the final state's (batch or sequences, heads, r, d)
        self.grid = grid                # the portable launch's
        self.hopper = hopper            # the Hopper kernel's launch (None: the portable kernel's)
        self.self_repair = self_repair  # the portable launch repairs its non-finite lanes itself
        self.nflags = 0 if self_repair else lanes  # zeroed counters: the lanes' repair flags,
        self.ring = ring                # then the ring's flags and ticket (0 without segments)
        self.ws_shape = ws_shape        # the ring of published states (segments), or None
        # (batch, head, row) strides of B, C, V, O, E, O2 and the gates: the plan's key
        # holds them, and taking them from the plan spares a call's host path their stride()
        # calls
        self.strides = strides
        self.size = size                # (N, R, D, H, LANES, SEG)
        self.consts = consts            # the portable kernel's constants (_tiles.Constants)
        self.split = split              # its segments chained through the ring
        self.options = options          # its num_warps and num_stages
        self.store_sn = store_sn
        self.serial = serial            # the compiled kernels' key (methods/_gpu.launch)
        # (the dual's offsets: the portable plans of its two plain calls, whose repair launches
        # stand for the dual's, :func:`_offset_halves`)
        self.halves = halves

    def run(self, t: Operands, scale: float):
        """The launches over ``t``'s tensors (O and the dual output written); the final state
        (float32) or None."""
        device = t.V.device
        sn = torch.empty(self.state_shape, dtype=torch.float32, device=device) \
            if self.store_sn else None
        ws = None if self.ws_shape is None else \
            torch.empty(self.ws_shape, dtype=torch.float32, device=device)
        if self.hopper is not None:
            flags, sync = zeroed_counters(device, self.nflags, self.ring)
            self.hopper.launch(t, sn=sn, flags=flags, sync=sync, ws=ws, scale=scale)
        else:
            flags = self._sweep(t, sn, ws, scale)
        if not self.self_repair:
            if self.halves is not None:
                for half, x in zip(self.halves, _offset_halves(t)):
                    half.repair(x, None, flags, scale)
            else:
                self.repair(t, sn, flags, scale)
        return sn

    def repair(self, t: Operands, sn, flags, scale: float) -> None:
        """The lanes ``flags`` marks non-finite, recomputed by the portable kernel so that no row
        meets a later row's NaN/Inf (kernels/chunk_scan.py); a few microseconds when none is
        (one segment a lane: all its rows, a reverse sweep's padding too)."""
        size = self.size[:5] + (self.size[0] + self.consts.BLOCK_N,)
        launch(scan_kernels.chunk_scan_kernel, (self.lanes,),
               self._arguments(t, (t.S0, sn), (None, None, flags), scale, size, False, True),
               (self.serial, True), num_warps=self.options["num_warps"], num_stages=1)

    def _sweep(self, t: Operands, sn, ws, scale: float):
        """The portable kernel's launch; its lanes' repair flags (None: it repairs its own)."""
        while True:
            flags, sync = zeroed_counters(t.V.device, self.nflags, self.ring)
            try:
                launch(scan_kernels.chunk_scan_kernel, self.grid,
                       self._arguments(t, (t.S0, sn), (ws, sync, flags), scale, self.size,
                                       self.split, False),
                       (self.serial, False, self.self_repair), **self.options)
                return flags
            except OutOfResources:
                if not self.self_repair:
                    raise
            # the repair's tiles beside the sweep's do not fit this GPU's shared memory (raised
            # as the kernel loads, before anything runs): this signature flags lanes for a
            # repair launch instead, from this call on
            self.self_repair, self.nflags, self.serial = False, self.lanes, next(_SERIALS)

    def _arguments(self, t: Operands, states, ring, scale, size, split, repair) -> dict:
        """The portable kernel's arguments, by name: each tensor with its strides."""
        b, c, v, o, e, o2, g = self.strides
        # (0 for what the call has not; the gates last: Triton 3.6 mis-binds a tuple's members
        # after a nested tuple followed by a constant, measured on the H100 and the H200)
        decay = (0 if t.GAMMA is None else t.GAMMA, 0 if g is None else (t.G, *g))
        if t.ROWS is not None:  # (flat: no nested tuple, no constant after one)
            w, skip = t.ROWS[:2]
            scale = (scale, w, *w.stride()[:3], skip)
            if len(t.ROWS) == 3:  # (the row dots: (2, blocks, lanes, N), contiguous)
                rd = t.ROWS[2]
                scale = scale + (rd, rd.stride(1), rd.stride(0))
        elif t.NORM is not None:  # (and the segments' sums of C and V rows, published apart)
            width, segs = self.consts.BLOCK_R + self.consts.BLOCK_D, cdiv(size[0], size[5])
            sums = torch.empty(self.lanes, segs, width, dtype=torch.float32,
                               device=t.V.device) if split else t.NORM[2]
            scale = (scale, float(t.NORM[0]), float(t.NORM[1]), t.NORM[2], sums,
                     segs * width if split else 0)
        elif t.OFFSETS is not None:  # (c, the offsets' row or None; one segment a lane)
            scale = (scale, t.OFFSETS[1], 0.0, t.OFFSETS[2], 0, 0)
        args = dict(B=(t.B, *b), C=(t.C, *c), V=(t.V, *v), O=(t.O, *o),
                    E=None if e is None else (t.E, *e), O2=None if o2 is None else (t.O2, *o2),
                    STATES=states, RING=ring, DECAY=decay, CU=t.CU,
                    SIZE=size, SCALE=scale, K=self.consts._replace(SPLIT=split), REPAIR=repair,
                    DG=None)
        if self.consts.GATE_GRAD:
            rows, totals = t.DG
            args["DG"] = (rows, *rows.stride(), totals, totals.shape[-1])
        return args


class ApartPlan:
    """A call with the dual output run as two Hopper sweeps, O's then the dual output's (its state
    is O's transposed, and so is its initial state), where the Hopper kernel takes both but not
    the dual output (:func:`_dual_apart`): the two plain calls' plans."""
    kernel = "hopper"

    def __init__(self, first: LaunchPlan, second: LaunchPlan):
        self.first, self.second = first, second

    def run(self, t: Operands, scale: float):
        first, second = _offset_halves(t) if t.OFFSETS is not None else \
            (t._replace(E=None, O2=None), _transposed(t))
        sn = self.first.run(first, scale)
        self.second.run(second, scale)
        return sn


def _transposed(t: Operands) -> Operands:
    """The dual output's call as a plain one: op(E, V, C) into O2, from S0 transposed."""
    s0 = None if t.S0 is None else t.S0.transpose(-1, -2).contiguous()
    return t._replace(B=t.E, C=t.V, V=t.C, O=t.O2, E=None, O2=None, S0=s0)


#: the plans' numbers: a plan's launches are keyed by it (everything they specialise on is a
#: function of the plan's key), a small key to hash where the plan's own is ~40 entries
_SERIALS = itertools.count()
#: launch plans by call signature (:func:`launch_plan`): a model calls one signature per layer,
#: and at short N deciding it again would cost more host time than the kernel
_PLANS: dict = {}


def launch_plan(t: Operands, *, fp32_precision, segment, config, output_final_state: bool,
                reverse: bool, kernel: str) -> LaunchPlan | ApartPlan:
    """The plan of a call of :func:`chunk_scan` over ``t``: looked up by everything it depends on
    (shapes, dtypes, flags, options, each tensor's strides and the pointers' 16-byte alignment,
    the kernel option, :func:`force_kernel`, whether the call is short enough to repair itself),
    made on the first call of that key."""
    batch, heads, n, r = t.O.shape[0], t.O.shape[1], t.B.shape[2], t.B.shape[3]
    d = t.V.shape[-1]
    if t.CU is not None:
        batch = t.CU.numel() - 1  # sequences: the lanes' "batch"
    # (E is V, B or C of another sweep: grouped only where one of those is)
    grouped = t.B.shape[1] != heads or t.C.shape[1] != heads or t.V.shape[1] != heads
    signature = (n, r, d, batch, heads, groups_of(t, heads) if grouped else _UNGROUPED, t.V.dtype,
                 dot_precision(t.V.dtype, fp32_precision),
                 t.GAMMA is not None, t.O2 is not None, t.V.device, segment,
                 None if not config else tuple(sorted(config.items())), t.CU is not None,
                 t.S0 is not None, output_final_state, reverse, t.G is not None,
                 t.DG is not None, 0 if t.ROWS is None else len(t.ROWS) - 1,
                 0 if t.NORM is None and t.OFFSETS is None else _norm_code(t))
    strides = []
    aligned = 0  # which pointers are 16-byte aligned (the kernels specialise on each)
    bit = 1
    # (the gates only where the call has them: a call's host path)
    for x in t[:10] if t.G is not None else t[:9]:
        if x is not None:
            strides.append(x.stride())
            if x.data_ptr() % 16 == 0:
                aligned |= bit
        else:
            strides.append(None)
        bit <<= 1
    extra = () if t.ROWS is None else t.ROWS[::2]
    if t.NORM is not None:
        extra = (t.NORM[2],)
    elif t.OFFSETS is not None and t.OFFSETS[2] is not None:
        extra = (t.OFFSETS[2],)
    for x in extra:  # (the row weights', the row dots' or the denominators' too)
        strides.append(x.stride())
        aligned |= bit * (x.data_ptr() % 16 == 0)
        bit <<= 1
    key = (signature, tuple(strides), t.B.dtype, t.C.dtype,
           None if t.GAMMA is None else t.GAMMA.dtype, None if t.CU is None else t.CU.dtype,
           aligned)
    short = t.B.shape[0] * heads * n <= SELF_REPAIR_ROWS
    # (with the Hopper kernel's A/B switches: a plan keeps the constants it was made with)
    cache_key = (key, kernel, _FORCED[0], short, HOPPER_E_RING, HOPPER_GATES_RING,
                 HOPPER_LATE_PAIRS, HOPPER_UNHOISTED, HOPPER_NORM)
    plan = _PLANS.get(cache_key)
    if plan is None:
        if len(_PLANS) >= 1024:
            _PLANS.clear()
        plan = _PLANS[cache_key] = _new_plan(signature, t, kernel, short)
    return plan


def _check_rows(rows: int, gates: bool, reverse: bool, dual: bool, varlen: bool) -> None:
    """A ValueError where :func:`chunk_scan`'s ``rows`` (mode 1: ``(w, D)``, 2: ``(w, D, RD)``)
    do not fit the sweep."""
    if rows == 1 and (not gates or reverse or dual):
        raise ValueError("rows (V's row weights and the skip) need a gated forward sweep "
                         "without the dual output")
    if rows == 2 and (not gates or not reverse or not dual or varlen):
        raise ValueError("rows with the row dots (E's row weights, dx and its dots) need a gated "
                         "reverse sweep with the dual output, without cu_seqlens")


def _check_norm(decay: bool, rows: bool, states: bool, reversed_: bool, varlen: bool,
                kernel: str, t: Operands, dual: bool = False) -> bool:
    """A ValueError where :func:`chunk_scan`'s ``norm`` (or ``offsets``) does not fit the call;
    whether the Hopper kernel runs it (``kernel="hopper"``, or ``"auto"`` where
    :func:`hopper_norm_unfit` lets it)."""
    name = "norm (normalised linear attention in the sweep)" if t.NORM is not None else \
        "offsets (a rank-one term on the scores)"
    for bad, what in ((decay, "a decay (γ)"), (rows, "gates or row weights"),
                      (states, "initial or final states"),
                      (reversed_ and t.NORM is not None, "reverse time or dual"),
                      (dual and _norm_code(t) != 5, "dual"), (varlen, "cu_seqlens")):
        if bad:
            raise ValueError(f"{name} takes no {what}")
    if kernel == "portable":
        return False
    unfit = hopper_norm_unfit(t.B, t.C, t.V, t.E)
    if kernel == "hopper" and unfit:
        raise ValueError(f"kernel='hopper' cannot run {name.split()[0]} over this call: {unfit}")
    return unfit is None


def _norm_setup(signature, t: Operands, kernel: str) -> tuple[bool, int | None]:
    """``(whether the Hopper kernel takes the call's norm or offsets, its rows a segment)``, a
    ValueError where they do not fit it (:func:`_check_norm`); the portable kernel's offsets
    take one segment a lane."""
    (n, _, _, _, _, _, _, _, decay, dual, _, segment, _, varlen, has_s0, store_sn, reverse,
     gates, gate_grad, rows, norm) = signature
    hopper = bool(norm) and _check_norm(decay, gates or gate_grad or rows, has_s0 or store_sn,
                                        reverse or dual, varlen, kernel, t, dual)
    return hopper, n if norm >= 2 and not hopper else segment


def _offset_plans(t: Operands, options: dict, hopper: bool) -> tuple:
    """The plans of a dual call's offsets as its two plain calls (:func:`_offset_halves`): the
    call's own where the Hopper kernel does not take it, else the portable ones whose repair
    launches stand for its."""
    return tuple(launch_plan(x, **dict(options, kernel="portable" if hopper else
                                       options["kernel"]), output_final_state=False)
                 for x in _offset_halves(t))


def _new_plan(signature, t: Operands, kernel: str, short: bool) -> LaunchPlan | ApartPlan:
    (n, r, d, batch, heads, groups, dtype, precision, decay, dual, device, segment, override,
     varlen, has_s0, store_sn, reverse, gates, gate_grad, rows, norm) = signature
    _check_rows(rows, gates, reverse, dual, varlen)
    norm_hopper, segment = _norm_setup(signature, t, kernel)
    refuse_interpreted_bf16(dtype, "Chunk")
    config = None if override is None else dict(override)
    options = dict(fp32_precision=precision, segment=segment, config=config, reverse=reverse,
                   kernel=kernel)
    halves = _offset_plans(t, options, norm_hopper) if norm == 5 else None  # (or its repairs)
    if halves is not None and not norm_hopper:
        return ApartPlan(*halves)
    if dual and not gates and not norm and _dual_apart(t.B, t.C, t.V, t.E, t.GAMMA, kernel,
                                                       precision, t.CU, segment, config):
        return ApartPlan(launch_plan(t._replace(E=None, O2=None), **options,
                                     output_final_state=store_sn),
                         launch_plan(_transposed(t), **options, output_final_state=False))
    serial = next(_SERIALS)
    cfg = chunk_config(r, d, dtype, precision, decay, dual=dual, device=device, config=config)
    asked = segment if segment is not None else cfg.get("segment")  # (popped just below)
    lanes, segment = _lanes_and_segment(cfg, batch, heads, n, d, segment, device)
    n_seg = cdiv(n, segment)
    if dual and (lanes != batch * heads or cfg["BLOCK_R"] < r):
        raise ValueError(f"dual needs the whole r × d state in one lane (r·d ≤ 128·128), "
                         f"got r = {r}, d = {d}")
    if gate_grad:
        if kernel == "hopper":  # (its pieces: one segment a lane)
            unfit = (_hopper_rows_unfit(t.B, t.V, rows) if rows == 2 else None) or \
                hopper_pieces_unfit(t.B, t.C, t.V, t.E, dual=dual, reverse=reverse,
                                    cu_seqlens=t.CU, outputs=(t.O, t.O2))
            if unfit:
                raise ValueError(f"kernel='hopper' cannot run this call: {unfit}")
            asked = n
        elif segment >= n:  # (one segment: whole chunks, for the reverse sweep's padded rows)
            segment = cdiv(n, cfg["BLOCK_N"]) * cfg["BLOCK_N"]
    hopper = norm_hopper if norm else (kernel == "hopper") if gate_grad else _use_hopper(
        kernel, t.B, t.C, t.V, t.GAMMA, n_seg > 1, dual=t.E if dual else None, cu_seqlens=t.CU,
        precision=precision, outputs=(t.O, t.O2), gates=gates, rows=rows)
    # the ring: a flag per lane, its published states (lanes, 2, BLOCK_R, BLOCK_D); the Hopper
    # kernel's a flag per consumer of each unit (lane, DC value columns), the states (b·h, 2, r, d)
    h = None
    if hopper:
        dc, hopper_segment = hopper_split(r=r, d=d, dtype=dtype, dual=dual, lanes=batch * heads,
                                          n=n, slots=sm_count(device),
                                          # (norm: one program a lane holds every column)
                                          dc=None if norm else cfg.get("DC"), segment=asked)
        h = _hopper_launch(n=n, r=r, d=d, heads=heads, lanes=batch * heads,
                           segment=hopper_segment, dc=dc, dtype=dtype, decay=decay, has_s0=has_s0,
                           store_sn=store_sn, reverse=reverse, dual=dual, serial=serial,
                           gates=gates, groups=groups, gate_grad=gate_grad, rows=rows,
                           norm=_KERNEL_NORM[norm])
        ring, ws_shape = 2 * h.units, (batch * heads, 2, r, d)
        chained = h.grid[0] > h.units  # (its own segments, not the portable kernel's)
    else:
        ring, ws_shape = lanes, (lanes, 2, cfg["BLOCK_R"], cfg["BLOCK_D"])
        chained = n_seg > 1
    # A short call on the portable kernel repairs its non-finite rows within its launch (the
    # segment holding a lane's first non-finite row computes its rows again): one launch, where a
    # repair launch would add a launch's host time; a long one keeps its kernel lean (the
    # in-launch repair slows its sweep, NOTES.md) and flags the lanes for a repair launch, as the
    # Hopper kernel does.
    return LaunchPlan(
        lanes=lanes, state_shape=(batch, heads, r, d), grid=(lanes * n_seg,), hopper=h,
        # (gated calls: the repair launch, never the in-launch repair, whose separate function
        # Triton 3.6 hands the gates' tuple wrongly)
        self_repair=not hopper and short and not gates,
        ring=ring + 1 if chained else 0,
        ws_shape=ws_shape if chained else None,
        strides=tuple(None if x is None else x.stride()[:3] for x in t[:6]) +
        (None if t.G is None else t.G.stride()[:3],),
        size=(n, r, d, heads, lanes, segment),
        consts=tiles.constants(cfg, HAS_DECAY=decay, VARLEN=varlen, HAS_S0=has_s0,
                              STORE_SN=store_sn, REVERSE=reverse, DUAL=dual,
                              HALF_RANGE=dtype != torch.float32, PRECISION=precision,
                              HAS_GATE=gates, GROUPS=groups,
                              # (the Hopper kernel's pieces are its own: its repair launch
                              # recomputes the outputs only)
                              GATE_GRAD=gate_grad and not hopper, ROWS=rows, NORM=norm),
        split=n_seg > 1, options=dict(num_warps=cfg["num_warps"], num_stages=cfg["num_stages"]),
        store_sn=store_sn, serial=serial, halves=halves)


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
    cfg = chunk_config(r, d, V.dtype, precision, gamma is not None, device=V.device)
    lanes, segment = _lanes_and_segment(cfg, batch, heads, n, d, segment, V.device)
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


def gate_grad_block(r: int, d: int, dtype: torch.dtype, precision: str, dual: bool,
                    device) -> int:
    """The row block (chunk) both sweeps of a gated backward take, so that their chunks are the
    same rows: the smaller of the forward-time dB sweep's (an r-column operator on d-wide rows)
    and the reverse sweep's (``dual``: dV and dC in one)."""
    return min(chunk_config(d, r, dtype, precision, True, device=device)["BLOCK_N"],
               chunk_config(r, d, dtype, precision, True, dual=dual, device=device)["BLOCK_N"])


def gate_piece_buffers(width: int, row: int, batch: int, seqs: int, heads: int, n: int, *,
                       dtype: torch.dtype, precision: str, dual: bool, device,
                       config: dict) -> tuple:
    """``(rows, totals)`` for one sweep's gates' gradient's pieces (``kernels/chunk_scan.py``,
    ``GATE_GRAD``): float32 ``(blocks, batch, heads, N)`` and ``(blocks, seqs·heads, chunks)``,
    a block per lane of the sweep's value columns (``width`` of them beside ``row``-wide rows,
    ``BLOCK_D`` of :func:`chunk_config` with the sweep's ``config``), chunks of its ``BLOCK_N``
    rows (packed sequences: each sequence's from its first row, zeros past its last)."""
    cfg = chunk_config(row, width, dtype, precision, True, dual=dual, device=device, config=config)
    blocks, block_n = cdiv(width, cfg["BLOCK_D"]), cfg["BLOCK_N"]
    rows = torch.empty(blocks, batch, heads, n, dtype=torch.float32, device=device)
    size = (blocks, seqs * heads, max(cdiv(n, block_n), 1))
    return rows, (torch.zeros if seqs != batch else torch.empty)(size, dtype=torch.float32,
                                                                  device=device)


#: whether a gated backward's sweeps take their pieces on the Hopper kernel where it can
#: (:func:`hopper_pieces`); False: the portable kernel's sweeps always (an A/B switch)
HOPPER_PIECES = True
#: whether the reverse sweep carrying the pieces on the Hopper kernel also writes the dual output
#: dC (r = d = 64: one sweep where two run apart otherwise; Mamba-2 at 64 × 64, 2 × 64 heads ×
#: 8192, bf16: forward + backward 1.14 ms in a graph against 1.35 with dC's sweep apart, H200,
#: notes/gates.md)
HOPPER_DUAL_PIECES = True
#: whether the pieces' row vectors E come through the Hopper kernel's ring (TMA, with the
#: chunk's tiles) where two slots of it fit shared memory, rather than by loads each chunk; an
#: A/B switch
HOPPER_E_RING = True
#: whether the Hopper kernel's gates (their tile sums, :func:`tile_gate_sums`) come through its
#: ring by TMA, STAGES chunks ahead, rather than by loads each chunk's consumers wait on, where
#: that costs the ring no slot (:func:`hopper_constants`); an A/B switch
HOPPER_GATES_RING = True
#: whether a gated backward at r = 256 (Falcon-H1's d_state) takes dg from both sweeps' pieces on
#: the Hopper kernel (the dB sweep at 128 columns a program, the reverse sweep at 32: each fits
#: shared memory with E and the gates in the ring, compiled for sm_90 with 0 and 52 bytes of
#: spills) instead of the straddle kernel (``ops._in_sweeps``): Falcon-H1's SSD forward + backward
#: 3.59 ms in a graph against 6.17 with the straddle kernel (H200, bf16, notes/gates.md)
HOPPER_PIECES_WIDE = True
#: whether the Hopper kernel takes V's row weights and the skip (:func:`chunk_scan`'s ``rows``)
HOPPER_ROWS = True
#: the (r, value columns a program) tiles at which the Hopper kernel's dB sweep with the pieces
#: (forward in time) adds the chunk's own pairs once O's half has left for its store, not beside
#: O's MMAs (``LATE_PAIRS``): at 128 × 128 that sweep's spills fall from 808 to 452 bytes a
#: thread compiled for sm_90 (bf16; fp16 912 to 600), and `gla`'s forward + backward from 3.91
#: to 3.76 ms in a graph; at 128 × 64 and 64 × 64 (Mamba-2's), with few spills either way, the
#: MMA waited on in the chunk's chain cost 0.7-2 % (H200, notes/gates.md). Empty: never
HOPPER_LATE_PAIRS = frozenset({(128, 128)})
#: the (r, value columns a program) tiles at which the Hopper kernel's consumers address their
#: staging buffers where they use them (``UNHOIST``, :func:`hopper_kernels._unhoisted`), not
#: through registers held across the sweep: at 128 × 128 the gated dB sweep's spills fall from
#: 452 to 16 bytes a thread compiled for sm_90 (bf16; the γ sweeps' to 0), `gla`'s gated forward
#: + backward from 3.73-3.82 to 3.53-3.62 ms in a graph, its γ one from 1.87 to 1.84; at Mamba-2's
#: tiles (128 × 64, 64 × 64), which spilled nothing, the address arithmetic on the chain cost
#: the gated step 5-8 %; at Falcon-H1's (256 × 64, 64 × 128), where it took 52 bytes of spills to
#: 0, its SSD step did not move (3.38-3.39 against 3.40-3.41 ms in a graph; H200, bit-identical
#: gradients, notes/gates.md). Empty: never
HOPPER_UNHOISTED = frozenset({(128, 128)})
#: whether the Hopper kernel's reverse sweep with the dual output and the gates' pieces takes
#: E's row weights and the row dots (``rows = (w, D, RD)``, Mamba-2's dx in that sweep) where
#: it runs anyway; off, the SSD's backward keeps its row pass there
HOPPER_ROW_DOTS = True


def hopper_pieces_unfit(B, C, V, E, *, dual: bool = False, reverse: bool = True,
                        cu_seqlens=None, outputs: tuple = ()) -> str | None:
    """Why the Hopper kernel cannot take a sweep's gates' gradient's pieces
    (``kernels/chunk_hopper.py``, ``GATE_GRAD``; its operands B, C, V and the row vectors E
    shaped like V, with ``dual`` also the dual output's input), or None: what it needs of a gated
    call (:func:`hopper_unfit`), the dual output in reverse time only, and shared memory for the
    remainders' copies."""
    if dual and not reverse:
        return "its dual output beside the pieces is the reverse sweep's"
    unfit = hopper_unfit(B, C, V, None, dual=E if dual else None, cu_seqlens=cu_seqlens,
                         outputs=outputs, gates=True)
    if unfit:
        return unfit
    if E is None or E.shape != V.shape[:1] + E.shape[1:2] + V.shape[2:] or E.stride(-1) != 1:
        return "its pieces need E shaped like V, its rows contiguous"
    if misaligned(E):
        return "its pieces' E's base and strides must be 16-byte aligned (TMA)"
    if _pieces_tiles(B.shape[-1], V.shape[-1], V.dtype, dual, reverse) is None:
        return "its remainders' copies do not fit shared memory beside two ring slots"
    return None


def _pieces_tiles(r: int, d: int, dtype: torch.dtype, dual: bool, reverse: bool):
    """:func:`hopper_tiles` of a sweep carrying the pieces at the most columns it takes there
    (``d`` with the dual output, else at most :data:`PIECES_DC`'s), or None."""
    widest = _widest_dc(r, d)
    dc = d if dual else min(widest, d, PIECES_DC.get((r, reverse), widest))
    try:
        return hopper_tiles(r, d, dtype, dual, dc, pieces=True)
    except ValueError:  # (no such width at this head shape)
        return None


#: the most value columns a program of the Hopper kernel holds beside the pieces, by (r, in
#: reverse time). At 128 columns the sweep spilled (bf16: 116 bytes a thread forward at r = 64,
#: 276 in reverse at r = d = 128; fp16 up to 316; with E and the gates through the ring 0 and
#: 264) and still ran faster than two programs a lane at 64, each forming the chunk's scores
#: again (H200, bf16: Mamba-2's 2 × 64 heads × 8192, 128 × 64, forward + backward 1.64 ms in a
#: graph against 2.26; gated `gla` 4.84 against 5.08 in reverse, notes/gates.md). Forward in time
#: at r = 128 (the dB sweep where the operator's d is 128) likewise 128, though it spills 808
#: bytes a thread there (bf16; the ring has no room for E and the gates, and the chunk's own
#: pairs hold a fourth 64 × 64 accumulator): a lane's chunks take about as long at 128 columns
#: as at 64, so one program a lane halves the sweep's programs, and the gated `gla` shape's
#: forward + backward took 3.80 ms in a graph against 4.35 at 64 (H200, bf16, notes/gates.md).
#: In reverse at r = 256 (:data:`HOPPER_PIECES_WIDE`): 32, the most that fits beside the pieces.
PIECES_DC = {(64, False): 128, (64, True): 128, (128, False): 128, (128, True): 128,
             (256, True): 32}


def hopper_pieces(B, C, V, E, *, reverse: bool, dual: bool = False,
                  cu_seqlens=None) -> int | None:
    """The Hopper kernel's value columns a program holds (DC) where a gated backward's sweep
    op(B, C, V) (the dB sweep forward in time, the dV sweep in reverse) should take its pieces
    there (their row vectors E, shaped like V), else None: :data:`HOPPER_PIECES` and not the
    portable kernel forced, an sm_90 GPU and operands it takes (:func:`hopper_pieces_unfit`),
    and programs enough to busy half the SMs in one pass (the pieces take no segments). A program
    holds as many of a lane's value columns as it can (at most :data:`PIECES_DC`), halved (down
    to 32) only while twice the programs still run in one wave: each more program a lane forms
    the chunk's scores again, and a second wave costs more than the SMs a short one leaves idle
    (128 lanes on 132 SMs: one program a lane, measured faster than two). With the Hopper kernel
    forced (:func:`force_kernel`): the widest, whatever the lanes. ``dual``
    (:data:`HOPPER_DUAL_PIECES`): the reverse sweep with the dual output, E its input, whose
    program holds the whole state (DC = d), where the plain sweep would not split."""
    if not HOPPER_PIECES or _FORCED[0] == "portable" or (B.shape[-1], reverse) not in PIECES_DC \
            or (dual and not HOPPER_DUAL_PIECES) \
            or hopper_pieces_unfit(B, C, V, E, dual=dual, reverse=reverse,
                                   cu_seqlens=cu_seqlens) is not None:
        return None
    r, d = B.shape[-1], V.shape[-1]
    # (the correctness matrix's switch reaches the pieces at its small shapes too)
    lanes = V.shape[0] * lane_heads(B, C, V)
    slots = 1 if _FORCED[0] == "hopper" else sm_count(V.device)
    if dual:
        return d if 2 * lanes > slots else None
    dc = _pieces_tiles(r, d, V.dtype, False, reverse)[0]
    while 2 * lanes * (d // dc) <= slots and dc > 32:  # (a short wave: more programs a lane)
        dc //= 2
    return dc if 2 * lanes * (d // dc) >= slots else None


def hopper_row_pieces(q: torch.Tensor, block_n: int, reverse: bool) -> tuple:
    """A sweep's pieces ``(rows, totals)`` (as the portable kernel writes them,
    :func:`gate_piece_buffers`) from the Hopper kernel's rows q, float32 ``(blocks, batch,
    heads, N)`` (a block per consumer's columns, summed here), per chunk of ``block_n`` physical
    rows: forward in time (the dB sweep: q = e + δ) each row's sum of q over the rows from it to
    its chunk's end (I + II); in reverse (the dV sweep: q = e) over the rows physically before it
    (logically after it: III); and each chunk's total of q, ``(1, batch·heads, chunks)`` (the
    δ sum to 0 over a chunk). Sums in a fixed order."""
    blocks, batch, heads, n = q.shape
    q = q[0] if blocks == 1 else q.sum(0)
    # (the running sums within tiles the gates take: forward the sums to each tile's end, in
    # reverse from its start, less the row's own)
    sums = tile_gate_sums(q, block_n, not reverse).view(batch, heads, -1, block_n)
    totals = sums[..., -1] if reverse else sums[..., 0]
    rows = sums.view(batch, heads, -1)[..., :n]
    return (rows - q if reverse else rows)[None], totals.reshape(1, batch * heads, -1)


#: chunks a program of the rows' gates' gradient (``kernels/gate_rows.py``) takes a step
GATE_ROWS_TILES = 16
#: whether :func:`gate_gradient_from_rows` launches its kernel on a GPU, where the composition it
#: replaces took about twenty PyTorch passes over the rows: Mamba-2's 2 × 64 heads × 8192
#: forward + backward 1.37 ms in a graph against 1.45, eager at 64 × 64 1.97 against 2.43 (H200,
#: bf16, notes/gates.md); off, the composition (the GPU test compares the two)
GATE_ROWS_ON_GPU = True


def gate_gradient_from_rows(q_f: torch.Tensor, q_r: torch.Tensor, block_n: int,
                            tail: torch.Tensor | None = None, scale: float = 1.0) -> torch.Tensor:
    """dg, float32 ``(batch, heads, N)``, from the Hopper kernel's rows of both sweeps (float32
    ``(blocks, batch, heads, N)``: the dB sweep's q_f forward in time, the dV sweep's q_r), as
    :func:`hopper_row_pieces` of each then :func:`gate_gradient_from_pieces` (no packed
    sequences; ``tail`` and ``scale`` as there) give it: one launch of ``kernels/gate_rows.py``
    on a GPU (or under Triton's interpreter), where those took about twenty PyTorch passes over
    the rows (:data:`GATE_ROWS_ON_GPU`); those two elsewhere. O(N) a lane, every sum in a fixed
    order."""
    blocks, batch, heads, n = q_f.shape
    if isinstance(rows_kernels, NoTriton) or n == 0 or not (
            q_f.is_cuda and GATE_ROWS_ON_GPU or os.environ.get("TRITON_INTERPRET") == "1"):
        return gate_gradient_from_pieces(hopper_row_pieces(q_f, block_n, False),
                                         hopper_row_pieces(q_r, block_n, True), block_n, None,
                                         tail, scale)
    dg = torch.empty(batch, heads, n, dtype=torch.float32, device=q_f.device)
    lanes = batch * heads
    launch(rows_kernels.gate_rows_kernel, (lanes,),
           dict(QF=q_f.contiguous(), QR=q_r.contiguous(),
                TAIL=None if tail is None else tail.reshape(lanes).to(torch.float64).contiguous(),
                DG=dg, SIZE=(n, lanes, blocks, q_r.shape[0]), scale=float(scale),
                BLOCK_N=block_n, TILES=GATE_ROWS_TILES, HAS_TAIL=tail is not None),
           num_warps=4)
    return dg


def gate_gradient_from_pieces(forward: tuple, backward: tuple, block_n: int,
                              cu_seqlens: torch.Tensor | None = None,
                              tail: torch.Tensor | None = None, scale: float = 1.0) -> torch.Tensor:
    """dg, float32 ``(batch, heads, N)``, from the pieces of the forward-time dB sweep and of the
    reverse sweep (:func:`gate_piece_buffers`, chunks of ``block_n`` rows): each row's pieces
    (I + II, III) plus its chunk's K_c, the pairs with a column before the chunk and a row after
    it, K_c = T_N + Σ_(c' > c) E_c' − Σ_(c' ≥ c) F'_c' (``notebooks/derivations.py``: E the
    forward's chunk totals, F' the reverse's), in float64 over the chunks; ``tail``: T_N =
    ⟨dS_N, S_N⟩ / scale per (batch or sequence, head), or None. Every sum in a fixed order: the
    same inputs give the same bits."""
    (rows_f, tot_f), (rows_r, tot_r) = forward, backward
    _, batch, heads, n = rows_f.shape
    e, f = (t.sum(0, dtype=torch.float64) for t in (tot_f, tot_r))  # (seqs·heads, chunks)
    k = (e - f).flip(-1).cumsum(-1).flip(-1) - e  # (Σ_(c' ≥ c) of E − F', less E_c)
    if tail is not None:
        k = k + tail.reshape(-1, 1).to(torch.float64)
    k = k.to(torch.float32).view(-1, heads, k.shape[-1])
    if cu_seqlens is None:
        per_row = k.repeat_interleave(block_n, -1)[..., :n]
    else:  # (each row's sequence and its chunk there)
        pos = torch.arange(n, device=rows_f.device)
        seq = torch.searchsorted(cu_seqlens[1:].to(torch.long), pos, right=True)
        chunk = (pos - cu_seqlens.to(torch.long)[seq]) // block_n
        per_row = k[seq.clamp_max(k.shape[0] - 1), :, chunk].T[None]
    dg = (rows_f[0] if rows_f.shape[0] == 1 else rows_f.sum(0)) + \
        (rows_r[0] if rows_r.shape[0] == 1 else rows_r.sum(0)) + per_row
    return dg * scale if scale != 1.0 else dg


#: the gates' gradient's launch: row blocks, blocks per segment (one workspace state per
#: segment), the block of value columns a lane holds, warps. The value columns stay 64 at every
#: d (fewer masked): at 4 warps and 64-row blocks, Triton 3.6's code for 32 or 16 of them beside
#: r = 128 faults on the GPU (an illegal address), and at r = 256 it returns wrong sums
#: (NOTES.md): r above :data:`STRADDLE_MAX_R` is taken in pieces of it (dg is a sum over r).
#: With Mamba-3's turned pairs' sums too, 4 warps: at 8 (2.1 KB of spills a thread against 3.4
#: at r = 128, bf16) it ran 1.13× slower, and in fp32 it faulted (H200, notes/mamba3.md)
STRADDLE_BLOCK_N = 64
STRADDLE_SEGMENT_BLOCKS = 4
STRADDLE_BLOCK_D = 64
STRADDLE_WARPS = 4
STRADDLE_MAX_R = 128
#: with bf16 rows, whether the turned pairs' sums take their pair tiles' products in bf16 (the
#: tile rounded once), else in fp32 (tf32 products)
STRADDLE_ANGLE_HALF_TILES = True
#: blocks per segment with the turned pairs' sums: each segment forms its own pairs twice (by
#: rows and by columns), NB(NB+1)/2 tiles each way, so shorter segments form fewer a row and
#: write more states (two fp32 r × d a segment: 0.5 GiB at 4 × 4096 rows × 64 heads, r = 128,
#: d = 64, against 0.25 at 4). Mamba-3's training step there: 9.44 ms at 2, 10.56 at 4, 12.68
#: at 8 (H200, bf16, graph; notes/mamba3.md)
STRADDLE_ANGLE_SEGMENT_BLOCKS = 2


def straddle_tiles(r: int) -> tuple[int, int]:
    """``(BLOCK_R, BLOCK_D)`` of the gates' gradient's kernels: all of r (at most
    :data:`STRADDLE_MAX_R`), :data:`STRADDLE_BLOCK_D` value columns a lane."""
    if r > STRADDLE_MAX_R:
        raise ValueError(f"the gates' gradient's kernel takes r ≤ {STRADDLE_MAX_R}, got r = {r} "
                         f"(gate_gradient takes larger r in pieces)")
    return next_pow2(r), STRADDLE_BLOCK_D


def gate_gradient(B: torch.Tensor, C: torch.Tensor, V: torch.Tensor, dO: torch.Tensor,
                  g: torch.Tensor, *, initial_state: torch.Tensor | None = None,
                  dS: torch.Tensor | None = None, cu_seqlens: torch.Tensor | None = None,
                  scale: float = 1.0, precision: str | None = None, angles: int = 0,
                  final_state: torch.Tensor | None = None):
    """dg, float32 ``(batch, heads, N)``: the gradient to the per-token gates ``g`` (float32
    ``(batch, heads, N)``, any strides, γ folded in) of ⟨dO, O⟩ + ⟨dS, S_N⟩ for
    O = scale·op(B, C, V) with the mask exp(G_i − G_j), as the sum over the pairs of rows
    straddling each row (``kernels/gate_straddle.py``), never a difference of long running
    sums: as accurate in fp16/bf16 as fp32 allows (``reference.GATE_GRAD_TOLERANCE``).

    B, C ``(batch, heads or groups, N, r)``, V, dO ``(batch, heads, N, d)``, fp16/bf16/fp32,
    each in any layout whose last dimension is contiguous, read in place; ``initial_state``
    and ``dS`` ``(batch or sequences, heads, r, d)``; ``cu_seqlens``: packed sequences, a batch
    of one. Two state passes over the rows per (batch, head), then every 256-row segment on its
    own, O(N·(r·d + 256·(r + d))) in all; a workspace of two fp32 r × d states per segment of
    256 rows (128 with ``angles``).
    r above :data:`STRADDLE_MAX_R` in pieces of it, their dg summed. fp32's products through
    ``precision`` (default ``"tf32x3"``: fp32's contract; ``"tf32"`` for operands that hold
    16-bit values, to 16-bit's contract).

    ``angles`` = A > 0 (Mamba-3's, 2·A ≤ r): second, float32 ``(batch, heads, N, A)``, the
    sums over the same pairs of M_ij (dO_i·v_j)(b_i ×_a c_j) (b ×_a c = b_2a c_(2a+1) −
    b_(2a+1) c_2a): Σ_(t ≥ s) of the gradient to an angle turning pair a of row t's b and c, the
    states turned by none (with dS, ``final_state`` S_N: :func:`_frame_pairs`)."""
    batch, heads, n, d = V.shape
    r = B.shape[-1]
    if angles and 2 * angles > min(r, STRADDLE_MAX_R):
        raise ValueError(f"angles={angles} turns 2·{angles} of r = {r} dims; the kernel takes "
                         f"2·angles ≤ min(r, {STRADDLE_MAX_R})")
    if n == 0 or B.numel() == 0 or V.numel() == 0:
        dg = V.new_zeros(batch, heads, n, dtype=torch.float32)
        return (dg, V.new_zeros(batch, heads, n, angles, dtype=torch.float32)) if angles else dg
    if r > STRADDLE_MAX_R:  # (b_i·c_j is a sum over r, and so is every term: pieces of r, summed)
        return _in_pieces_of_r(B, C, V, dO, g, dict(
            initial_state=initial_state, dS=dS, final_state=final_state, cu_seqlens=cu_seqlens,
            scale=scale, precision=precision), angles)
    if os.environ.get("TRITON_INTERPRET") == "1" and V.dtype == torch.bfloat16:
        B, C, V, dO = (x.float() for x in (B, C, V, dO))  # (the interpreter's bf16 dot is wrong)
    B, C, V, dO = (rows_contiguous(x) for x in (B, C, V, dO))
    seqs = batch if cu_seqlens is None else cu_seqlens.numel() - 1
    block_r, block_d = straddle_tiles(r)
    n_db = cdiv(d, block_d)
    blocks = STRADDLE_ANGLE_SEGMENT_BLOCKS if angles else STRADDLE_SEGMENT_BLOCKS
    seg = STRADDLE_BLOCK_N * blocks
    slots = cdiv(n, seg) + (0 if cu_seqlens is None else seqs)
    programs = seqs * heads * n_db  # (lanes; packed, the workspace's rows are a head's, shared)
    ws = torch.empty(2, (seqs if cu_seqlens is None else 1) * heads * n_db, slots, block_r,
                     block_d, dtype=torch.float32, device=V.device)
    dg = (torch.empty if cu_seqlens is None else torch.zeros)(
        n_db, batch, heads, n, dtype=torch.float32, device=V.device)
    K = tiles.constants(dict(BLOCK_N=STRADDLE_BLOCK_N, BLOCK_R=block_r, BLOCK_D=block_d),
                        PRECISION=dot_precision(V.dtype, precision or "tf32x3"),
                        VARLEN=cu_seqlens is not None,
                        HALF_RANGE=V.dtype == torch.float16, SEG_BLOCKS=blocks,
                        GROUPS=(heads // B.shape[1], heads // C.shape[1], 1, 1),
                        ANGLES=(max(16, next_pow2(angles)), angles,
                                STRADDLE_ANGLE_HALF_TILES and V.dtype == torch.bfloat16))
    state = (lambda x: None if x is None else x.to(torch.float32).contiguous())
    common = dict(G=strided(g.to(torch.float32)), CU=cu_seqlens, SIZE=(n, r, d, heads, slots),
                  num_warps=STRADDLE_WARPS, num_stages=1)
    # F entering each segment from C, V and S0; R leaving it from B, dO and dS_N (scale left out)
    for reverse, x, y, s, inv in ((False, C, V, initial_state, 1.0), (True, B, dO, dS, 1.0 / scale)):
        straddle_kernels.segment_states[(programs,)](
            Xt=strided(x), Y=strided(y), WS=ws[int(reverse)], S=state(s), INV_SCALE=inv,
            K=K._replace(REVERSE=reverse, HAS_S0=s is not None,
                         GROUPS=(heads // x.shape[1], 1, 1, 1)), **common)
    da = (torch.empty if cu_seqlens is None else torch.zeros)(
        n_db, batch, heads, n, angles, dtype=torch.float32, device=V.device) if angles else None
    straddle_kernels.straddle_gradient[(programs, cdiv(n, seg))](
        Bt=strided(B), Ct=strided(C), V=strided(V), DO=strided(dO), WF=ws[0], WR=ws[1], DG=dg, K=K,
        DA=da, **common)
    dg = (dg.sum(0) if n_db > 1 else dg[0]) * scale
    if not angles:
        return dg
    return dg, _frame_pairs((da.sum(0) if n_db > 1 else da[0]) * scale, dS, final_state,
                            angles, cu_seqlens)


def _in_pieces_of_r(B, C, V, dO, g, options: dict, angles: int):
    """:func:`gate_gradient` (its keywords ``options``) for r above :data:`STRADDLE_MAX_R`, in
    pieces of it, their dg summed; the turned pairs' sums from the first piece, which holds the
    turned dims."""
    parts = []
    for k in range(0, B.shape[-1], STRADDLE_MAX_R):
        piece = (lambda x: None if x is None else x[..., k:k + STRADDLE_MAX_R, :])
        part = {n: piece(x) if n in ("initial_state", "dS", "final_state") else x
                for n, x in options.items()}
        parts.append(gate_gradient(B[..., k:k + STRADDLE_MAX_R], C[..., k:k + STRADDLE_MAX_R], V,
                                   dO, g, angles=angles if k == 0 else 0, **part))
    dg = sum(x[0] if isinstance(x, tuple) else x for x in parts)
    return (dg, parts[0][1]) if angles else dg


def _frame_pairs(sums: torch.Tensor, dS, final_state, angles: int, cu_seqlens) -> torch.Tensor:
    """The turned pairs' sums (:func:`gate_gradient`) with the final state's own pairs taken off:
    the kernel's dS_N stands as a row after the last, turned with it, where S_N is turned by
    none, so Σ_d dS_N ×_a S_N per (sequence, head) comes off every row of its sequence. The
    kernel forms each segment's sums from fp32 products, never a long running sum; about twice
    dg's products alone."""
    if dS is None:
        return sums
    if final_state is None:
        raise ValueError("gate_gradient(angles=…, dS=…) needs final_state (S_N)")
    dS, sn = dS[..., :2 * angles, :].double(), final_state[..., :2 * angles, :].double()
    frame = (dS[..., 0::2, :] * sn[..., 1::2, :] - dS[..., 1::2, :] * sn[..., 0::2, :]).sum(-1)
    if cu_seqlens is None:
        return sums - frame[:, :, None, :].float()
    lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).to(device=sums.device, dtype=torch.int64)
    per_row = frame.float().repeat_interleave(lengths, dim=0, output_size=sums.shape[2])
    return sums - per_row.transpose(0, 1)[None]

# the launch tables and plans that read data/<gpu>/ are forgotten when a table is rewritten
on_change(_config.cache_clear)
on_change(_PLANS.clear)
