"""Chunk's Hopper launcher: whether the Gluon kernel (``kernels/chunk_hopper.py``, sm_90, fp16/bf16
and tf32) takes a call (:func:`hopper_unfit` and the checks it gathers), its constants
(:func:`hopper_constants`), one launch with its TMA descriptors (:class:`HopperLaunch`), and the
gates' running sums within its tiles (:func:`tile_gate_sums`).
"""
from __future__ import annotations

import contextlib
import functools
import os
import threading
import weakref

import torch

from ..._groups import lane_heads
from ...decay.per_token import GATE_FLOOR
from ...tuning import HOPPER
from .._gpu import (NoTriton, cdiv, launch, sm_count)

from . import tables

try:
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    from triton.runtime.errors import OutOfResources

    from ...kernels import chunk_hopper as hopper_kernels, gate_rows as rows_kernels
except ImportError as err:  # (a Triton without Gluon's Hopper modules: the portable kernel only)
    hopper_kernels = rows_kernels = TensorDescriptor = NoTriton(err)
    OutOfResources = NoTriton.Error

#: log2 e: the Hopper kernel reads its gates' tile sums in base-2 units (:func:`tile_gate_sums`)
LOG2E = 1.4426950408889634


def hopper_constants(*, r: int, d: int, dtype: torch.dtype, decay: bool, has_s0: bool,
                     store_sn: bool, split: bool, reverse: bool, dual: bool,
                     dc: int | None = None, gates: bool = False,
                     groups: tuple = (1, 1, 1, 1), gate_grad: bool = False,
                     rows: bool = False, late_pairs: bool | None = None,
                     unhoist: bool | None = None, norm: bool = False,
                     half_pairs: bool | None = None, col_sums: bool | None = None) -> dict:
    """The Hopper kernel's constexprs for a call (its launch and the register check compile the
    same kernel): the tiles of :func:`hopper_tiles` (``dc`` value columns a program, default
    the widest), and the repair launch's value columns per lane (the portable kernel's,
    :func:`block_d`); ``gate_grad``: the sweep writes the gates' gradient's pieces; ``rows``:
    it takes V's row weights and the skip (:func:`chunk_scan`'s ``rows``); ``late_pairs``:
    forward in time with the pieces, the own pairs after O's store (default: where r and the
    program's value columns are among :data:`HOPPER_LATE_PAIRS`); ``unhoist``: the consumers'
    staging buffers addressed where they are used (default: where r and the program's value
    columns are among :data:`HOPPER_UNHOISTED`); ``norm``: normalised linear attention
    (:func:`chunk_scan`'s ``norm``, :func:`hopper_norm_unfit`); ``half_pairs``: the switch
    :data:`tables.HOPPER_HALF_PAIRS` as given (default: the table's), where it can apply;
    ``col_sums``: :data:`tables.HOPPER_COLUMN_SUMS` likewise, with the half pairs."""
    dc, stages = tables.hopper_tiles(r, d, dtype, dual, dc, pieces=gate_grad, norm=norm)
    late_pairs = (r, dc) in tables.HOPPER_LATE_PAIRS if late_pairs is None else late_pairs
    unhoist = (r, dc) in tables.HOPPER_UNHOISTED if unhoist is None else unhoist
    # (the pieces' row vectors E in the ring where two slots of it fit, and the gates there too
    # where that costs no slot: their tiles then come with the chunk's, STAGES ahead, not by
    # loads the consumers wait on each chunk)
    with_e = gate_grad and not dual and tables.HOPPER_E_RING and \
        tables.hopper_tiles(r, d, dtype, False, dc, pieces=True, e_ring=True)
    if with_e:
        stages = with_e[1]
    with_g = gates and tables.HOPPER_GATES_RING and \
        tables.hopper_tiles(r, d, dtype, dual, dc, pieces=gate_grad, e_ring=bool(with_e),
                            gates=True)
    g_ring = bool(with_g) and with_g[1] == stages
    # (the dB sweep's own pairs with E's both tiles in the ring, before O's store)
    half = bool(gate_grad and not reverse and with_e and not late_pairs and
                (tables.HOPPER_HALF_PAIRS if half_pairs is None else half_pairs))
    return hopper_kernels.Constants(
        BLOCK_N=HOPPER["BLOCK_N"], R=r, D=d, DC=dc, FLAG_COLS=tables.block_d(r, d), STAGES=stages,
        HAS_DECAY=decay, HAS_S0=has_s0, STORE_SN=store_sn, HALF_RANGE=dtype == torch.float16,
        SPLIT=split, REVERSE=reverse, DUAL=dual, HAS_GATE=gates, GROUPS=groups,
        GATE_GRAD=gate_grad, E_RING=bool(with_e), G_RING=bool(g_ring), ROWS=rows,
        LATE_PAIRS=bool(gate_grad and not reverse and late_pairs), UNHOIST=bool(unhoist),
        NORM=norm, LEAN_MASK=bool(gates and tables.HOPPER_LEAN_MASK),
        ROWS_SUMMED=bool(gate_grad and tables.HOPPER_ROWS_SUMMED),
        # (where the masked scores are read only as the 16-bit operand: not fp16's scaled
        # range, the dB sweep's own pairs, the dual output's or the normaliser's masks)
        PACKED_MASK=bool(gates and tables.HOPPER_LEAN_MASK and tables.HOPPER_PACKED_MASK and
                         dtype == torch.bfloat16 and not dual and not norm and
                         not (gate_grad and not reverse)),
        # (bf16's exact copies cut from their bits where both products read them: not the dual
        # output's O2, which reads the state's hi copy alone)
        CUT_SPLIT=bool(gate_grad and tables.HOPPER_CUT_SPLIT and dtype == torch.bfloat16 and
                       not dual),
        HALF_PAIRS=half,
        # (their columns' sums in a layout of a column's rows a thread: HOPPER_COLUMN_SUMS)
        COL_SUMS=bool(half and (tables.HOPPER_COLUMN_SUMS if col_sums is None else col_sums)))


