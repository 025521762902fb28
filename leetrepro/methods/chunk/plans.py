"""Chunk's launch plans: what one call of :func:`leetrepro.methods.chunk.chunk_scan` launches, decided
once per call signature and kept (:func:`launch_plan`): the portable kernel's sweep
(``kernels/chunk_scan.py``) or the Hopper kernel's (:mod:`.hopper_launch`), the repair launch of
lanes that met a NaN/Inf, the ring's counters (:func:`zeroed_counters`), and the dual output run as
two plain sweeps where that is faster (:class:`ApartPlan`).
"""
from __future__ import annotations


import torch

from ..._device import persistent
from ..._groups import lane_heads
from ...registry import on_change
from .._gpu import (NoTriton, cdiv, dot_precision, launch, refuse_interpreted_bf16, sm_count)

from . import hopper_launch, tables

try:
    from triton.runtime.errors import OutOfResources

    from ...kernels import _tiles as tiles, chunk_scan as scan_kernels
except ImportError as err:  # without Triton: a clear error when a kernel is called
    tiles = scan_kernels = NoTriton(err)
    OutOfResources = NoTriton.Error


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


def _dual_apart(B, C, V, E, gamma, kernel: str, fp32_precision, cu_seqlens=None,
                segment: int | None = None, config: dict | None = None) -> bool:
    """Whether a call with the dual output runs as two sweeps of the Hopper kernel rather than
    one dual sweep of the portable kernel: where the Hopper kernel takes both plain sweeps
    (op(B, C, V) and op(E, V, C)) but not the dual output (r ≠ d, r = d = 256, fp32) and would
    run them (``kernel="hopper"``, :func:`force_kernel`, or for ``"auto"`` the measured table's
    dual row of this call's regime and head shape). Two Hopper sweeps read C and V twice, and
    still beat the portable dual sweep (NOTES.md); two portable sweeps would not."""
    if kernel == "portable" or tables._FORCED[0] == "portable":
        return False
    precision = dot_precision(V.dtype, fp32_precision)
    call = dict(precision=precision, cu_seqlens=cu_seqlens)
    if not (hopper_launch.hopper_unfit(B, C, V, gamma, dual=E, **call) is not None
            and hopper_launch.hopper_unfit(B, C, V, gamma, **call) is None
            and hopper_launch.hopper_unfit(E, V, C, gamma, **call) is None):
        return False
    # the plain sweep's own plan: its segments decide the regime of the measured table
    batch, _, n, r = B.shape
    heads = lane_heads(B, C, V)
    cfg = tables.chunk_config(r, V.shape[-1], V.dtype, precision, gamma is not None,
                              device=V.device, config=config)
    split = tables._lanes_and_segment(cfg, batch, heads, n, V.shape[-1], segment, V.device)[1] < n
    if kernel == "auto" and tables._FORCED[0] is None:  # the table's dual row: two sweeps
        # against one
        return tables.hopper_wins(V.device, V.dtype, gamma is not None, split, n, True, r,
                                  V.shape[-1], _few(B, C, V, cu_seqlens), _grouped(B, C, V))
    return _use_hopper(kernel, B, C, V, gamma, split, **call)


def _use_hopper(kernel, B, C, V, gamma, split: bool, **call) -> bool:
    """Whether this call runs the Hopper kernel: ``kernel`` as :func:`chunk_scan` says, and for
    ``"auto"`` where it can, the kernel :func:`force_kernel` names if any, else :func:`hopper_wins`."""
    if kernel == "portable":
        return False
    unfit = hopper_launch.hopper_unfit(B, C, V, gamma, **call)
    if kernel == "hopper":
        if unfit:
            raise ValueError(f"kernel='hopper' cannot run this call: {unfit}")
        return True
    if kernel != "auto":
        raise ValueError(f"option kernel={kernel!r} is invalid; use 'auto', 'portable' or 'hopper'")
    if unfit is not None:
        return False
    if tables._FORCED[0] is not None:  # the correctness matrix's switch (force_kernel)
        return tables._FORCED[0] == "hopper"
    # (gates read the decay's rows: their work per chunk is the decay's, not the 0-1 mask's)
    decay = gamma is not None or bool(call.get("gates"))
    return tables.hopper_wins(V.device, V.dtype, decay, split, B.shape[2],
                              call.get("dual") is not None, B.shape[-1], V.shape[-1],
                              _few(B, C, V, call.get("cu_seqlens")), _grouped(B, C, V))


def _grouped(B, C, V) -> bool:
    """Whether a call reads B or C in groups (fewer heads than its lanes)."""
    heads = lane_heads(B, C, V)
    return B.shape[1] != heads or C.shape[1] != heads


