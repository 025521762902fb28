"""Chunk's tables and rules, no tensor touched: the portable kernel's tiles (:func:`chunk_config`,
from the table measured on this GPU), the Hopper kernel's tiles and splits (:func:`hopper_tiles`,
:func:`hopper_split`), which kernel wins where (:func:`regime`, :func:`hopper_wins`,
:func:`force_kernel`), the switches that turn each Hopper feature on (``HOPPER_*``: set them here,
``chunk.tables.HOPPER_NORM = False``; every launcher reads them from this module at call time), the
straddle kernel's tiles, and :class:`Operands`, the tensors a launch plan runs over.
"""
from __future__ import annotations

import functools
import itertools
import typing

import torch

from ...registry import on_change
from ... import tuning
from ...tuning import CHUNK_TABLE, DUAL_TABLE, HOPPER
from .._gpu import (NoTriton, cdiv, gpu_tag, next_pow2,
                    rows_for_pieces, segment_rows,
                    sm_count, wave_pieces)

try:
    from ...kernels import gate_straddle as straddle_kernels
except ImportError as err:  # without Triton: a clear error when a kernel is called
    straddle_kernels = NoTriton(err)
#: whether Triton (and so the portable kernels) imported
HAS_TRITON = not isinstance(straddle_kernels, NoTriton)


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


_UNGROUPED = (1, 1, 1, 1)