def hopper_unfit(B, C, V, gamma, *, dual=None, cu_seqlens=None, precision: str = "tf32",
                 outputs: tuple = (), gates: bool = False, rows: bool = False) -> str | None:
    """Why the Hopper kernel cannot take this call (a phrase), or None when it can: an sm_90 GPU,
    and operands it takes (:func:`hopper_operand_unfit`). Reverse time and the dual output are its
    own; ``rows`` (V's row weights and the skip) where :data:`HOPPER_ROWS` is on."""
    unfit = device_unfit(V.device)
    if unfit:
        return unfit
    if gates and V.dtype == torch.float32:
        return "its per-token gates take float16/bfloat16"
    unfit = _hopper_rows_unfit(B, V, rows) if rows else None
    if unfit:
        return unfit
    return hopper_operand_unfit(B, C, V, dual=dual, cu_seqlens=cu_seqlens, precision=precision,
                                outputs=outputs)


def device_unfit(device: torch.device) -> str | None:
    """Why a call on ``device`` cannot take the Hopper kernel (not a CUDA GPU, Triton's
    interpreter, not sm_90), or None."""
    if device.type != "cuda" or os.environ.get("TRITON_INTERPRET") == "1":
        return "it needs a CUDA GPU (not the interpreter)"
    index = device.index if device.index is not None else torch.cuda.current_device()
    if tables._capability(index) != (9, 0):
        return "it needs an sm_90 GPU (H100, H200)"
    return None