def _few(B, C, V, cu_seqlens) -> bool:
    """:func:`few_lanes` of a call: its sequences × heads."""
    seqs = B.shape[0] if cu_seqlens is None else cu_seqlens.numel() - 1
    return tables.few_lanes(seqs * lane_heads(B, C, V), V.device)


def _norm_code(t: tables.Operands) -> int:
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


def _offset_halves(t: tables.Operands) -> tuple[tables.Operands, tables.Operands]:
    """A dual call's offsets (``("dual", c, β)``) as its two plain calls': O's with the constant c
    on its rows, the dual output's (op(E, V, C), :func:`_transposed`) with β on its columns."""
    _, c, beta = t.OFFSETS
    return (t._replace(E=None, O2=None, OFFSETS=("rows", c, None)),
            _transposed(t)._replace(OFFSETS=("cols", 0.0, beta)))


class LaunchPlan:
    """What :func:`chunk_scan` launches for one call signature, decided on its first call and held
    in :data:`_PLANS`, then run with each call's tensors (:meth:`run`): the kernel, the tiles and
    segments, whether the launch repairs its own non-finite lanes, the counters and ring it needs,
    and every argument of the portable kernel but the tensors (the Hopper kernel's:
    :class:`HopperLaunch`). A function of what :func:`launch_plan` keys on only."""

    def __init__(self, *, lanes: int, state_shape: tuple, grid: tuple,
                 hopper: hopper_launch.HopperLaunch | None, self_repair: bool, ring: int,
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

    def run(self, t: tables.Operands, scale: float):
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

    def repair(self, t: tables.Operands, sn, flags, scale: float) -> None:
        """The lanes ``flags`` marks non-finite, recomputed by the portable kernel so that no row
        meets a later row's NaN/Inf (kernels/chunk_scan.py); a few microseconds when none is
        (one segment a lane: all its rows, a reverse sweep's padding too)."""
        size = self.size[:5] + (self.size[0] + self.consts.BLOCK_N,)
        launch(scan_kernels.chunk_scan_kernel, (self.lanes,),
               self._arguments(t, (t.S0, sn), (None, None, flags), scale, size, False, True),
               (self.serial, True), num_warps=self.options["num_warps"], num_stages=1)

    def _sweep(self, t: tables.Operands, sn, ws, scale: float):
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
            self.self_repair, self.nflags, self.serial = False, self.lanes, next(tables._SERIALS)

    def _arguments(self, t: tables.Operands, states, ring, scale, size, split, repair) -> dict:
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

    def run(self, t: tables.Operands, scale: float):
        first, second = _offset_halves(t) if t.OFFSETS is not None else \
            (t._replace(E=None, O2=None), _transposed(t))
        sn = self.first.run(first, scale)
        self.second.run(second, scale)
        return sn


def _transposed(t: tables.Operands) -> tables.Operands:
    """The dual output's call as a plain one: op(E, V, C) into O2, from S0 transposed."""
    s0 = None if t.S0 is None else t.S0.transpose(-1, -2).contiguous()
    return t._replace(B=t.E, C=t.V, V=t.C, O=t.O2, E=None, O2=None, S0=s0)


#: launch plans by call signature (:func:`launch_plan`): a model calls one signature per layer,
#: and at short N deciding it again would cost more host time than the kernel
_PLANS: dict = {}


def launch_plan(t: tables.Operands, *, fp32_precision, segment, config, output_final_state: bool,
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
    groups = tables.groups_of(t, heads) if grouped else tables._UNGROUPED
    signature = (n, r, d, batch, heads, groups, t.V.dtype,
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
    short = t.B.shape[0] * heads * n <= tables.SELF_REPAIR_ROWS
    # (with the Hopper kernel's A/B switches: a plan keeps the constants it was made with)
    cache_key = (key, kernel, tables._FORCED[0], short, tables.HOPPER_E_RING,
                 tables.HOPPER_GATES_RING, tables.HOPPER_LATE_PAIRS, tables.HOPPER_UNHOISTED,
                 tables.HOPPER_NORM, tables.HOPPER_PIECES_SEGMENTS, tables.HOPPER_LEAN_MASK,
                 tables.HOPPER_ROWS_SUMMED, tables.HOPPER_PACKED_MASK,
                 tables.HOPPER_CUT_SPLIT, tables.HOPPER_HALF_PAIRS,
                 tables.HOPPER_COLUMN_SUMS)
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
                kernel: str, t: tables.Operands, dual: bool = False) -> bool:
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
    unfit = hopper_launch.hopper_norm_unfit(t.B, t.C, t.V, t.E)
    if kernel == "hopper" and unfit:
        raise ValueError(f"kernel='hopper' cannot run {name.split()[0]} over this call: {unfit}")
    return unfit is None


def _norm_setup(signature, t: tables.Operands, kernel: str) -> tuple[bool, int | None]:
    """``(whether the Hopper kernel takes the call's norm or offsets, its rows a segment)``, a
    ValueError where they do not fit it (:func:`_check_norm`); the portable kernel's offsets
    take one segment a lane."""
    (n, _, _, _, _, _, _, _, decay, dual, _, segment, _, varlen, has_s0, store_sn, reverse,
     gates, gate_grad, rows, norm) = signature
    hopper = bool(norm) and _check_norm(decay, gates or gate_grad or rows, has_s0 or store_sn,
                                        reverse or dual, varlen, kernel, t, dual)
    return hopper, n if norm >= 2 and not hopper else segment


def _offset_plans(t: tables.Operands, options: dict, hopper: bool) -> tuple:
    """The plans of a dual call's offsets as its two plain calls (:func:`_offset_halves`): the
    call's own where the Hopper kernel does not take it, else the portable ones whose repair
    launches stand for its."""
    return tuple(launch_plan(x, **dict(options, kernel="portable" if hopper else
                                       options["kernel"]), output_final_state=False)
                 for x in _offset_halves(t))


def _new_plan(signature, t: tables.Operands, kernel: str, short: bool) -> LaunchPlan | ApartPlan:
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
    serial = next(tables._SERIALS)
    cfg = tables.chunk_config(r, d, dtype, precision, decay, dual=dual, device=device,
                              config=config)
    asked = segment if segment is not None else cfg.get("segment")  # (popped just below)
    lanes, segment = tables._lanes_and_segment(cfg, batch, heads, n, d, segment, device)
    n_seg = cdiv(n, segment)
    if dual and (lanes != batch * heads or cfg["BLOCK_R"] < r):
        raise ValueError(f"dual needs the whole r × d state in one lane (r·d ≤ 128·128), "
                         f"got r = {r}, d = {d}")
    if gate_grad:
        if kernel == "hopper":  # (its pieces: one segment a lane, unless in segments)
            unfit = (hopper_launch._hopper_rows_unfit(t.B, t.V, rows) if rows == 2 else None) or \
                hopper_launch.hopper_pieces_unfit(t.B, t.C, t.V, t.E, dual=dual, reverse=reverse,
                                                  cu_seqlens=t.CU, outputs=(t.O, t.O2))
            if unfit:
                raise ValueError(f"kernel='hopper' cannot run this call: {unfit}")
            asked = asked if tables.HOPPER_PIECES_SEGMENTS and rows != 2 else n  # (row dots: one)
        elif segment >= n:  # (one segment: whole chunks, for the reverse sweep's padded rows)
            segment = cdiv(n, cfg["BLOCK_N"]) * cfg["BLOCK_N"]
    hopper = norm_hopper if norm else (kernel == "hopper") if gate_grad else _use_hopper(
        kernel, t.B, t.C, t.V, t.GAMMA, n_seg > 1, dual=t.E if dual else None, cu_seqlens=t.CU,
        precision=precision, outputs=(t.O, t.O2), gates=gates, rows=rows)
    # the ring: a flag per lane, its published states (lanes, 2, BLOCK_R, BLOCK_D); the Hopper
    # kernel's a flag per consumer of each unit (lane, DC value columns), the states (b·h, 2, r, d)
    h = None
    if hopper:
        dc, hopper_segment = tables.hopper_split(r=r, d=d, dtype=dtype, dual=dual,
                                                 lanes=batch * heads, n=n, slots=sm_count(device),
                                                 # (norm: one program a lane holds every column)
                                                 dc=None if norm else cfg.get("DC"), segment=asked)
        h = hopper_launch._hopper_launch(n=n, r=r, d=d, heads=heads, lanes=batch * heads,
                                         segment=hopper_segment, dc=dc, dtype=dtype, decay=decay,
                                         has_s0=has_s0, store_sn=store_sn, reverse=reverse,
                                         dual=dual, serial=serial, gates=gates, groups=groups,
                                         gate_grad=gate_grad, rows=rows, norm=_KERNEL_NORM[norm])
        ring, ws_shape = 2 * h.units, (batch * heads, 2, r, d)
        chained = h.grid[0] > h.units  # (its own segments, not the portable kernel's)
    else:
        ring, ws_shape = lanes, (lanes, 2, cfg["BLOCK_R"], cfg["BLOCK_D"])
        chained = n_seg > 1
    # A short call on the portable kernel repairs its non-finite rows within its launch (the
    # segment holding a lane's first non-finite row computes its rows again), where a repair
    # launch would add its host time; a long one keeps its kernel lean (the in-launch repair
    # slows its sweep, NOTES.md) and flags the lanes for a repair launch, as the Hopper's does.
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


on_change(_PLANS.clear)