def groups_of(t, heads: int) -> tuple:
    """The heads sharing one head of B, C, V and E of a call's :class:`Operands`: the kernels'
    ``GROUPS`` (1: a head a lane, and for an absent E)."""
    return tuple(1 if x is None else heads // x.shape[1] for x in (t.B, t.C, t.V, t.E))


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
    from ..._device import SM90_SHARED_BYTES
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


#: normalised linear attention's forward (:func:`chunk_scan`'s ``norm``) on the Hopper kernel
#: where it takes the call (:func:`hopper_norm_unfit`); off: the portable kernel's sweep
HOPPER_NORM = True


def misaligned(t: torch.Tensor) -> bool:
    """Whether a tensor's base or a stride but the last is not a multiple of 16 bytes (the
    Hopper kernel's TMA takes neither)."""
    return bool(t.data_ptr() % 16 or any(st * t.element_size() % 16 for st in t.stride()[:-1]))


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


#: the plans' numbers: a plan's launches are keyed by it (everything they specialise on is a
#: function of the plan's key), a small key to hash where the plan's own is ~40 entries
_SERIALS = itertools.count()


def gate_grad_block(r: int, d: int, dtype: torch.dtype, precision: str, dual: bool,
                    device) -> int:
    """The row block (chunk) both sweeps of a gated backward take, so that their chunks are the
    same rows: the smaller of the forward-time dB sweep's (an r-column operator on d-wide rows)
    and the reverse sweep's (``dual``: dV and dC in one)."""
    return min(chunk_config(d, r, dtype, precision, True, device=device)["BLOCK_N"],
               chunk_config(r, d, dtype, precision, True, dual=dual, device=device)["BLOCK_N"])


#: whether a gated backward's sweeps take their pieces on the Hopper kernel where it can
#: (:func:`hopper_pieces`); False: the portable kernel's sweeps always (an A/B switch)
HOPPER_PIECES = True


#: whether the Hopper kernel's sweeps carrying the pieces split each lane's rows into segments
#: chained through the ring as the other sweeps do (their programs then hold the most columns
#: that fit, and take any number of lanes), rather than one segment a lane. At a 125M model's layer
#: (48 lanes, 64/64) the one-segment sweeps run 48-96 programs over all 64 chunks where γ's split
#: into 240 programs of 13 (notes/gates.md). The reverse sweep with the row dots (Mamba-2's SSD,
#: ``rows`` 2) keeps one segment a lane (the kernel asserts it; in segments it spilled 36-68 bytes
#: a thread where one segment spills none).
HOPPER_PIECES_SEGMENTS = True


#: whether the reverse sweep carrying the pieces on the Hopper kernel also writes the dual output
#: dC (r = d = 64: one sweep where two run apart otherwise; Mamba-2 at 64 × 64, 2 × 64 heads ×
#: 8192, bf16: forward + backward 1.14 ms in a graph against 1.35 with dC's sweep apart, H200,
#: notes/gates.md)
HOPPER_DUAL_PIECES = True

#: the share of the SMs a gated backward's lanes must exceed for :data:`HOPPER_DUAL_PIECES`' one
#: sweep (a program a lane holds the whole state: fewer lanes leave SMs idle where dV's sweep
#: apart splits its columns over two programs a lane). H200, bf16, 64 × 64, forward + backward
#: against 0.5: at 48 lanes (a 125M model's layer) 0.442 → 0.433 ms in a graph and about 0.3 ms
#: less host time eager (3 launches fewer); at 32 lanes (share 0.1) 0.395 → 0.428 ms, slower
#: (notes/gates.md)
HOPPER_DUAL_PIECES_SHARE = 0.3

#: whether, with :data:`HOPPER_PIECES_SEGMENTS`, the reverse sweep with the dual output that also
#: carries Mamba-2's row dots (one segment a lane: the kernel asserts it) takes the pieces at any
#: lane count as the segmented sweeps do (True), or only past :data:`HOPPER_DUAL_PIECES_SHARE` of
#: the SMs, as with one segment a lane (False): below it, a program a lane sweeps the whole
#: sequence. H200, bf16, the SSD forward + backward in a graph at 24 lanes (batch 1 of a 125M
#: Mamba-2, 64 × 64): 0.294 ms (False) against 0.392 at N 4096, 0.463 against 0.679 at 8192;
#: at 48 lanes the same launches (notes/gates.md)
HOPPER_DUAL_ROWS_ANY_LANES = False


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
#: spills) instead of the straddle kernel (``ops.gate_sweeps._in_sweeps``): Falcon-H1's SSD forward + backward
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


#: whether the Hopper kernel's gated sweeps take the mask's exponentials without subnormal
#: results (``ex2.approx.ftz``: an entry below 2^-126 is 0, where ``exp`` adds a range check and
#: two scalings an element) and the dB sweep's own pairs as the masked tile they are (their
#: diagonal cancels in the pieces' difference) instead of a select an element (``LEAN_MASK``);
#: an A/B switch
HOPPER_LEAN_MASK = True


#: whether the Hopper kernel's gated bf16 sweeps whose masked scores are only the product's
#: operand (the forward, the reverse sweeps without the dual output) drop the entries past the
#: diagonal after rounding them, one ``and`` a pair of entries on a mask made before the sweep,
#: instead of a compare and a select an entry (``PACKED_MASK``; the same bits); an A/B switch
HOPPER_PACKED_MASK = True


#: whether the Hopper kernel's bf16 sweeps carrying the gates' pieces split the state's copy
#: and the weighted v into their two exact 16-bit operands by cutting the float32 bits
#: (``CUT_SPLIT``: hi the top 16 bits, lo the rest rounded; ``chunk_hopper._split16``), three
#: instructions an entry where rounding hi, converting it back and subtracting took four; not
#: with the dual output (its O2 reads the hi copy alone); an A/B switch (on: a gated forward +
#: backward in a graph −8 % at Mamba-2's 2 × 64 heads × 8192, −4 % at gla's; H200, notes/gates.md)
HOPPER_CUT_SPLIT = True


#: whether the Hopper kernel's dB sweep (forward in time, the pieces, E's tiles in the ring, the
#: own pairs before O's store) gives each consumer half the chunk's columns of the own pairs'
#: tile over every column of E and v (``HALF_PAIRS``: ``chunk_hopper._own_half_pairs``), where
#: each took the whole tile over its half of E's columns: half the pair tile's products and
#: reductions a consumer, the same MMA work; an A/B switch (on: a gated forward + backward in a
#: graph −2 % at Mamba-2's 2 × 64 heads × 8192, −4 % at 64/64, the SSD −3 % at Zamba2's; gla's
#: 128/128 has its pairs late and is untouched; H200, notes/gates.md)
HOPPER_HALF_PAIRS = True


#: whether the half pairs' columns' sums (:data:`HOPPER_HALF_PAIRS`) are taken in a layout whose
#: threads each hold a quarter of a column's rows (``COL_SUMS``), a layout conversion through
#: 8 KB of shared memory a consumer, where the accumulator's layout reduced a column over eight
#: lane groups (shuffles) and four warps (shared memory and a barrier): a consumer's loop of the
#: dB sweep −5 % at Mamba-2's shape, −7 % at 64/64 (compiled for sm_90; dg's bits not the same:
#: its columns summed in another order), a gated forward + backward −2.5 % at Mamba-2's shape and
#: at 64/64, Zamba2's SSD −1.4 % (H200, bf16, graphs, notes/gates.md); an A/B switch
HOPPER_COLUMN_SUMS = True


#: whether the Hopper kernel's pieces' rows take a block per program, its two consumers adding
#: their parts into it (``ROWS_SUMMED``: relaxed atomics onto zeros, the same bits either way),
#: instead of a block per consumer: half the rows' buffers (a gated backward's peak at Mamba-2's
#: 2 × 64 heads × 8192, 64/64: 544 → 536 MiB, γ's 512; H200, notes/gates.md) for a zero fill and
#: 0.5-1.7 % more time in a graph; an A/B switch
HOPPER_ROWS_SUMMED = True


#: whether the Hopper kernel's reverse sweep with the dual output and the gates' pieces takes
#: E's row weights and the row dots (``rows = (w, D, RD)``, Mamba-2's dx in that sweep) where
#: it runs anyway; off, the SSD's backward keeps its row pass there
HOPPER_ROW_DOTS = True


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


#: whether a gated backward's sweeps read one set of the gates' tile sums, both directions made in
#: one launch (:func:`leetrepro.methods.chunk.hopper_launch.shared_tile_sums`), rather than a
#: launch each sweep; an A/B switch
GATE_SUMS_SHARED = True


#: whether a gated call folds its gates (the floor), shifts them for the reverse sweeps and sums
#: them within the Hopper kernel's tiles in one launch
#: (:func:`leetrepro.methods.chunk.hopper_launch.folded_gate_sums`), where each took a pass of
#: its own (the same bits; on the H200 a 125M layer's call 0.2 ms less host time); an A/B switch
GATE_FOLD_FUSED = True


#: chunks a program of the rows' gates' gradient (``kernels/gate_rows.py``) takes a step
GATE_ROWS_TILES = 16


#: heads a program of the gates' tile sums takes where their rows are not contiguous
#: (time-major gates: its loads along the heads), with GATE_ROWS_TILES // it tiles
GATE_SUMS_HEADS = 16


#: whether :func:`gate_gradient_from_rows` launches its kernel on a GPU, where the composition it
#: replaces took about twenty PyTorch passes over the rows: Mamba-2's 2 × 64 heads × 8192
#: forward + backward 1.37 ms in a graph against 1.45, eager at 64 × 64 1.97 against 2.43 (H200,
#: bf16, notes/gates.md); off, the composition (the GPU test compares the two)
GATE_ROWS_ON_GPU = True


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


# the launch tables and plans that read data/<gpu>/ are forgotten when a table is rewritten
on_change(_config.cache_clear)