def hopper_norm_unfit(B, C, V, dual=None) -> str | None:
    """Why the Hopper kernel cannot take normalised linear attention's forward over these
    operands (a phrase), or None: :func:`hopper_unfit`'s, then bf16, r of 64 or 128 and d of
    128 (one program a lane holds every value column; fp16's range and fp32's tf32 operands
    stay on the portable kernel), and :data:`HOPPER_NORM` on."""
    if not tables.HOPPER_NORM:
        return "HOPPER_NORM is off"
    unfit = hopper_unfit(B, C, V, None, dual=dual, outputs=(V,))
    if unfit:
        return unfit
    if V.dtype != torch.bfloat16 or B.shape[-1] not in (64, 128) or V.shape[-1] != 128:
        return "its normalised sweep takes bfloat16 with r of 64 or 128 and d = 128"
    return None


def _hopper_rows_unfit(B, V, mode: int = 1) -> str | None:
    """Why the Hopper kernel, where it takes a gated call, does not take V's row weights and the
    skip with it (:func:`hopper_unfit`'s ``rows``; ``mode`` 2: E's row weights and the row
    dots of a reverse sweep), or None."""
    if mode == 2:  # (compiled for sm_90 and checked at Mamba-2's 64 × 64 heads only)
        if not tables.HOPPER_ROW_DOTS:
            return "E's row weights and the row dots are the portable kernel's " \
                   "(HOPPER_ROW_DOTS off)"
        if B.shape[-1] != 64 or V.shape[-1] != 64:
            return "it takes E's row weights and the row dots at r = d = 64"
        return None
    if not tables.HOPPER_ROWS:
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
    if not tables.HAS_TRITON or (V.device.type != "cuda" and
                                 os.environ.get("TRITON_INTERPRET") != "1"):
        return "it needs Triton on a GPU or its interpreter"
    if hopper_unfit(B, C, V, None, gates=True) is None:  # (the rows' own conditions alone then)
        return _hopper_rows_unfit(B, V)
    if V.device.type == "cuda" and tables.misaligned(V) and tables._capability(
            V.device.index if V.device.index is not None else torch.cuda.current_device()) == (9, 0):
        return "V is not 16-byte aligned: the Hopper kernel would not take it"
    return None


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
    if r not in tables.HOPPER_DIMS or d not in tables.HOPPER_DIMS:
        return f"it needs r and d each 64, 128 or 256, got r = {r}, d = {d}"
    if dual is not None and not (r == d <= 128):
        return f"its dual output needs r = d ≤ 128 (the whole state in one program), got r = {r}, d = {d}"
    if tables.hopper_tiles(r, d, V.dtype, dual is not None) is None:
        return f"its tiles at r = {r} do not fit shared memory in {V.dtype} (two ring slots)"
    if cu_seqlens is not None:
        return "cu_seqlens is the portable kernel's"
    named = (("B", B), ("C", C), ("V", V), ("dual", dual))
    named += tuple(zip(("O", "the dual output"), outputs))
    for name, t in named:
        if t is None:
            continue
        if tables.misaligned(t):
            return f"{name}'s base and strides must be 16-byte aligned"
    return None


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

    def launch(self, t: tables.Operands, *, sn, flags, sync, ws, scale: float) -> None:
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
        elif self.consts.E_RING:  # (the half pairs read both E tiles from the ring: they go too)
            self.consts = self.consts._replace(E_RING=False, HALF_PAIRS=False, COL_SUMS=False)
            self.blocks = self.blocks[:4] + (None,) + self.blocks[5:]
            self.layouts = self.layouts[:4] + (None,) + self.layouts[5:]
            self.descriptors = None
        else:
            return False
        self.key = ("hopper", next(tables._SERIALS))
        return True

    def _launch(self, t: tables.Operands, *, sn, flags, sync, ws, scale: float) -> None:
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
        if self.consts.GATE_GRAD:  # (E's rows in place; the pieces' rows' blocks)
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
    ``block`` rows, in logical order (``reverse``: from each tile's last row back), times
    :data:`LOG2E` (base-2 exponents: the kernel takes each exponential as one ``ex2``, where
    e^x was a multiply more an element of the mask), float32 ``(batch, heads, whole tiles)``
    contiguous, the rows past N zeros (they add nothing). One
    launch on a GPU (or under Triton's interpreter: ``kernels/gate_rows.py``), where PyTorch
    took three to five (a cast, the padding, flips, the sums; about 25 µs a sweep at Codestral's
    2 × 128 heads × 8192, H200, notes/gates.md); PyTorch elsewhere. Inside
    :func:`shared_tile_sums`, the gates it names are summed once, both directions in one launch,
    for every sweep that reads them. O(N) a lane."""
    kept = _FOLDED.get(id(g))  # (made with the gates themselves: :func:`folded_gate_sums`)
    if kept is not None and kept[0]() is g and (block, reverse) in kept[1]:
        return kept[1][(block, reverse)]
    shared = getattr(_SHARED, "sums", None)
    if shared is not None and tables.GATE_SUMS_SHARED:
        key = next((i for i, (x, rev) in enumerate(shared["gates"])
                    if x is g and rev == reverse), None)
        if key is not None:
            made = shared["made"].get((key, block))
            if made is None:
                made = _tile_sums(*shared["gates"], block=block, unit=LOG2E)
                shared["made"].update({(i, block): x for i, x in enumerate(made)})
                made = made[key]
            return made
    return _tile_sums((g, reverse), block=block, unit=LOG2E)[0]


def running_tile_sums(x: torch.Tensor, block: int, reverse: bool) -> torch.Tensor:
    """:func:`tile_gate_sums`' running sums of any rows x ``(batch, heads, N)`` in their own
    units (not times log2 e), never taken from a call's kept gates."""
    return _tile_sums((x, reverse), block=block, unit=1.0)[0]


def _tile_sums(first: tuple, second: tuple | None = None, *, block: int, unit: float) -> tuple:
    """Running sums within tiles (:func:`tile_gate_sums`) of ``first = (g, reverse)`` and,
    where given, of ``second``, the other direction's gates of the same shape, times ``unit``:
    one launch for both."""
    g, reverse = first
    b, h, n = g.shape
    whole = cdiv(n, block)
    if not isinstance(rows_kernels, NoTriton) and n and (
            g.is_cuda or os.environ.get("TRITON_INTERPRET") == "1"):
        pairs = (first,) if second is None else (first, second)
        outs = tuple(torch.empty(b, h, whole * block, dtype=torch.float32, device=g.device)
                     for _ in pairs)
        strides = tuple(g.stride())
        twin = None if second is None else (second[0], outs[1], tuple(second[0].stride()))
        hb, tiles = sums_blocks(g, None if twin is None else twin[0])
        # (the key: what Triton specialises on, the integers by value; every sweep launches
        # this, so the launch skips binding its arguments one by one)
        launch(rows_kernels.tile_sums_kernel, (b * cdiv(h, hb), cdiv(whole, tiles), len(pairs)),
               dict(G=g, OUT=outs[0], SIZE=(n, h, whole), STRIDES=strides,
                    BLOCK_N=block, TILES=tiles, REVERSE=reverse, TWIN=twin,
                    FOLD=None, SHIFT_TWIN=False, UNIT=unit, HB=hb),
               key=(g.dtype, g.data_ptr() % 16 == 0, n, h, whole, strides, block,
                    tiles, reverse, unit, hb, g.device) +
               (() if twin is None else (twin[0].dtype, twin[0].data_ptr() % 16 == 0, twin[2])),
               num_warps=4)
        return outs
    outs = []
    for x, rev in (first,) if second is None else (first, second):
        tiles = torch.nn.functional.pad(x.to(torch.float32), (0, whole * block - n))
        tiles = tiles.view(b, h, -1, block)
        sums = tiles.flip(-1).cumsum(-1).flip(-1) if rev else tiles.cumsum(-1)
        outs.append((sums if unit == 1.0 else sums * unit).view(b, h, -1))
    return tuple(outs)


def sums_blocks(g: torch.Tensor, twin: torch.Tensor | None = None) -> tuple:
    """``(heads, tiles)`` a program of the tile sums' launch (``kernels/gate_rows.py``) over
    gates g ``(batch, heads, N)`` (and ``twin``, read in the same launch): one head and
    :data:`tables.GATE_ROWS_TILES` tiles where each head's rows are contiguous; else (time-major
    gates, heads innermost) up to :data:`tables.GATE_SUMS_HEADS` heads a program, its loads
    along them, and as many elements a program."""
    h = g.shape[1]
    if g.stride(2) == 1 or h == 1 or (twin is not None and twin.stride() != g.stride()):
        return 1, tables.GATE_ROWS_TILES
    hb = min(tables.GATE_SUMS_HEADS, 1 << (h - 1).bit_length())
    return hb, max(1, tables.GATE_ROWS_TILES // hb)


#: the gates :func:`folded_gate_sums` made, by id: (a weak reference to them, their tile sums by
#: (block, reverse)); an entry leaves with its gates
_FOLDED: dict = {}


def folded_gate_sums(g: torch.Tensor, *, twin: bool) -> tuple | None:
    """``(gate, reverse_gate)``: the gates the kernels read, float32 ``(batch, heads, N)``
    contiguous, g raised to :data:`leetrepro.decay.per_token.GATE_FLOOR` (``fold_gates`` without
    a γ) and, with ``twin``, those shifted one row on (``shift_gates`` of one sequence a row of
    the batch; else None), made in one launch with their tile sums for the Hopper sweeps
    (:func:`tile_gate_sums` finds them while the gates live): a gated call's fold, shift and sums
    are one launch where they were three to five. None where this does not apply
    (:data:`tables.GATE_FOLD_FUSED` off, no Triton, float64 gates, N = 0, a CPU tensor outside
    Triton's interpreter): the caller folds as before. O(N) a lane."""
    if not tables.GATE_FOLD_FUSED or isinstance(rows_kernels, NoTriton) or \
            g.dtype == torch.float64 or g.shape[-1] == 0 or \
            not (g.is_cuda or os.environ.get("TRITON_INTERPRET") == "1"):
        return None
    b, h, n = g.shape
    block = HOPPER["BLOCK_N"]
    hb, tiles = sums_blocks(g)
    whole = cdiv(n, block)
    # (no generators: a gated call's host path counts its Python calls, one a resumption)
    gates = [torch.empty(b, h, n, dtype=torch.float32, device=g.device)]
    sums = [torch.empty(b, h, whole * block, dtype=torch.float32, device=g.device)]
    if twin:
        gates.append(torch.empty_like(gates[0]))
        sums.append(torch.empty_like(sums[0]))
    strides = tuple(g.stride())
    launch(rows_kernels.tile_sums_kernel, (b * cdiv(h, hb), cdiv(whole, tiles), len(gates)),
           dict(G=g, OUT=sums[0], SIZE=(n, h, whole), STRIDES=strides, BLOCK_N=block,
                TILES=tiles, REVERSE=False, TWIN=(g, sums[1], strides) if twin else None,
                # (without a twin its slot repeats the first buffer, never written: a None
                # inside a tuple argument fails Triton's compile, though the interpreter runs it)
                FOLD=(GATE_FLOOR, gates[0], gates[-1]), SHIFT_TWIN=twin, UNIT=LOG2E, HB=hb),
           key=("fold", g.dtype, g.data_ptr() % 16 == 0, n, h, whole, strides, block, tiles,
                twin, hb, g.device), num_warps=4)
    for x, made, reverse in zip(gates, sums, (False, True)):
        _FOLDED[id(x)] = (weakref.ref(x, lambda _, key=id(x): _FOLDED.pop(key, None)),
                          {(block, reverse): made})
    return gates[0], (gates[1] if twin else None)


#: the gates :func:`shared_tile_sums` names on this thread, and their sums once made
_SHARED = threading.local()


@contextlib.contextmanager
def shared_tile_sums(forward: torch.Tensor, reverse: torch.Tensor):
    """Within it (one backward's sweeps), the Hopper sweeps' tile sums of the gates ``forward``
    (the dB sweep's, summed forward in time) and ``reverse`` (the reverse sweeps' shifted gates,
    :func:`leetrepro.decay.per_token.shift_gates`) are made once, both in one launch when a sweep
    first asks (:func:`tile_gate_sums`), and read by every sweep that takes them: one launch a
    gated backward where each of its three sweeps made its own (each ~20 µs of an eager call's
    host time on an H200's host, notes/gates.md). The tensors are named by identity, held for the
    scope's length, and not changed within it; any other gates are summed as outside it."""
    prior = getattr(_SHARED, "sums", None)
    _SHARED.sums = {"gates": ((forward, False), (reverse, True)), "made": {}}
    try:
        yield
    finally:
        _SHARED.sums = prior


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
    if tables.misaligned(E):
        return "its pieces' E's base and strides must be 16-byte aligned (TMA)"
    if tables._pieces_tiles(B.shape[-1], V.shape[-1], V.dtype, dual, reverse) is None:
        return "its remainders' copies do not fit shared memory beside two ring slots"
    return None


def hopper_pieces(B, C, V, E, *, reverse: bool, dual: bool = False, rows: bool = False,
                  cu_seqlens=None) -> int | None:
    """The Hopper kernel's value columns a program holds (DC) where a gated backward's sweep
    op(B, C, V) (the dB sweep forward in time, the dV sweep in reverse) should take its pieces
    there (their row vectors E, shaped like V), else None: :data:`HOPPER_PIECES` and not the
    portable kernel forced, an sm_90 GPU and operands it takes (:func:`hopper_pieces_unfit`),
    and programs enough to busy half the SMs in one pass (one segment a lane; with
    :data:`HOPPER_PIECES_SEGMENTS` the widest DC, segments making the programs). A program
    holds as many of a lane's value columns as it can (at most :data:`PIECES_DC`), halved (down
    to 32) only while twice the programs still run in one wave: each more program a lane forms
    the chunk's scores again, and a second wave costs more than the SMs a short one leaves idle
    (128 lanes on 132 SMs: one program a lane, measured faster than two). With the Hopper kernel
    forced (:func:`force_kernel`): the widest, whatever the lanes. ``dual``
    (:data:`HOPPER_DUAL_PIECES`): the reverse sweep with the dual output, E its input, whose
    program holds the whole state (DC = d), where the plain sweep would not split; with ``rows``
    (Mamba-2's row dots, one segment a lane) by the share rule even in segments, unless
    :data:`HOPPER_DUAL_ROWS_ANY_LANES`."""
    if not tables.HOPPER_PIECES or tables._FORCED[0] == "portable" \
            or (B.shape[-1], reverse) not in tables.PIECES_DC \
            or (dual and not tables.HOPPER_DUAL_PIECES) \
            or hopper_pieces_unfit(B, C, V, E, dual=dual, reverse=reverse,
                                   cu_seqlens=cu_seqlens) is not None:
        return None
    r, d = B.shape[-1], V.shape[-1]
    one_segment = dual and rows and not tables.HOPPER_DUAL_ROWS_ANY_LANES
    if tables.HOPPER_PIECES_SEGMENTS and not one_segment:  # (segments: the widest, any lanes)
        return d if dual else tables._pieces_tiles(r, d, V.dtype, False, reverse)[0]
    # (the correctness matrix's switch reaches the pieces at its small shapes too)
    lanes = V.shape[0] * lane_heads(B, C, V)
    slots = 1 if tables._FORCED[0] == "hopper" else sm_count(V.device)
    if dual:
        return d if lanes > tables.HOPPER_DUAL_PIECES_SHARE * slots else None
    dc = tables._pieces_tiles(r, d, V.dtype, False, reverse)[0]
    while 2 * lanes * (d // dc) <= slots and dc > 32:  # (a short wave: more programs a lane)
        dc //= 2
    return dc if 2 * lanes * (d // dc) >= slots else None
