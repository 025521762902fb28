"""Chunk's forward for Hopper (sm_90) in Gluon: warp-specialised, the state split over two warp
groups.

The portable kernel (``chunk_scan.py``) holds the whole 128 × 128 fp32 state in one 8-warp program
with every tile besides it, at 255 registers and spilling (NOTES.md): its time is its own issue
rate. Here a program (a *unit*: one lane, a batch·head, and a block of DC of its D value columns;
or one segment of a unit's rows) has three partitions:

* a **loader** (the launch's 4 warps, cut to 24 registers a thread) streams the chunks' B, C tiles
  and its DC columns of V into a ring of ``STAGES`` shared-memory slots with the tensor-memory
  accelerator (TMA), each slot guarded by a *ready* and an *empty* mbarrier;
* two **consumer** warp groups (240 registers a thread each), consumer h holding columns
  [h·DH, (h+1)·DH) of the unit's block (DH = DC/2; R × DH fp32, at most 64 registers a thread:
  128 × 64 or 256 × 32), each computing its columns of every chunk's O with warp-group MMA
  (wgmma) and storing them with TMA.

Head dimensions r, d ∈ {64, 128, 256} (the launcher's ``hopper_tiles``): DC = 128 up to r = 128
(64 for d = 64), 64 at r = 256, so a state wider than one program holds (128 × 256, 256 × 256) is
split by value columns over D/DC programs; a launch may ask for fewer (``config``'s DC, down to 32:
more programs a lane, each recomputing the scores for its columns; measured slower at batch 1,
NOTES.md). They take consecutive program ids (tickets), so they
run at the same time and all but the first read the lane's B and C tiles from L2: the second axis
of parallelism, besides segments, that a short batch lacks.

Per chunk of L ≤ BLOCK_N rows, consumer h, with H its half of the state entering the chunk:

    S = b cᵀ                                 (BLOCK_N × BLOCK_N; both consumers compute it)
    O = λ^(i+1) · (b H)  +  (S ⊙ M) v[:, h]   (M[i, j] = λ^(i-j) for i ≥ j, else 0)
    H ← λ^L H + cᵀ (diag(λ^(L-1-j)) v[:, h])

H enters the MMA as a B operand, so it is copied to shared memory in the input dtype once a chunk;
S ⊙ M stays in registers as the A operand. fp16 operands made from fp32 values (H and S ⊙ M) are
scaled by a power of two so that their largest entry is near 2^14 (``HALF_RANGE``, as in
``_tiles.half_operand``); bf16 has fp32's range and skips it.

fp32 inputs run tf32 wgmma (error ~1e-3, as the portable kernel's tf32), whose 32-bit operands in
shared memory must be K-major: v's half is transposed in place in its ring slot, cᵀ enters the
state's update from registers, and H goes through shared memory in two halves of its rows; the
ring holds 2 slots of B, C, V (96 KB each) and O is staged in the slot's V tile
(:func:`_tf32_chunk`). Not with ``DUAL`` (four fp32 tiles a row block do not fit).

Segments (``SPLIT``; batch 1: too few lanes to fill the GPU), as the portable kernel chains them:
programs take tickets in the order they start (an atomic counter), ticket t = segment t // UNITS of
unit t % UNITS. A segment's consumers first sum their columns of its own state from its C and V (a
first pass, the loader streaming C and V only), wait for the previous segment's flag, publish
P_k = λ^len P_(k-1) + S_k to a two-slot ring per lane (each unit its own columns) and raise their
flag, then sweep from P_(k-1). Each consumer of each unit has its own flag, so no two wait on each
other;
a program only waits on programs already running, so nothing deadlocks. The last ticket taken
zeroes the ticket, and a unit's last segment its consumers' flags as their waits read them: every launch
leaves the counters zero (the launcher keeps them from call to call without zeroing them).

``REVERSE`` runs the operator on the rows read backwards (the backward's dV and dC, as the
portable kernel's ``REVERSE``): the chunks are the same 64-row tiles of physical rows, swept from
the last to the first, so a tile holding L rows (the last tile of a lane: L = N mod 64 or 64) has
its logical order reversed inside it: row a of the tile is logical row L-1-a of its chunk. Only
the powers of λ and the mask's direction change (``_exponents``); no coordinate is ever negative.

``DUAL`` (R = D = DC ≤ 128: one program holds the whole state) also writes O2 = op(E, V, C) for a
fourth input E shaped like V, from the same sweep (the backward's dC beside its dV, as the
portable kernel's ``DUAL``): O2's state is the transpose of this one, so consumer h computes O2's
columns [h·DH, (h+1)·DH) (rows of the state) as

    O2[:, h] = λ^(i+1) · Σ_k e[:, k] (H_k[h rows])ᵀ  +  (E vᵀ ⊙ M) c[:, h],

reading the other consumer's half of the state (H_k: consumer k's copy in shared memory) after an
mbarrier both consumers arrive on once their copies are written, and releasing it through a second
one before either is written again. The ring then holds four tiles a slot (``STAGES`` 2), and O's
and O2's staging one buffer each per consumer.

Per-token gates (``HAS_GATE``, fp16/bf16): the launcher passes each lane's gates as running sums
*within each 64-row tile, in logical order* (forward: from the tile's first row; reverse: from
its last), fp32, in base 2 (times log2 e: each exponential below is one ``ex2``), padded to
whole tiles (``leetrepro.methods.chunk.tile_gate_sums``). The
loader brings a chunk's 64 sums into its ring slot with its tiles (``G_RING``, where that costs
the ring no slot: then they arrive ``STAGES`` chunks ahead; else each consumer loads them from
L2 before it waits on the ring, and waits out their latency), a consumer reads them by rows and
by columns and takes, in place of the powers of λ, 2^(G_i) onto the entering state,
2^(G_L − G_j) into the leaving one (G_L the tile's total), 2^(G_L) the state's own decay and
2^(G_i − G_j) the mask: every exponent a difference within a tile, the later row first. A
segment's decay is the sum of its tiles' totals, summed in its first pass.

The gates' gradient's pieces (``GATE_GRAD``, a sweep with gates, fp16/bf16, one segment a lane: the
backward's dB sweep forward in time, its dV sweep in reverse, alone or with the dual output dC,
whose E is then the pieces' row vectors, read from the ring): each row's dot of its part from the
entering state with a fourth input's row (E: the forward's B in the dB sweep, its V in the dV
sweep), e_i = Σ over the consumer's columns of (b_i H)[i, ·] ⊙ E[i, ·], plus forward in time the
chunk's own pairs' part δ_i (:func:`_own_pairs`, from the masked scores times E's tile against the v
tile: one more BLOCK_N × BLOCK_N × DH wgmma), stored as float32: a block of rows' buffers per
consumer (``D/DH`` blocks), or with ``ROWS_SUMMED`` both consumers' parts added into their program's
block (``D/DC``; :func:`_put_rows`); the within-chunk running sums and the chunk totals are taken
after the sweeps (``leetrepro.methods.chunk.gate_gradient_from_rows``, one pass over both sweeps'
rows), so the chunk loop adds no scan. E's tile comes through the ring at the program's columns
(``E_RING``, where two slots of it fit shared memory), else by loads before the ring wait, whose
latency (E is read from DRAM nowhere else in the sweep) the consumers then wait out. The pieces
telescope over the chunks, so the two 16-bit roundings the sweep makes are taken back as the
portable kernel's ``EXACT`` does: the state's copy has a second copy of its remainder (one more
wgmma into O's accumulator), the weighted v a second tile of its remainder (one more into the
state's update).

V's row weights and the skip (``ROWS``, a gated forward sweep in fp16/bf16: Mamba-2's V' = dt·x
and y = o + D·x, with x as V): each chunk's weights w_j (float32, loaded by the consumers before
the ring wait, by rows and by columns) multiply the masked scores' column j and the state's
update row j, and D·v (the head's D over the output's scale, from the chunk's own v tile in the
ring) joins O's accumulator before its one store, so no V' and no second pass over O.

Rows past N are read as zeros (TMA fills them) and never stored (TMA clips them), per lane, as the
descriptors are 4-D (batch, heads, N, ·) with the inputs' own strides (time-major inputs are read
in place). A lane whose state comes out non-finite raises its flag in ``FLAGS``; the launcher
recomputes those lanes with the portable kernel's repair launch, as for the portable kernel.

Each consumer partition inlines its own copy of :func:`_consumer`: a function call anywhere in the
kernel makes ptxas serialize every wgmma (notes/gates.md). With ``LEAN_MASK`` the gates' mask
takes its exponentials without subnormal results (:func:`_exp2_ftz`) and the own pairs their tile
as masked.

Launcher: ``leetrepro.methods.chunk`` (``kernel="hopper"``); compiled without a GPU for the
register check by ``leetrepro.probes.regs --hopper``.
"""
import collections

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma,
                                                             warpgroup_mma, warpgroup_mma_wait)
from triton.language.core import _aggregate as aggregate

# Gluon is experimental and renames as it goes: Triton 3.6 has the TMA copies as
# async_copy_global_to_shared / async_copy_shared_to_global, later releases (3.9) as async_load /
# async_store (the old names raise). The same arguments either way.
_tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
_tma_store = getattr(tma, "async_store", None) or tma.async_copy_shared_to_global
# (and the barrier of a partition's warps: thread_barrier in 3.6, barrier in 3.9; a shared-memory
# view of other dtype, shape or layout: _reinterpret in 3.6, reinterpret in 3.9)
_barrier = getattr(gl, "thread_barrier", None) or gl.barrier
_PUBLIC_REINTERPRET = gl.constexpr(hasattr(gl.shared_memory_descriptor, "reinterpret"))


@gluon.jit
def _tile(bufs, i):
    """Slot i of a ring of 4-D TMA tiles (slot, 1, 1, rows, cols) as the 2-D (rows, cols) operand."""
    shape: gl.constexpr = bufs.type.shape
    return bufs.index(i).reshape([shape[3], shape[4]])


@gluon.jit
def _chunk(i, N, BLOCK_N: gl.constexpr, REVERSE: gl.constexpr):
    """The i-th chunk a lane sweeps: (its tile's first physical row, the rows it holds ≤ BLOCK_N).
    Tiles start at multiples of BLOCK_N in both directions; in reverse the first swept (the
    lane's last tile) is the one that may be short."""
    if REVERSE:
        row = (gl.cdiv(N, BLOCK_N) - 1 - i) * BLOCK_N
    else:
        row = i * BLOCK_N
    return row, gl.minimum(N - row, BLOCK_N)


@gluon.jit
def _exponents(k, length, REVERSE: gl.constexpr):
    """For rows k of a tile holding ``length`` rows: the powers of λ onto the state entering the
    chunk (rows of b: logical position + 1) and into the state leaving it (rows of c: rows after
    it in the chunk). Logical position: k, or length-1-k in reverse. Never negative: the rows a
    tile holds past N are zeros, and a negative power could overflow to Inf and make 0 × Inf."""
    if REVERSE:
        return gl.maximum(length - k, 0), k
    else:
        return k + 1, gl.maximum(length - 1 - k, 0)


@gluon.jit
def _half_scale(x, HALF_RANGE: gl.constexpr):
    """(2^-e, 2^e): the power of two that puts the largest |x| near 2^14 (fp16 operands), else 1."""
    if HALF_RANGE:
        m = gl.maximum(gl.max(gl.max(gl.abs(x), axis=1), axis=0), 1e-30)
        e = gl.minimum(gl.ceil(gl.log2(m)) - 14.0, 100.0)
        return gl.exp2(-e), gl.exp2(e)
    else:
        return 1.0, 1.0


@gluon.jit
def _chunk_gates(prog, row, acc_l: gl.constexpr, K: gl.constexpr):
    """A chunk's gates (``HAS_GATE``): the tile's running sums G by rows and by columns and its
    total G_L (the last logical row's: the tile's last row forward, its first in reverse)."""
    BLOCK_N: gl.constexpr = K.BLOCK_N
    ptr = prog.gates + row
    g_rows = gl.load(ptr + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, acc_l)))
    g_cols = gl.load(ptr + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, acc_l)))
    if K.REVERSE:
        total = gl.load(ptr)
    else:
        total = gl.load(ptr + (BLOCK_N - 1))
    return g_rows, g_cols, total


@gluon.jit
def _ring_gates(ring, s, acc_l: gl.constexpr, K: gl.constexpr):
    """:func:`_chunk_gates` from ring slot s (``G_RING``: the tile's sums came by TMA with its
    tiles), read from shared memory."""
    BLOCK_N: gl.constexpr = K.BLOCK_N
    g = ring.g.index(s).reshape([BLOCK_N])
    one: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    if K.REVERSE:
        total = gl.sum(g.slice(0, 1).load(one), axis=0)
    else:
        total = gl.sum(g.slice(BLOCK_N - 1, 1).load(one), axis=0)
    return g.load(gl.SliceLayout(1, acc_l)), g.load(gl.SliceLayout(0, acc_l)), total


@gluon.jit
def _value_weights(prog, row, length, acc_l: gl.constexpr, K: gl.constexpr):
    """``ROWS``: the chunk's V row weights w (float32, 0 past the lane's end) by rows: issued a
    chunk ahead of their use (:func:`_sweep`), their columns made from them there
    (:func:`_by_columns`)."""
    BLOCK_N: gl.constexpr = K.BLOCK_N
    ri = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, acc_l))
    return gl.load(prog.w + (row + ri).to(gl.int64) * prog.w_sn, mask=ri < length, other=0.0)


@gluon.jit
def _by_columns(w_rows, acc_l: gl.constexpr):
    """V's row weights by rows and by columns (the masked scores' columns): the second through
    shared memory, where holding both a chunk ahead took 16 more registers a thread."""
    return w_rows, gl.convert_layout(w_rows, gl.SliceLayout(0, acc_l))


@gluon.jit
def _first_pass_weights(prog, row, length, acc_l: gl.constexpr, K: gl.constexpr):
    """A first pass's chunk before its ring wait: with ``ROWS`` V's row weights by rows and by
    columns, else 0.0."""
    if K.ROWS == 1:
        return _by_columns(_value_weights(prog, row, length, acc_l, K), acc_l)
    else:
        return 0.0


@gluon.jit
def _gates_after_wait(ring, s, gates, w_v, acc_l: gl.constexpr, K: gl.constexpr):
    """A gated chunk's gates once ring slot s is ready: from the ring with ``G_RING`` (else
    ``gates``, loaded before the wait), V's row weights ``w_v`` after them with ``ROWS``."""
    if K.G_RING:
        gates = _ring_gates(ring, s, acc_l, K)
    if K.ROWS == 1:
        gates = gates + w_v
    return gates


@gluon.jit
def _exp2_ftz(x):
    """2^x (float32) by one ``ex2.approx.ftz.f32``: ``gl.exp2``'s value wherever it is at least
    2^-126, 0 below (``gl.exp2`` keeps those subnormal results by a range check and two scalings
    ptxas adds around each ``MUFU.EX2``: three instructions more an element of the gated mask)."""
    return gl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=f,f", [x],
                                     dtype=gl.float32, is_pure=True, pack=1)


@gluon.jit
def _kept(p16, keep):
    """A 16-bit tile's entries where ``keep`` (int16, loop-invariant) is all ones, +0 where it
    is 0, by one ``and.b32`` a pair of entries: the causal mask after the scores' rounding, where
    a compare and a select an entry took two instructions each (``PACKED_MASK``). The bits of
    ``where(keep, p, 0)`` rounded, whatever p holds where it is dropped (inf, NaN)."""
    return gl.inline_asm_elementwise("and.b32 $0, $1, $2;", "=r,r,r", [p16, keep],
                                     dtype=p16.dtype, is_pure=True, pack=2)


@gluon.jit
def _masked(sc, diff, lg, HAS_DECAY: gl.constexpr, gates=None, ROWS: gl.constexpr = False,
            extra=None, LEAN: gl.constexpr = False, PACKED: gl.constexpr = False):
    """A chunk's scores times its mask: λ^diff where diff ≥ 0 (the decay; 1 for the 0-1 mask;
    with ``gates`` (:func:`_chunk_gates`, base 2) 2^(G_i − G_j), and with ``ROWS`` times V's row weight
    w_j, :func:`_value_weights`), exactly 0 elsewhere; with ``extra`` (:func:`_dual_offsets`)
    the scores plus its constant c, the mask 0-1. ``LEAN`` (``K.LEAN_MASK``): the gates'
    exponentials by :func:`_exp2_ftz`; ``PACKED`` (``K.PACKED_MASK``, with ``gates``): no
    select, the caller drops the entries past the diagonal once rounded (:func:`_kept`)."""
    if extra is not None:
        return gl.where(diff >= 0, sc + extra[3], 0.0)
    elif gates is not None:
        if LEAN:
            m = _exp2_ftz(gates[0][:, None] - gates[1][None, :])
        else:
            m = gl.exp2(gates[0][:, None] - gates[1][None, :])
        if ROWS:
            m = m * gates[4][None, :]
        if PACKED:
            return sc * m
        else:
            return gl.where(diff >= 0, sc * m, 0.0)
    elif HAS_DECAY:
        return gl.where(diff >= 0, sc * gl.exp(gl.maximum(diff, 0).to(gl.float32) * lg), 0.0)
    else:
        return gl.where(diff >= 0, sc, 0.0)


@gluon.jit
def _weighted(e_t, gates, K: gl.constexpr):
    """E's tile in float32; with ``ROWS == 2`` (E = x of V' = w·x) w·x in float32 with the
    product rounded to x's dtype: V' bit for bit, as the dB sweep reads it (the gates' pieces of
    both sweeps then telescope)."""
    if K.ROWS == 2:
        return (e_t.to(gl.float32) * gates[3][:, None]).to(e_t.dtype).to(gl.float32)
    else:
        return e_t.to(gl.float32)


@gluon.jit
def _row_grad(o, e, x, v, gates, p_up):
    """``ROWS == 2``'s chunk end: O's half (dV' in the scores' units, 1/p_up) made dx's, w·dV'
    + D·dO (``gates[3]``: w by rows, ``gates[5]``: D over O's scale), and ``(e, x·dV', x·dO)``
    over this consumer's columns (``x``, ``v``: E's and dO's halves, float32)."""
    rd1 = gl.sum(x * o, axis=1) * p_up
    rd2 = gl.sum(x * v, axis=1)
    return o * gates[3][:, None] + v * (gates[5] / p_up), (e, rd1, rd2)


@gluon.jit
def _rescaled(acc, w_in, ratio, HAS_DECAY: gl.constexpr, HALF_RANGE: gl.constexpr, extra=None):
    """A chunk's state part of O (rows' powers λ^(i+1) in ``w_in``) brought to the units of its
    masked part: ``ratio`` is the state copy's scale over the scores' (1 unless fp16); with
    ``extra`` (:func:`_dual_offsets`, γ = 1, bf16) c·Σv added to each row."""
    if extra is not None:
        return acc + extra[3] * extra[0][None, :]
    elif HAS_DECAY:
        return acc * (w_in * ratio)[:, None]
    elif HALF_RANGE:
        return acc * ratio
    else:
        return acc


@gluon.jit
def _row_weights(w_in, ri, length, lg, HAS_DECAY: gl.constexpr, REVERSE: gl.constexpr,
                 gates=None):
    """The powers λ^(i+1) onto the state entering a chunk, per row ``ri`` of its tile (1.0 for
    the 0-1 mask): forward the same for every chunk (``w_in``, computed once before the sweep);
    in reverse row k of a tile of ``length`` rows takes λ^(length-k) (the first swept is short).
    With ``gates``: 2^(G_i), G in base 2."""
    if gates is not None:
        return gl.exp2(gates[0])
    elif HAS_DECAY:
        if REVERSE:
            e_in, _ = _exponents(ri, length, REVERSE)
            return gl.exp(e_in.to(gl.float32) * lg)
        else:
            return w_in
    else:
        return 1.0


@gluon.jit
def _store_half(desc, buf, x, up, scale, bb, hh, row, col, BLOCK_N: gl.constexpr,
                DH: gl.constexpr, dtype: gl.constexpr):
    """A (BLOCK_N, DH) half of an output chunk, ``x · up · scale`` (``up``: the scores' fp16
    scale), written with TMA through the staging buffer ``buf``, once the store before the last
    one issued from it has left (the last may still be in flight)."""
    tma.store_wait(pendings=1)
    buf.reshape([BLOCK_N, DH]).store((x * (up * scale)).to(dtype))
    fence_async_shared()
    _tma_store(desc, [bb, hh, row, col], buf)


@gluon.jit
def _state_operands(state, c_t, v_t, vw_s, length, lg, kr, acc_l: gl.constexpr,
                    dtype: gl.constexpr, K: gl.constexpr, gates=None, vwl_s=None):
    """For state ← λ^L state + cᵀ (diag(λ^(L-1-j)) v) over a chunk of L rows: (λ^L state, the A
    operand, the B operand). Done before any MMA of the chunk is issued, so that ptxas need not
    serialise them.

    fp16/bf16: cᵀ from shared memory and the weighted v in shared memory (v itself for the 0-1
    mask): through shared memory the weighted v holds no registers while the MMA runs (a weighted
    cᵀ as the A operand holds 32). fp32 (tf32): wgmma reads 32-bit operands from shared memory
    only K-major, and the chunk's rows (this product's K) are v's and c's outer dimension, so v's
    half is transposed in place in its ring slot (the B operand, unweighted: the masked part of O
    reads it too), and the A operand is c's tile itself, which :func:`_ct_part` loads to registers
    weighted, half the chunk's rows at a time. With ``gates`` (fp16/bf16): 2^(G_L − G_j) and
    2^(G_L) (G in base 2; rows past the lane's end weighed 0); ``vwl_s`` (``GATE_GRAD``): the weighted v's
    16-bit remainder stored there too."""
    BLOCK_N: gl.constexpr = K.BLOCK_N
    DC: gl.constexpr = K.DC
    HAS_DECAY: gl.constexpr = K.HAS_DECAY
    REVERSE: gl.constexpr = K.REVERSE
    if gates is not None:
        w_out = gl.where(kr < length, gl.exp2(gates[2] - gates[0]), 0.0)
        if K.ROWS == 1:  # (V' = w·V: row j's weight on the update's row j)
            w_out = w_out * gates[3]
        vw = v_t.load(acc_l).to(gl.float32) * w_out[:, None]
        if vwl_s is not None:
            vw16, vwl16 = _split16(vw, dtype, K.CUT_SPLIT)
            vw_s.store(vw16)
            vwl_s.store(vwl16)
        else:
            vw_s.store(vw.to(dtype))
        return state * gl.exp2(gates[2]), c_t.permute((1, 0)), vw_s
    elif dtype == gl.float32:
        if HAS_DECAY:
            state = state * gl.exp(length.to(gl.float32) * lg)
        return state, c_t, _transposed_in_place(v_t, BLOCK_N, DC // 2)
    elif HAS_DECAY:
        _, e_out = _exponents(kr, length, REVERSE)
        w_out = gl.exp(e_out.to(gl.float32) * lg)
        vw_s.store((v_t.load(acc_l).to(gl.float32) * w_out[:, None]).to(dtype))
        return state * gl.exp(length.to(gl.float32) * lg), c_t.permute((1, 0)), vw_s
    else:
        return state, c_t.permute((1, 0)), v_t


@gluon.jit
def _ct_part(c_t, part, length, lg, a_l: gl.constexpr, K: gl.constexpr):
    """Columns [part·BLOCK_N/2, (part+1)·BLOCK_N/2) of cᵀ (rows j of the chunk), times
    λ^(L-1-j), as a tf32 A operand in registers (32 a thread: a whole chunk's would be 64)."""
    BLOCK_N: gl.constexpr = K.BLOCK_N
    HAS_DECAY: gl.constexpr = K.HAS_DECAY
    REVERSE: gl.constexpr = K.REVERSE
    KH: gl.constexpr = BLOCK_N // 2
    x = c_t.slice(part * KH, KH, dim=0).permute((1, 0)).load(a_l)  # [R, BLOCK_N/2]
    if HAS_DECAY:
        j = part * KH + gl.arange(0, KH, layout=gl.SliceLayout(0, a_l))
        _, e_out = _exponents(j, length, REVERSE)
        x = x * gl.exp(e_out.to(gl.float32) * lg)[None, :]
    return x


@gluon.jit
def _transposed_in_place(v_t, ROWS: gl.constexpr, COLS: gl.constexpr):
    """A (ROWS, COLS) fp32 tile rewritten as its transpose in the same shared memory; returned as
    the (ROWS, COLS) view whose rows are contiguous (a K-major wgmma B operand with K = ROWS).
    Each thread moves 4 × 4 blocks: 16-byte reads along the columns, 16-byte writes along the
    rows."""
    ld_l: gl.constexpr = gl.BlockedLayout([4, 4], [4, 8], [4, 1], [1, 0])
    x = v_t.load(ld_l)
    _barrier()  # every warp of the group has read the tile before any overwrites it
    t_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([COLS, ROWS], gl.float32)
    if _PUBLIC_REINTERPRET:
        t_s = v_t.reinterpret(gl.float32, [COLS, ROWS], t_layout)
    else:
        t_s = v_t._reinterpret(gl.float32, [COLS, ROWS], t_layout)
    t_s.store(gl.permute(x, (1, 0)))
    return t_s.permute((1, 0))


@gluon.jit
def _tf32_chunk(b_t, c_t, v_t, h_s, state, diff, kr, w_rows, length, lg, K: gl.constexpr):
    """One chunk of a consumer with fp32 operands (tf32 wgmma): its half of O and its half of the
    state leaving the chunk. As the fp16/bf16 chunk, with what tf32 changes: the state's copy
    (the B operand of b H, K-major) goes through ``h_s`` in two halves of its rows, the second
    once the MMA reading the first is done (fp32 copies of the whole state would not fit beside
    the ring); v is transposed in place (:func:`_state_operands`); the state's update takes cᵀ
    from registers half the chunk's rows at a time (:func:`_ct_part`), the second half once the
    first's MMA is done, so that no more than 32 of its registers are held. At r = 64 the whole
    copy is 8 KB and goes in one piece (the state's rows are then one per thread's row group:
    nothing to split)."""
    BLOCK_N: gl.constexpr = K.BLOCK_N
    DC: gl.constexpr = K.DC
    HAS_DECAY: gl.constexpr = K.HAS_DECAY
    R: gl.constexpr = K.R
    DH: gl.constexpr = DC // 2
    acc_l: gl.constexpr = _acc_layout(gl.float32, DH)
    a_l: gl.constexpr = _operand_layout(gl.float32, DH)
    KH: gl.constexpr = BLOCK_N // 2
    HALVES: gl.constexpr = R > 64
    RH: gl.constexpr = R // 2 if HALVES else R
    if HALVES:
        h_lo, h_hi = gl.split(gl.permute(gl.reshape(state, [2, R // 2, DH]), (2, 1, 0)))
        h_s.store(h_lo)
    else:
        h_s.store(gl.permute(state, (1, 0)))
    fence_async_shared()
    sc = warpgroup_mma(b_t, c_t.permute((1, 0)), gl.zeros([BLOCK_N, BLOCK_N], gl.float32, acc_l),
                       use_acc=False, is_async=True)  # [BLOCK_N, BLOCK_N]
    o = warpgroup_mma(b_t.slice(0, RH, dim=1), h_s.permute((1, 0)),
                      gl.zeros([BLOCK_N, DH], gl.float32, acc_l), use_acc=False,
                      is_async=True)  # [BLOCK_N, DH]
    sc, o = warpgroup_mma_wait(num_outstanding=0, deps=(sc, o))
    pa = gl.convert_layout(_masked(sc, diff, lg, HAS_DECAY), a_l)
    if HALVES:
        h_s.store(h_hi)
    state, c_t, v_op = _state_operands(state, c_t, v_t, None, length, lg, kr, acc_l, gl.float32,
                                       K)
    fence_async_shared()
    if HALVES:
        o = warpgroup_mma(b_t.slice(R // 2, R // 2, dim=1), h_s.permute((1, 0)), o,
                          is_async=True)
    state = warpgroup_mma(_ct_part(c_t, 0, length, lg, a_l, K),
                          v_op.slice(0, KH), state, is_async=True)
    o = warpgroup_mma_wait(num_outstanding=1, deps=(o,))
    o = _rescaled(o, w_rows, 1.0, HAS_DECAY, False)
    o = warpgroup_mma(pa, v_op, o, is_async=True)
    state = warpgroup_mma_wait(num_outstanding=1, deps=(state,))
    state = warpgroup_mma(_ct_part(c_t, 1, length, lg, a_l, K),
                          v_op.slice(KH, KH), state, is_async=True)
    return warpgroup_mma_wait(num_outstanding=0, deps=(o, state))


@gluon.jit
def _state_tile(R: gl.constexpr, D: gl.constexpr, DH: gl.constexpr, acc_l: gl.constexpr):
    """Offsets of R × DH of an (R, D) state from its first column."""
    st_r = gl.arange(0, R, layout=gl.SliceLayout(1, acc_l))
    st_c = gl.arange(0, DH, layout=gl.SliceLayout(0, acc_l))
    return st_r[:, None] * D + st_c[None, :]


@gluon.jit
def _initial_state(S0, prog, col, st_tile, acc_l: gl.constexpr, K: gl.constexpr):
    """The caller's initial state (this consumer's columns from ``col``) for a lane's first
    segment, else zeros."""
    D: gl.constexpr = K.D
    DC: gl.constexpr = K.DC
    R: gl.constexpr = K.R
    state = gl.zeros([R, DC // 2], gl.float32, acc_l)
    if K.HAS_S0:
        if prog.seg == 0:
            state = gl.load(S0 + prog.lane.to(gl.int64) * R * D + col + st_tile)
    return state


#: the kernel's compile-time constants (``K``), one bundle: the tiles (rows a chunk, head
#: dimensions, the value columns a program holds, the repair launch's columns a lane, the ring's
#: slots) and the call's flags; each function binds the fields it reads to constexpr names first
#: (as ``_tiles.Constants``: a field read from the bundle is a plain Python value); ``GROUPS``
#: as ``_tiles.Constants``' (the heads sharing one head of B, C, V, E: the loader reads a
#: group's tiles for each of its heads)
Constants = collections.namedtuple(
    "Constants", "BLOCK_N R D DC FLAG_COLS STAGES HAS_DECAY HAS_S0 STORE_SN HALF_RANGE SPLIT "
                 "REVERSE DUAL HAS_GATE GROUPS GATE_GRAD E_RING G_RING ROWS LATE_PAIRS UNHOIST NORM "
                 "LEAN_MASK ROWS_SUMMED PACKED_MASK CUT_SPLIT HALF_PAIRS COL_SUMS",
    defaults=((1, 1, 1, 1),) + (False,) * 14)  # (GROUPS, then every flag after it)


@gluon.constexpr_function
def _field(x):
    """An aggregate's field: a tensor or descriptor as it is, anything else (None where the
    call has no such operand, a value Triton specialised) as a constant."""
    return x if isinstance(x, gl.base_value) else gl.constexpr(x)


@aggregate
class Program:
    """Where a program works: batch ``bb`` and head ``hh`` of its lane, the lane (batch·head) and
    unit (lane and block of DC value columns, from column ``col0``), the segment ``seg``: chunks
    ``i0 .. i0+steps-1`` of the lane's sweep, ``n`` rows, ``last`` of its lane; the lane's N and
    log λ (``lg``, 0.0 for the 0-1 mask), and its row of the gates' tile sums (``gates``, None
    without ``HAS_GATE``); with ``GATE_GRAD`` its rows of E (``e_rows``, row stride ``e_sr``)
    and its row of the pieces' first block (``dg``, blocks ``dg_blk`` apart), else None; with
    ``ROWS`` its row of V's row weights (``w``, row stride ``w_sn``) and its head's skip D
    (``skip``), else None; with ``ROWS == 2`` its row of the row dots' first half's first
    block (``rd``; a block per consumer's columns, ``rd_blk`` apart) and the halves' distance
    (``rd_half``), else None; with ``NORM`` ``(c, eps, its row of the segments' sums)``, its row
    of the denominators (``den``, ``NORM`` 1) and of the offsets (``off``, 2 with a row, 3),
    else None."""
    bb: gl.base_value
    hh: gl.base_value
    N: gl.base_value
    i0: gl.base_value
    steps: gl.base_value
    n: gl.base_value
    lane: gl.base_value
    seg: gl.base_value
    last: gl.base_value
    unit: gl.base_value
    col0: gl.base_value
    lg: gl.base_value
    gates: gl.base_value
    e_rows: gl.base_value
    e_sr: gl.base_value
    dg: gl.base_value
    dg_blk: gl.base_value
    w: gl.base_value
    w_sn: gl.base_value
    skip: gl.base_value
    rd: gl.base_value
    rd_blk: gl.base_value
    rd_half: gl.base_value
    norm: gl.base_value
    den: gl.base_value
    off: gl.base_value

    @gluon.constexpr_function
    def __init__(self, bb, hh, N, i0, steps, n, lane, seg, last, unit, col0, lg, gates,
                 e_rows=None, e_sr=None, dg=None, dg_blk=None, w=None, w_sn=None, skip=None,
                 rd=None, rd_blk=None, rd_half=None, norm=None, den=None, off=None):
        self.bb, self.hh, self.N, self.i0 = _field(bb), _field(hh), _field(N), _field(i0)
        self.steps, self.n, self.lane, self.seg = _field(steps), _field(n), _field(lane), _field(seg)
        self.last, self.unit, self.col0, self.lg = _field(last), _field(unit), _field(col0), _field(lg)
        self.gates = _field(gates)
        self.e_rows, self.e_sr, self.dg, self.dg_blk = _field(e_rows), _field(e_sr), \
            _field(dg), _field(dg_blk)
        self.w, self.w_sn, self.skip = _field(w), _field(w_sn), _field(skip)
        self.rd, self.rd_blk, self.rd_half = _field(rd), _field(rd_blk), _field(rd_half)
        self.norm, self.den, self.off = _field(norm), _field(den), _field(off)

    @gluon.jit
    def chunk(self, i, K: gl.constexpr):
        """The segment's i-th chunk: (its tile's first physical row, the rows it holds)."""
        return _chunk(self.i0 + i, self.N, K.BLOCK_N, K.REVERSE)

    @gluon.jit
    def first_pass(self, K: gl.constexpr):
        """Chunks of the first pass (the segment's own state) before the sweep: the segment's
        ``steps`` unless it is its lane's last (whose state nobody waits for) or the lane is
        whole."""
        SPLIT: gl.constexpr = K.SPLIT
        if SPLIT:
            return gl.where(self.last, 0, self.steps)
        else:
            return 0


@aggregate
class Ring:
    """The ring of ``STAGES`` shared-memory slots the loader fills and the consumers empty: a
    slot's B and C tiles, V's two halves (one a consumer), with the dual output or ``E_RING``
    E's two halves, with ``G_RING`` the chunk's gates' tile sums (``g``), and the slot's
    *ready* (the loader's TMA landed) and *empty* (both consumers are done) mbarriers. Chunk i
    of a program's stream takes slot i % STAGES; a barrier's phase flips each round of the
    ring, so the i-th wait on a slot waits for phase (i // STAGES) & 1."""
    b: gl.shared_memory_descriptor
    c: gl.shared_memory_descriptor
    v: gl.shared_memory_descriptor
    e: gl.base_value
    g: gl.base_value
    ready: gl.shared_memory_descriptor
    empty: gl.shared_memory_descriptor
    STAGES: gl.constexpr

    @gluon.constexpr_function
    def __init__(self, b, c, v, e, g, ready, empty, STAGES):
        self.b, self.c, self.v, self.e, self.g = b, c, v, _field(e), _field(g)
        self.ready, self.empty, self.STAGES = ready, empty, gl.constexpr(STAGES)

    @gluon.jit
    def producer_wait(self, i):
        """The loader: wait until chunk i's slot is empty (a fresh mbarrier counts as having
        completed the phase before 0, so the first round passes), and return the slot."""
        s = i % self.STAGES
        mbarrier.wait(self.empty.index(s), ((i // self.STAGES) & 1) ^ 1)
        return s

    @gluon.jit
    def consumer_wait(self, i):
        """A consumer: wait until chunk i's tiles have landed, and return the slot."""
        s = i % self.STAGES
        mbarrier.wait(self.ready.index(s), (i // self.STAGES) & 1)
        return s

    @gluon.jit
    def tiles(self, s, H_IDX: gl.constexpr):
        """Slot s's B and C tiles ([BLOCK_N, R]) and consumer H_IDX's half of its V tile
        ([BLOCK_N, DH]), as 2-D operands."""
        return _tile(self.b, s), _tile(self.c, s), _tile(self.v, 2 * s + H_IDX)

    @gluon.jit
    def release(self, s):
        """A consumer is done with slot s (the loader refills it once both are)."""
        mbarrier.arrive(self.empty.index(s), count=1)


@aggregate
class Operands:
    """The kernel's global operands: TMA descriptors of B, C, V, O (and with ``DUAL`` E, O2,
    else None; E with ``E_RING`` too; the gates' tile sums ``g`` with ``G_RING``), the initial
    and final states S0, SN (float32 (lanes, R, D), or None), the repair launch's lane flags,
    the ring of published states WS and its flags and ticket SYNC (None without segments) and
    the scale of the outputs."""
    b: gl.base_value
    c: gl.base_value
    v: gl.base_value
    o: gl.base_value
    e: gl.base_value
    o2: gl.base_value
    g: gl.base_value
    S0: gl.base_value
    SN: gl.base_value
    FLAGS: gl.base_value
    WS: gl.base_value
    SYNC: gl.base_value
    scale: gl.base_value

    @gluon.constexpr_function
    def __init__(self, b, c, v, o, e, o2, g, S0, SN, FLAGS, WS, SYNC, scale):
        self.b, self.c, self.v, self.o, self.e, self.o2 = b, c, v, o, _field(e), _field(o2)
        self.g = _field(g)
        self.S0, self.SN, self.FLAGS = _field(S0), _field(SN), _field(FLAGS)
        self.WS, self.SYNC, self.scale = _field(WS), _field(SYNC), _field(scale)


@aggregate
class Staging:
    """A consumer's shared memory besides the ring, both consumers' side by side: the state's
    copies (the B operand of b·H; fp32: two halves, K-major), O's staging (fp32: in the ring's V
    tiles, None here), the weighted v (fp16/bf16 with the decay), and with ``DUAL`` the copies'
    barriers (0: both written, 1: both read) and, in fp16, their scales; with ``GATE_GRAD`` the
    16-bit remainders of the state's copies and of the weighted v; with ``NORM`` (in place of the
    weighted v) the operands of Σk and c·Σv and a tile of ones (None where unused)."""
    h: gl.shared_memory_descriptor
    o: gl.base_value
    vw: gl.base_value
    hbar: gl.base_value
    hs_up: gl.base_value
    hl: gl.base_value
    vwl: gl.base_value
    z: gl.base_value
    sv: gl.base_value
    ones: gl.base_value

    @gluon.constexpr_function
    def __init__(self, h, o, vw, hbar, hs_up, hl=None, vwl=None, z=None, sv=None, ones=None):
        self.h, self.o, self.vw = h, _field(o), _field(vw)
        self.hbar, self.hs_up = _field(hbar), _field(hs_up)
        self.hl, self.vwl = _field(hl), _field(vwl)
        self.z, self.sv, self.ones = _field(z), _field(sv), _field(ones)


@gluon.jit
def _loader(prog, ring, ops, K: gl.constexpr):
    """The loader partition: a segment's first pass (C and V only), then its sweep (B, C, V,
    and E with the dual output or ``E_RING``), chunk by chunk into the ring."""
    DC: gl.constexpr = K.DC
    DH: gl.constexpr = DC // 2
    WITH_E: gl.constexpr = K.DUAL or K.E_RING
    WITH_G: gl.constexpr = K.HAS_GATE and K.G_RING
    BLOCK_N: gl.constexpr = K.BLOCK_N
    cv_bytes: gl.constexpr = ops.c.block_type.nbytes + 2 * ops.v.block_type.nbytes + \
        (ops.g.block_type.nbytes if WITH_G else 0)
    sweep_bytes: gl.constexpr = cv_bytes + ops.b.block_type.nbytes + \
        (2 * ops.e.block_type.nbytes if WITH_E else 0)
    first = prog.first_pass(K)
    # (a grouped tensor's head: the group of the lane's head, its tiles read in place)
    hb = prog.hh // K.GROUPS[0]
    hc = prog.hh // K.GROUPS[1]
    hv = prog.hh // K.GROUPS[2]
    he = prog.hh // K.GROUPS[3]
    for i in range(first + prog.steps):
        s = ring.producer_wait(i)
        if i < first:  # the segment's own state: C and V only
            row, _ = prog.chunk(i, K)
            mbarrier.expect(ring.ready.index(s), cv_bytes)
        else:
            row, _ = prog.chunk(i - first, K)
            mbarrier.expect(ring.ready.index(s), sweep_bytes)
            _tma_load(ops.b, [prog.bb, hb, row, 0], ring.ready.index(s), ring.b.index(s))
            if WITH_E:  # (E's halves at the program's columns; the dual output's: col0 = 0)
                _tma_load(ops.e, [prog.bb, he, row, prog.col0], ring.ready.index(s),
                          ring.e.index(2 * s))
                _tma_load(ops.e, [prog.bb, he, row, prog.col0 + DH], ring.ready.index(s),
                          ring.e.index(2 * s + 1))
        _tma_load(ops.c, [prog.bb, hc, row, 0], ring.ready.index(s), ring.c.index(s))
        if WITH_G:  # (the lane's gates' tile sums, a tile a row of their 4-D view)
            _tma_load(ops.g, [prog.bb, prog.hh, row // BLOCK_N, 0], ring.ready.index(s),
                      ring.g.index(s))
        _tma_load(ops.v, [prog.bb, hv, row, prog.col0], ring.ready.index(s),
                  ring.v.index(2 * s))
        _tma_load(ops.v, [prog.bb, hv, row, prog.col0 + DH], ring.ready.index(s),
                  ring.v.index(2 * s + 1))


@gluon.jit
def _consumer(prog, ring, ops, st, K: gl.constexpr, H_IDX: gl.constexpr):
    """Consumer warp group H_IDX: columns [H_IDX·DH, (H_IDX+1)·DH) of its unit's state, through
    the segment's first pass and the entering state (:func:`_entering_state`), the sweep
    (:func:`_sweep`), then the lane's repair flag and final state."""
    BLOCK_N: gl.constexpr = K.BLOCK_N
    D: gl.constexpr = K.D
    DC: gl.constexpr = K.DC
    FLAG_COLS: gl.constexpr = K.FLAG_COLS
    R: gl.constexpr = K.R
    STORE_SN: gl.constexpr = K.STORE_SN
    DH: gl.constexpr = DC // 2
    acc_l: gl.constexpr = _acc_layout(ops.b.dtype, DH)
    kr = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, acc_l))
    # this consumer's columns of a (R, D) state: from element ``col`` of a row, offsets within
    # (the column added to scalar pointers: offsets that depend on nothing but the thread are
    # made again where they are used, not held through the sweep)
    col = prog.col0 + H_IDX * DH
    first = prog.first_pass(K)  # (the ring's chunk counter runs on from the first pass)
    if K.NORM:  # (the ones Σk and Σv are products with, written once)
        ones_l: gl.constexpr = gl.BlockedLayout([1, 8], [16, 2], [4, 1], [1, 0])
        st.ones.index(H_IDX).store(gl.full([BLOCK_N, NORM_COLS], 1.0, ops.b.dtype, ones_l))
        fence_async_shared()
    state, sums = _entering_state(first, prog, ring, ops, st, kr, col, K, H_IDX)
    state = _sweep(state, sums, first, prog, ring, ops, st, kr, K, H_IDX)
    tma.store_wait(pendings=0)

    # a non-finite c or v leaves the state non-finite for good: the lane is flagged for repair
    bad = (state * 0.0) != 0.0
    # (the repair launch's lanes are the portable kernel's: FLAG_COLS value columns each)
    flag = ops.FLAGS + prog.lane * (D // FLAG_COLS) + col // FLAG_COLS
    gl.store(flag + gl.zeros([R, DH], gl.int32, acc_l), 1, mask=bad)
    if STORE_SN:
        if prog.last:  # (the offsets made again: kept through the sweep they would take registers)
            gl.store(ops.SN + prog.lane.to(gl.int64) * R * D + col +
                     _state_tile(R, D, DH, acc_l), state)


@gluon.constexpr_function
def _acc_layout(dtype, DH):
    """The wgmma accumulator layout every consumer tile shares: S and O (BLOCK_N × DH), the
    state (R × DH) (tf32 for fp32 operands: K = 8 an instruction)."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                     instr_shape=[16, DH, 8 if dtype == gl.float32 else 16])


@gluon.constexpr_function
def _operand_layout(dtype, DH):
    """The register layout of a wgmma A operand over :func:`_acc_layout` (scores, cᵀ parts)."""
    return gl.DotOperandLayout(operand_index=0, parent=_acc_layout(dtype, DH),
                               k_width=1 if dtype == gl.float32 else 2)


@gluon.jit
def _first_pass(first, prog, ring, st, kr, K: gl.constexpr, H_IDX: gl.constexpr):
    """Step 1 with segments: ``(the segment's own state from its C and V, NORM's own sums, the
    log of the segment's own decay)`` over its ``first`` chunks (none for a lane's last
    segment)."""
    BLOCK_N: gl.constexpr = K.BLOCK_N
    R: gl.constexpr = K.R
    DH: gl.constexpr = K.DC // 2
    dtype: gl.constexpr = ring.b.dtype
    acc_l: gl.constexpr = _acc_layout(dtype, DH)
    a_l: gl.constexpr = _operand_layout(dtype, DH)
    local = gl.zeros([R, DH], gl.float32, acc_l)
    own = _no_sums(K)  # (NORM: the segment's own Σk and Σv)
    seg_log = prog.n.to(gl.float32) * 0.0  # (gates: the segment's log2 decay, tiles' totals)
    for i in range(first):
        row, length = prog.chunk(i, K)
        gates = None
        if K.HAS_GATE and not K.G_RING:  # (loaded before the wait, unless in the ring)
            gates = _chunk_gates(prog, row, acc_l, K)
        w_v = _first_pass_weights(prog, row, length, acc_l, K)
        s = ring.consumer_wait(i)
        if K.HAS_GATE:
            gates = _gates_after_wait(ring, s, gates, w_v, acc_l, K)
            seg_log += gates[2]
        if dtype == gl.float32 or K.NORM:  # (no weighted v: fp32 weighs cᵀ in registers)
            vw = None
        else:
            vw = st.vw.index(H_IDX + _unhoisted(i, K))
        vwl = None
        if K.GATE_GRAD:  # (the published state exact as the sweep's: its pieces telescope)
            vwl = st.vwl.index(H_IDX + _unhoisted(i, K))
        local, c_op, v_op = _state_operands(local, _tile(ring.c, s),
                                            _tile(ring.v, 2 * s + H_IDX), vw, length,
                                            prog.lg, kr, acc_l, dtype, K, gates, vwl)
        fence_async_shared()
        if dtype == gl.float32:
            for part in gl.static_range(2):
                local = warpgroup_mma(_ct_part(c_op, part, length, prog.lg, a_l, K),
                                      v_op.slice(part * (BLOCK_N // 2), BLOCK_N // 2),
                                      local)
        else:
            local = warpgroup_mma(c_op, v_op, local)
            if K.GATE_GRAD:
                local = warpgroup_mma(c_op, vwl, local)
        if K.NORM:  # (done before the slot is released: the products read it)
            if K.NORM == 3 or K.NORM == 5:  # (a sum weighted by the chunk's column offsets)
                _store_offsets(prog, row, length,
                               st.ones.index(H_IDX + (2 if K.NORM == 5 else 0)), K)
                fence_async_shared()
            own = warpgroup_mma_wait(num_outstanding=0, deps=_sums_step(
                own, _tile(ring.c, s), v_op, st, H_IDX, K, H_IDX))
        ring.release(s)
    return local, own, seg_log


@gluon.jit
def _entering_state(first, prog, ring, ops, st, kr, col, K: gl.constexpr, H_IDX: gl.constexpr):
    """Steps 1-3 of the module docstring for this consumer's columns: with segments, the
    segment's own state from its C and V (the first pass, none for a lane's last segment), the
    state entering it from the previous segment's ring slot, and the one leaving it published;
    without, the caller's initial state (zeros without one). Returns it and ``NORM``'s sums
    entering the segment (:func:`_no_sums` where there are none)."""
    D: gl.constexpr = K.D
    DC: gl.constexpr = K.DC
    HAS_DECAY: gl.constexpr = K.HAS_DECAY
    R: gl.constexpr = K.R
    SPLIT: gl.constexpr = K.SPLIT
    DH: gl.constexpr = DC // 2
    dtype: gl.constexpr = ops.b.dtype
    acc_l: gl.constexpr = _acc_layout(dtype, DH)
    st_tile = _state_tile(R, D, DH, acc_l)  # [R, DH]
    sums = _no_sums(K)
    if SPLIT:
        # 1. the segment's own state from its C and V (none for a lane's last segment)
        local, own, seg_log = _first_pass(first, prog, ring, st, kr, K, H_IDX)
        # 2. the state entering the segment (loaded only now: the first pass holds one state),
        # published by the previous segment's program (each half of the state has its own
        # flag: the consumers never wait on each other)
        state = _initial_state(ops.S0, prog, col, st_tile, acc_l, K)
        flag_ptr = ops.SYNC + 2 * prog.unit + H_IDX
        # the lane's two slots (scalar pointer: a tile of 64-bit pointers kept alive would take
        # 128 registers)
        ring_ptr = ops.WS + prog.lane.to(gl.int64) * 2 * R * D + col
        if prog.seg > 0:
            # the flag reads seg once the previous segment has published; the unit's last
            # segment swaps it back to zero as it reads it (every earlier segment is past its own
            # wait then), so the launch leaves its flags zero
            after = prog.seg - prog.seg * prog.last.to(gl.int32)
            flag = gl.atomic_cas(flag_ptr, prog.seg, after, sem="acquire")
            while flag != prog.seg:
                flag = gl.atomic_cas(flag_ptr, prog.seg, after, sem="acquire")
            # .cg: from L2, never a stale L1 line of an earlier use of the ring slot
            state = gl.load(ring_ptr + ((prog.seg - 1) % 2) * R * D + st_tile,
                            cache_modifier=".cg")
        if K.NORM:  # (Σk and Σv of the segments before it, each published apart)
            if prog.seg > 0:
                sums = _sums_before(prog, col, K, H_IDX)
        # 3. publish the state leaving it, P_k = λ^len P_(k-1) + S_k, then raise flag k+1
        if not prog.last:
            if K.NORM:
                _publish_sums(own, prog, col, K, H_IDX)
            if K.HAS_GATE:
                local += state * gl.exp2(seg_log)
            elif HAS_DECAY:
                local += state * gl.exp(prog.n.to(gl.float32) * prog.lg)
            else:
                local += state
            gl.store(ring_ptr + (prog.seg % 2) * R * D + st_tile, local)
            _barrier()  # every thread's part is written before the flag rises
            gl.atomic_xchg(flag_ptr, prog.seg + 1, sem="release")
    else:
        state = _initial_state(ops.S0, prog, col, st_tile, acc_l, K)
    return state, sums


@gluon.jit
def _own_mask(ri, cj, K: gl.constexpr):
    """What a chunk's own mask is made from, [BLOCK_N, BLOCK_N] for tile rows ``ri`` and columns
    ``cj``: the logical rows' differences i − j (λ^(i-j) where i ≥ j: tile rows ri ≥ cj, or
    ri ≤ cj in reverse), or with ``PACKED_MASK`` (their only use then) the 16-bit mask
    :func:`_kept` takes, all ones where i ≥ j."""
    if K.REVERSE:
        diff = cj[None, :] - ri[:, None]
    else:
        diff = ri[:, None] - cj[None, :]
    if K.PACKED_MASK:
        return gl.where(diff >= 0, -1, 0).to(gl.int16)
    else:
        return diff


@gluon.jit
def _sweep(state, sums, first, prog, ring, ops, st, kr, K: gl.constexpr, H_IDX: gl.constexpr):
    """Step 4: the segment's chunks, O's columns of this consumer (and with ``DUAL`` O2's) stored
    as they come, the state carried on; returns the state leaving the segment."""
    BLOCK_N: gl.constexpr = K.BLOCK_N
    DC: gl.constexpr = K.DC
    DUAL: gl.constexpr = K.DUAL
    DH: gl.constexpr = DC // 2
    acc_l: gl.constexpr = _acc_layout(ops.b.dtype, DH)
    ri = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, acc_l))  # [BLOCK_N] rows
    diff = _own_mask(ri, gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, acc_l)), K)
    w_in = _forward_powers(ri, prog, K)
    col = prog.col0 + H_IDX * DH
    w_next = 0.0
    if K.ROWS:  # (the row weights a chunk ahead: their load's latency behind a chunk's work)
        row, length = prog.chunk(0, K)
        w_next = _value_weights(prog, row, length, acc_l, K)
    for j in range(prog.steps):
        row, length = prog.chunk(j, K)
        gates = None
        e_t = None
        if K.HAS_GATE and not K.G_RING:  # (loaded before the wait, unless in the ring)
            gates = _chunk_gates(prog, row, acc_l, K)
        if K.GATE_GRAD and not (DUAL or K.E_RING):  # (E's tile, likewise, unless in the ring)
            e_t = _piece_rows(prog, row, length, col, ri, acc_l, DH)
        if K.ROWS:  # (E's and O's row weights with ROWS 2: loaded in the chunk that used them
            # the sweep took 0.12 ms more at Zamba2's shape, H200, notes/gates.md)
            w_v = w_next
            row_next, length_next = prog.chunk(j + 1, K)  # (past the segment: none read)
            w_next = _value_weights(prog, row_next, gl.minimum(length_next, (prog.steps - 1 - j) *
                                                               BLOCK_N), acc_l, K)
        s = ring.consumer_wait(first + j)  # (the ring's chunk counter runs on from the first pass)
        if K.HAS_GATE and K.G_RING:
            gates = _ring_gates(ring, s, acc_l, K)
        if K.ROWS == 1:  # (the skip over O's stored scale: O·scale + D·v is stored)
            gates = gates + _by_columns(w_v, acc_l) + (prog.skip / ops.scale,)
        elif K.ROWS == 2:
            gates = gates + (w_v, 0.0, prog.skip / ops.scale)
        if K.NORM and K.NORM != 5:  # (the normaliser's and the offsets' own chunks)
            o, state, sums = _normalised_chunk(state, sums, ring, st, s, diff, prog, row, length,
                                               K, H_IDX, j)
            p_up, e = 1.0, 0.0
        else:
            aux = e_t
            if K.NORM == 5:  # (the dual output's offsets)
                aux = (sums, _dual_offsets(sums, prog, row, length, st, K, H_IDX))
            o, state, p_up, h_up, w_rows, e = _chunk_step(state, ring, st, s, diff, kr,
                                                          (w_in, ri), length, prog.lg, K, H_IDX,
                                                          j, gates, aux)
            if K.NORM == 5:  # (the sums past the chunk, where the pieces' rows would be)
                sums, e = e, 0.0
        if K.ROWS == 2:  # (this consumer's columns' part of the rows' dots, in a block of its
            # own, summed after the sweep: Gluon's atomics default to acquire-release, which
            # took the sweep from 0.50 to 1.10 ms at Zamba2's shape, notes/gates.md)
            e, rd1, rd2 = e
            rd = prog.rd + (col // DH) * prog.rd_blk + row + ri
            gl.store(rd, rd1 * ops.scale, mask=ri < length)
            gl.store(rd + prog.rd_half, rd2, mask=ri < length)
        LATE: gl.constexpr = K.LATE_PAIRS  # (with the pieces forward in time only)
        if K.GATE_GRAD and not LATE:
            _put_rows(prog, col, row + ri, e, ri < length, K)
        o_s = _staging_of(ring, st, s, j, K, H_IDX)
        _store_half(ops.o, o_s, o, p_up, ops.scale, prog.bb, prog.hh, row, col, BLOCK_N, DH,
                    ops.b.dtype)
        if LATE:
            e = _late_own_pairs(ring, s, e, diff, K, H_IDX)
            _put_rows(prog, col, row + ri, e, ri < length, K)
        if ops.b.dtype == gl.float32:  # the slot is released once the store has read it
            tma.store_wait(pendings=0)
            ring.release(s)
        if DUAL:
            _dual_step(ring, ops, st, s, diff, w_rows, h_up, prog, row, K, H_IDX, j, gates,
                       aux[1] if K.NORM == 5 else None)
    return state


@gluon.jit
def _put_rows(prog, col, at, e, mask, K: gl.constexpr):
    """This consumer's part e of the pieces' rows ``at`` (float32, a row each): into a block of
    its own (``col // DH``), or with ``ROWS_SUMMED`` added into its program's block (``col //
    DC``, zeros before the sweep) with relaxed atomics. Two addends onto zero give the same bits
    in either order, so dg stays deterministic; relaxed, the add waits on nothing (Gluon's default
    acquire-release ordered every earlier access: notes/gates.md)."""
    if K.ROWS_SUMMED:
        gl.atomic_add(prog.dg + (col // K.DC) * prog.dg_blk + at, e, mask=mask, sem="relaxed")
    else:
        gl.store(prog.dg + (col // (K.DC // 2)) * prog.dg_blk + at, e, mask=mask)


@gluon.jit
def _copy_read(st, j, h_up, K: gl.constexpr, H_IDX: gl.constexpr):
    """``DUAL``: wait until the other consumer has read this one's copy (and in fp16 its scale)
    of the chunk before, then store this chunk's scale."""
    mbarrier.wait(st.hbar.index(1), (j & 1) ^ 1)
    if K.HALF_RANGE:
        R: gl.constexpr = K.R
        acc_l: gl.constexpr = _acc_layout(gl.float16, K.DC // 2)
        st.hs_up.index(H_IDX).store(gl.zeros([R], gl.float32, gl.SliceLayout(1, acc_l)) + h_up)


@gluon.jit
def _all_done(o, state, sums, e, K: gl.constexpr):
    """The chunk's last MMAs waited on: (O, the state, e), with ``NORM`` 5 the sums' products
    too, returned in e's place."""
    if K.NORM == 5:
        o, state, z, sv = warpgroup_mma_wait(num_outstanding=0, deps=(o, state, sums[0], sums[1]))
        return o, state, (z, sv)
    else:
        o, state = warpgroup_mma_wait(num_outstanding=0, deps=(o, state))
        return o, state, e


@gluon.jit
def _forward_powers(ri, prog, K: gl.constexpr):
    """The rows' powers λ^(i+1) onto the state entering a chunk forward in time, the same for
    every chunk (:func:`_row_weights`; in reverse they follow its length), else 1.0."""
    BLOCK_N: gl.constexpr = K.BLOCK_N
    if K.HAS_DECAY and not K.REVERSE:
        e_in, _ = _exponents(ri, BLOCK_N, False)
        return gl.exp(e_in.to(gl.float32) * prog.lg)
    else:
        return 1.0


@gluon.jit
def _normalised_chunk(state, sums, ring, st, s, diff, prog, row, length, K: gl.constexpr,
                      H_IDX: gl.constexpr, j):
    """A chunk of ``NORM`` 1-3 (:func:`_norm_step`, divided by its denominators, which the first
    consumer stores, or :func:`_offset_step`): (O's half, the state, the sums past it)."""
    if K.NORM == 1:
        o, state, sums, den = _norm_step(state, sums, ring, st, s, diff, prog, K, H_IDX, j)
        den = den + (prog.norm[0] * row.to(gl.float32) + prog.norm[1])
        if H_IDX == 0:  # (both consumers have the same denominators: one stores them)
            BLOCK_N: gl.constexpr = K.BLOCK_N
            ri = gl.arange(0, BLOCK_N, layout=den.type.layout)
            gl.store(prog.den + row + ri, den, mask=ri < length)
        return o / den[:, None], state, sums
    else:
        return _offset_step(state, sums, ring, st, s, diff, prog, row, length, K, H_IDX, j)


@gluon.jit
def _dual_offsets(sums, prog, row, length, st, K: gl.constexpr, H_IDX: gl.constexpr):
    """``NORM`` 5 (the dual output's offsets): β's tile for this chunk's sums stored, and
    ``(Σv by O's columns, Σ β_i c_i by O2's, β by columns, c)`` for :func:`_chunk_step` and
    :func:`_dual_step`."""
    acc_l: gl.constexpr = _acc_layout(gl.bfloat16, K.DC // 2)
    _store_offsets(prog, row, length, st.ones.index(2 + H_IDX), K)
    return (gl.convert_layout(_sum_rows(sums[1], False), gl.SliceLayout(0, acc_l)),
            gl.convert_layout(_sum_rows(sums[0], True), gl.SliceLayout(0, acc_l)),
            _offsets(prog, row, length, gl.SliceLayout(0, acc_l), K), prog.norm[0])


@gluon.jit
def _piece_rows(prog, row, length, col, ri, acc_l: gl.constexpr, DH: gl.constexpr):
    """E's [BLOCK_N, DH] tile at this consumer's columns from ``col`` (``GATE_GRAD``), in O's
    accumulator layout, rows past the lane's end zeros."""
    cols = gl.arange(0, DH, layout=gl.SliceLayout(0, acc_l))
    ptr = prog.e_rows + (row + ri).to(gl.int64)[:, None] * prog.e_sr + (col + cols)[None, :]
    return gl.load(ptr, mask=(ri < length)[:, None], other=0.0)


@gluon.jit
def _unhoisted(j, K: gl.constexpr):
    """With ``UNHOIST``, 0 at every chunk ``j`` of a sweep (j < 2³⁰) in a form the compiler
    cannot prove constant, else 0. A consumer's staging buffers are indexed by its constant group
    plus this: with ``UNHOIST`` their shared-memory addresses and MMA descriptors are formed
    where they are used, a few integer instructions a chunk. Indexed by the constant alone, they
    are formed once before the loop and held through it in 64-bit registers; where the state, O
    and the scores need those, they spill and are reloaded on the chunk's chain (the gated dB
    sweep at r = d = 128, bf16, sm_90: 452 → 16 bytes of spills a thread). Where nothing spills
    the integer instructions are the price alone (:data:`leetrepro.methods.chunk.tables.HOPPER_UNHOISTED`
    says where it is on)."""
    if K.UNHOIST:
        return j >> 30
    else:
        return 0


@gluon.jit
def _split16(x, dtype: gl.constexpr, CUT: gl.constexpr, PRMT: gl.constexpr = False):
    """A float32 tile as two 16-bit tiles (hi, lo), hi + lo = x to 2^-16 of |x| (the pieces'
    exact products, ``EXACT``). With ``CUT`` (bf16: ``K.CUT_SPLIT``) hi is x's top 16 bits, whose
    conversion is exact, and lo the rest (exact in float32, one ``and`` and one subtraction)
    rounded; ``PRMT`` packs hi from x's top halves, one ``prmt`` a pair in place of the
    conversion (the state's copy: at r = d = 128 the dB sweep spilled 48 bytes without it, and
    the weighted v's tile took 32 instructions more with it). Else hi is rounded to nearest,
    converted back alone and subtracted: two instructions more an entry. A cut hi is below x by
    up to a bf16 unit in the last place, which lo holds, so only the sum of both products may
    read it (``DUAL``'s O2 reads the hi copy alone: it never cuts)."""
    if CUT:
        hi = (x.to(gl.int32, bitcast=True) & -65536).to(gl.float32, bitcast=True)
        if PRMT:
            hi16 = gl.inline_asm_elementwise("prmt.b32 $0, $1, $2, 0x7632;", "=r,r,r", [x],
                                             dtype=gl.bfloat16, is_pure=True, pack=2)
        else:
            hi16 = hi.to(dtype)
        return hi16, (x - hi).to(dtype)
    else:
        hi16 = x.to(dtype)
        return hi16, (x - hi16.to(gl.float32)).to(dtype)


@gluon.jit
def _store_copies(state, h_down, st, hz, dtype: gl.constexpr, EXACT: gl.constexpr,
                  CUT: gl.constexpr):
    """The state entering a chunk as this consumer's 16-bit copy (times ``h_down``), and with
    ``EXACT`` (the pieces) its remainder as a second copy (:func:`_split16`, ``CUT``); returns
    the weighted v's remainder buffer (``EXACT``) or None. ``hz``: this consumer's index into
    the staging buffers (:func:`_unhoisted`)."""
    scaled = state * h_down
    vwl_s = None
    if EXACT:
        h16, hl16 = _split16(scaled, dtype, CUT, True)
        st.h.index(hz).store(h16)  # [R, DH]
        st.hl.index(hz).store(hl16)
        vwl_s = st.vwl.index(hz)
    else:
        st.h.index(hz).store(scaled.to(dtype))
    return vwl_s


@gluon.jit
def _chunk_mmas(b_t, c_t, v_t, update, state, st, e_t, K: gl.constexpr, hz):
    """A 16-bit chunk's products, issued asynchronously in this order, one group each: the
    scores b cᵀ; forward in time with the pieces, E's tile against the v tile (the chunk's own
    pairs' w_i·v_j over this consumer's columns; else 0.0 stands for it); b H from the state's
    copy (and its remainder's, ``GATE_GRAD``); the state's update from ``update = (cᵀ, weighted
    v)``, with ``GATE_GRAD`` the weighted v's remainder third (``hz``: this consumer's staging
    index, :func:`_unhoisted`). Returns (scores, w vᵀ, O's part from the state, state)."""
    BLOCK_N: gl.constexpr = K.BLOCK_N
    DH: gl.constexpr = K.DC // 2
    EXACT: gl.constexpr = K.GATE_GRAD
    dtype: gl.constexpr = b_t.dtype
    acc_l: gl.constexpr = _acc_layout(dtype, DH)
    sc = warpgroup_mma(b_t, c_t.permute((1, 0)), gl.zeros([BLOCK_N, BLOCK_N], gl.float32, acc_l),
                       use_acc=False, is_async=True)  # [BLOCK_N, BLOCK_N]
    wv = 0.0
    if EXACT and not K.REVERSE and not K.LATE_PAIRS:
        if K.HALF_PAIRS:  # (e_t: :func:`_half_pair_tiles`' both operands)
            wv = _half_pairs_mma(e_t, K)
        else:
            wv = _pairs_mma(e_t, v_t, K)
    o = warpgroup_mma(b_t, st.h.index(hz), gl.zeros([BLOCK_N, DH], gl.float32, acc_l),
                      use_acc=False, is_async=True)  # [BLOCK_N, DH]
    if EXACT:
        o = warpgroup_mma(b_t, st.hl.index(hz), o, is_async=True)
    state = warpgroup_mma(update[0], update[1], state, is_async=True)  # [R, DH]
    if EXACT:
        state = warpgroup_mma(update[0], update[2], state, is_async=True)
    return sc, wv, o, state


@gluon.jit
def _pairs_mma(e_t, v_t, K: gl.constexpr):
    """E's tile against the v tile, w_i·v_j over this consumer's columns ([BLOCK_N, BLOCK_N],
    issued asynchronously): the chunk's own pairs' second factor. E from the ring (``E_RING``)
    or from registers in O's accumulator layout, taken into the A operand's."""
    BLOCK_N: gl.constexpr = K.BLOCK_N
    DH: gl.constexpr = K.DC // 2
    dtype: gl.constexpr = v_t.dtype
    if not K.E_RING:
        e_t = gl.convert_layout(e_t, _operand_layout(dtype, DH))
    return warpgroup_mma(e_t, v_t.permute((1, 0)),
                         gl.zeros([BLOCK_N, BLOCK_N], gl.float32, _acc_layout(dtype, DH)),
                         use_acc=False, is_async=True)


@gluon.jit
def _own_pairs(pairs, diff, LEAN: gl.constexpr = False):
    """Forward time, a chunk's own pairs' part of the pieces, per row s: δ_s = Σ_(j<s) pairs[s, j]
    − Σ_(i>s) pairs[i, s] (fp32), whose sum over the rows from t to the chunk's end is
    Σ_(i≥t) Σ_(j<t) pairs[i, j], the pairs straddling t (that sum is taken after the sweep,
    :func:`leetrepro.methods.chunk.gate_gradient_from_rows`); over the whole chunk δ sums to 0,
    so the chunk's total is unchanged. Two reductions where a scan along both axes was the
    portable kernel's. ``pairs`` is 0 above the diagonal (the masked scores times w vᵀ); with
    ``LEAN`` its diagonal is kept in both sums, where it cancels, instead of a select an
    element."""
    lower = pairs if LEAN else gl.where(diff > 0, pairs, 0.0)
    cols = gl.sum(lower, axis=0)
    return gl.sum(lower, axis=1) - gl.convert_layout(cols, gl.SliceLayout(1, pairs.type.layout))


@gluon.jit
def _half_pairs_mma(tiles, K: gl.constexpr):
    """``HALF_PAIRS``: w_i·v_j over every column of E and v for the rows j of this consumer's
    half of the chunk ([BLOCK_N, BLOCK_N/2], issued asynchronously, two groups), from
    :func:`_half_pair_tiles`' ``tiles``."""
    BLOCK_N: gl.constexpr = K.BLOCK_N
    HALF: gl.constexpr = BLOCK_N // 2
    e_t, v_t = tiles
    dtype: gl.constexpr = e_t[0].dtype
    acc = gl.zeros([BLOCK_N, HALF], gl.float32, _acc_layout(dtype, HALF))
    acc = warpgroup_mma(e_t[0], v_t[0].permute((1, 0)), acc, use_acc=False, is_async=True)
    return warpgroup_mma(e_t[1], v_t[1].permute((1, 0)), acc, is_async=True)


@gluon.jit
def _half_pair_tiles(ring, s, H_IDX: gl.constexpr, K: gl.constexpr):
    """``HALF_PAIRS``: (both consumers' E tiles of ring slot s, the rows of this consumer's half
    of the chunk in both v tiles), :func:`_half_pairs_mma`'s operands."""
    HALF: gl.constexpr = K.BLOCK_N // 2
    return ((_tile(ring.e, 2 * s), _tile(ring.e, 2 * s + 1)),
            (_tile(ring.v, 2 * s).slice(H_IDX * HALF, HALF),
             _tile(ring.v, 2 * s + 1).slice(H_IDX * HALF, HALF)))


@gluon.jit
def _chunk_own_pairs(p, wv, diff, K: gl.constexpr, H_IDX: gl.constexpr):
    """Forward in time with the pieces, once the pairs' product ``wv`` is waited on: this
    consumer's part of the own pairs' δ from the masked scores ``p`` (:func:`_own_pairs`, or
    with ``HALF_PAIRS`` :func:`_own_half_pairs`)."""
    wv = warpgroup_mma_wait(num_outstanding=4, deps=(wv,))
    if K.HALF_PAIRS:
        return _own_half_pairs(p, wv, K.LEAN_MASK, H_IDX, K.COL_SUMS)
    else:
        return _own_pairs(p * wv, diff, K.LEAN_MASK)


@gluon.jit
def _own_half_pairs(p, wv, LEAN: gl.constexpr, H_IDX: gl.constexpr, COLS: gl.constexpr = False):
    """``HALF_PAIRS``: :func:`_own_pairs`' δ from this consumer's half of the columns, the
    masked scores ``p`` ([BLOCK_N, BLOCK_N], their half taken in registers) times ``wv``
    (:func:`_half_pairs_mma`'s, every column of E and v; without ``LEAN`` the half's
    diagonal dropped by its own indices): its columns' sums whole, its rows' over
    its half (the other consumer adds the rest into the same rows, :func:`_put_rows`). Half of
    the pair tile's products and reductions a consumer, where each reduced a whole tile over
    its half of E's columns. With ``COLS`` (``COL_SUMS``) the columns' sums are taken in a
    layout whose threads each hold a quarter of a column's rows: the sum in the thread and
    across four lanes, where the accumulator's layout spread a column over eight lane groups
    and four warps (24 shuffles and a pass through shared memory a thread; 8 KB of scratch a
    consumer instead)."""
    BLOCK_N: gl.constexpr = p.shape[0]
    HALF: gl.constexpr = BLOCK_N // 2
    lo, hi = gl.split(gl.permute(gl.reshape(p, [BLOCK_N, 2, HALF]), (0, 2, 1)))
    if H_IDX == 0:  # (the split is in registers: the accumulator's columns' top bit is one)
        half = lo
    else:
        half = hi
    acc_l: gl.constexpr = wv.type.layout
    pairs = gl.convert_layout(half, acc_l) * wv
    if not LEAN:
        ri = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, acc_l))
        cj = H_IDX * HALF + gl.arange(0, HALF, layout=gl.SliceLayout(0, acc_l))
        pairs = gl.where(ri[:, None] > cj[None, :], pairs, 0.0)
    rows = gl.convert_layout(gl.sum(pairs, axis=1), gl.SliceLayout(1, p.type.layout))
    if COLS:
        cols = gl.sum(gl.convert_layout(pairs, gl.BlockedLayout([BLOCK_N // 4, 1], [4, 8], [1, 4],
                                                                [0, 1])), axis=0)
    else:
        cols = gl.sum(pairs, axis=0)
    if H_IDX == 0:  # (its columns' sums at its rows of the chunk, zeros at the other half's)
        both = gl.join(cols, gl.zeros_like(cols))  # [HALF, 2]
    else:
        both = gl.join(gl.zeros_like(cols), cols)
    cols = gl.reshape(gl.permute(both, (1, 0)), [BLOCK_N])
    return rows - gl.convert_layout(cols, gl.SliceLayout(1, p.type.layout))


@gluon.jit
def _late_own_pairs(ring, s, late, diff, K: gl.constexpr, H_IDX: gl.constexpr):
    """``LATE_PAIRS``: the rows' pieces of chunk s with the chunk's own pairs added once O's
    half has left for its store, ``late = (e, p, E's tile)`` from :func:`_chunk_step` (E's tile
    in O's accumulator layout; with ``E_RING`` read again from the ring slot, released after
    the pairs' MMA). The own
    pairs' 64 × 64 accumulator is then never live beside O's (at r = d = 128 forward in time
    that took the sweep's spills from 808 to 452 bytes a thread, bf16, compiled for sm_90), at
    the price of its MMA waited on in the chunk's chain."""
    e, p, e_t = late
    if K.E_RING:
        e_t = _tile(ring.e, 2 * s + H_IDX)
    wv = _pairs_mma(e_t, _tile(ring.v, 2 * s + H_IDX), K)
    wv = warpgroup_mma_wait(num_outstanding=0, deps=(wv,))
    ring.release(s)
    return e + _own_pairs(p * wv, diff, K.LEAN_MASK)


@gluon.jit
def _chunk_step(state, ring, st, s, diff, kr, w_in, length, lg, K: gl.constexpr,
                H_IDX: gl.constexpr, j, gates, aux=None):
    """Chunk j (ring slot s) of this consumer: (its halves of O and of the state leaving it, O's
    fp16 scale, the state copy's, the rows' powers onto the entering state, the rows' pieces e:
    0.0 without ``GATE_GRAD``, ``(e, p, E's tile)`` with ``LATE_PAIRS``). ``w_in = (forward
    powers, rows)`` (:func:`_row_weights`); ``gates``: :func:`_chunk_gates`' or None; ``aux``:
    E's tile (``GATE_GRAD``: e its dot with each row's part from the entering state), or ``NORM``
    5's ``(sums, extra)`` (:func:`_dual_offsets`; the sums come back as e)."""
    DUAL: gl.constexpr = K.DUAL
    HALF_RANGE: gl.constexpr = K.HALF_RANGE
    HAS_DECAY: gl.constexpr = K.HAS_DECAY
    REVERSE: gl.constexpr = K.REVERSE
    WEIGHTED: gl.constexpr = K.HAS_DECAY or K.HAS_GATE
    DH: gl.constexpr = K.DC // 2
    dtype: gl.constexpr = ring.b.dtype
    acc_l: gl.constexpr = _acc_layout(dtype, DH)
    a_l: gl.constexpr = _operand_layout(dtype, DH)
    b_t, c_t, v_t = ring.tiles(s, H_IDX)
    hz = H_IDX + _unhoisted(j, K)
    # the state entering the chunk as an operand in shared memory, then its own decay: every
    # register the MMAs below write is settled before the first is issued (ptxas serialises none)
    h_down, h_up = _half_scale(state, HALF_RANGE)
    if DUAL:  # the other consumer has read this copy (and its scale) of the chunk before
        _copy_read(st, j, h_up, K, H_IDX)
    e, p_up, w_rows = 0.0, 1.0, 1.0  # (a tuple returned holds no bare None)
    # (E's tile in the ring with GATE_GRAD: read where it is used)
    e_t = _tile(ring.e, 2 * s + H_IDX) if K.GATE_GRAD and (DUAL or K.E_RING) else aux
    if dtype == gl.float32:
        w_rows = _row_weights(w_in[0], w_in[1], length, lg, HAS_DECAY, REVERSE)
        o, state = _tf32_chunk(b_t, c_t, v_t, st.h.index(hz), state, diff, kr, w_rows, length, lg, K)
    else:
        # (with the pieces: each 16-bit rounding's remainder a second operand, MMAs two more)
        EXACT: gl.constexpr = K.GATE_GRAD
        PAIRS: gl.constexpr = EXACT and not REVERSE and not K.LATE_PAIRS
        vwl_s = _store_copies(state, h_down, st, hz, dtype, EXACT, K.CUT_SPLIT)
        state, c_op, v_op = _state_operands(state, c_t, v_t, st.vw if K.NORM else st.vw.index(hz),
                                            length, lg, kr, acc_l, dtype, K, gates, vwl_s)
        fence_async_shared()
        if DUAL:  # this consumer's copy is written (mbarrier.arrive syncs its warps first)
            mbarrier.arrive(st.hbar.index(0), count=1)
        update = (c_op, v_op)
        if EXACT:
            update = (c_op, v_op, vwl_s)
        pair_t = _half_pair_tiles(ring, s, H_IDX, K) if K.HALF_PAIRS else e_t
        sc, wv, o, state = _chunk_mmas(b_t, c_t, v_t, update, state, st, pair_t, K, hz)
        NS: gl.constexpr = 2 if K.NORM == 5 else 0  # (the sums' two products, issued last)
        sums = _sums_step(aux[0], c_t, v_t, st, hz, K, H_IDX) if K.NORM == 5 else aux
        # (the MMAs issued after each one waited on: one a group)
        sc = warpgroup_mma_wait(num_outstanding=(4 + K.HALF_PAIRS if EXACT else 2) + NS, deps=(sc,))
        # the mask recomputed per chunk: 32 exponentials a thread cost less than the 32
        # registers that keeping it would take from the state's group
        extra = aux[1] if K.NORM == 5 else None  # (NORM 5: the scores' constant, c·Σv)
        p = _masked(sc, diff, lg, HAS_DECAY, gates, K.ROWS == 1, extra, K.LEAN_MASK,
                    K.PACKED_MASK)
        if PAIRS:
            e = _chunk_own_pairs(p, wv, diff, K, H_IDX)
        p_down, p_up = _half_scale(p, HALF_RANGE)
        o = warpgroup_mma_wait(num_outstanding=(2 if EXACT else 1) + NS, deps=(o,))
        w_rows = _row_weights(w_in[0], w_in[1], length, lg, HAS_DECAY, REVERSE, gates)
        o = _rescaled(o, w_rows, h_up / p_up, WEIGHTED, HALF_RANGE, extra)
        if EXACT:  # (o is the part from the state in the scores' units here: 1/p_up)
            if DUAL or K.E_RING:
                e_t = e_t.load(acc_l)
            e += gl.sum(o * _weighted(e_t, gates, K), axis=1) * p_up
        if K.PACKED_MASK:  # (diff is the mask's bits here, p unmasked; bf16: p_down is 1)
            pa = gl.convert_layout(_kept(p.to(dtype), diff), a_l)
        else:
            pa = gl.convert_layout((p * p_down).to(dtype), a_l)  # [BLOCK_N, BLOCK_N]
        o = warpgroup_mma(pa, v_t, o, is_async=True)
        o, state, e = _all_done(o, state, sums, e, K)
        if K.ROWS == 1:  # (the skip D·v from the slot's own v, before the slot is released)
            o += v_t.load(acc_l).to(gl.float32) * (gates[5] / p_up)
        elif K.ROWS == 2:  # (dx = w·dV' + D·dO and the rows' dots, x from E's slot again)
            o, e = _row_grad(o, e, _tile(ring.e, 2 * s + H_IDX).load(acc_l).to(gl.float32),
                             v_t.load(acc_l).to(gl.float32), gates, p_up)
    if K.LATE_PAIRS:  # (the slot held for the own pairs: :func:`_late_own_pairs`)
        e = (e, p, e_t)
    elif not DUAL and dtype != gl.float32:
        ring.release(s)
    return o, state, p_up, h_up, w_rows, e


#: ``NORM``'s sums Σk (R × NORM_COLS) and Σv (DH × NORM_COLS) are products with a tile of ones
#: (every column the same sum: no row tile held in fp32 registers), and their 16-bit operands
#: hold the sum's rounding in the first half of the columns and its remainder in the second
NORM_COLS = gl.constexpr(16)


@gluon.jit
def _no_sums(K: gl.constexpr):
    """``NORM``'s sums of k and v before a chunk at the lane's start, (Σk, Σv) float32 zeros in
    the layout of their products (:func:`_sums_step`; with the offsets, ``NORM`` 2 and 3, Σv
    alone is carried, beside zeros); else (0.0, 0.0)."""
    if K.NORM:
        DH: gl.constexpr = K.DC // 2
        Z: gl.constexpr = K.R if K.NORM == 1 else DH  # (the offsets' modes carry Σv alone)
        s_l: gl.constexpr = _acc_layout(gl.bfloat16, NORM_COLS)
        return (gl.zeros([Z, NORM_COLS], gl.float32, s_l),
                gl.zeros([DH, NORM_COLS], gl.float32, s_l))
    else:
        return 0.0, 0.0


@gluon.jit
def _sums_step(sums, c_t, v_t, st, hz, K: gl.constexpr, H_IDX: gl.constexpr = 0):
    """(Σk, Σv) past a chunk: kᵀ·1 and v[:, h]ᵀ·1 added (``c_t``: the chunk's k tile; ``v_t``:
    this consumer's half of its v tile), issued asynchronously after the chunk's other products,
    one group each; with the offsets (``NORM`` 2, 3) Σv alone, weighted by the tile in
    ``st.ones`` (ones, or the column offsets β); with the dual output's (5) Σv by ones and, in
    the first place, Σ β_i c_i over the dual output's columns (this consumer's DH of c's), by
    β's tile (``st.ones`` from index 2)."""
    ones = st.ones.index(hz)
    z = sums[0]
    if K.NORM == 1:  # (Σk too)
        z = warpgroup_mma(c_t.permute((1, 0)), ones, z, is_async=True)
    elif K.NORM == 5:
        DH: gl.constexpr = K.DC // 2
        z = warpgroup_mma(c_t.slice(H_IDX * DH, DH, dim=1).permute((1, 0)),
                          st.ones.index(2 + hz), z, is_async=True)
    sv = warpgroup_mma(v_t.permute((1, 0)), ones, sums[1], is_async=True)
    return z, sv


@gluon.jit
def _sum_operand(x, dst):
    """A sum's 16-bit operand in ``dst`` (its shape): the sum rounded in the first half of the
    columns, the rounding's remainder in the second, so that a product with it, halved over
    the columns, is as exact as fp32's."""
    hi, lo = _split16(x, dst.dtype, False)
    cols = gl.arange(0, NORM_COLS, layout=gl.SliceLayout(0, x.type.layout))
    dst.store(gl.where((cols < NORM_COLS // 2)[None, :], hi, lo))


@gluon.jit
def _sums_at(prog, col, K: gl.constexpr, H_IDX: gl.constexpr):
    """Offsets of this consumer's Σk (its own copy: each consumer reads what it published
    itself, ordered by its own flag) and Σv (its columns) within a segment's published sums
    (``2R + D`` float32), as [R, NORM_COLS] and [DH, NORM_COLS] tiles whose columns repeat."""
    R: gl.constexpr = K.R
    DH: gl.constexpr = K.DC // 2
    Z: gl.constexpr = R if K.NORM == 1 else DH  # (:func:`_no_sums`)
    s_l: gl.constexpr = _acc_layout(gl.bfloat16, NORM_COLS)
    zero = gl.arange(0, NORM_COLS, layout=gl.SliceLayout(0, s_l))[None, :] * 0
    z_at = H_IDX * R + gl.arange(0, Z, layout=gl.SliceLayout(1, s_l))[:, None] + zero
    v_at = 2 * R + col + gl.arange(0, DH, layout=gl.SliceLayout(1, s_l))[:, None] + zero
    return z_at, v_at


@gluon.jit
def _publish_sums(own, prog, col, K: gl.constexpr, H_IDX: gl.constexpr):
    """``NORM``: this segment's own (Σk, Σv), one column of each, into its slot of the lane's
    published sums (before the flag that publishes its state rises)."""
    z_at, v_at = _sums_at(prog, col, K, H_IDX)
    s_l: gl.constexpr = _acc_layout(gl.bfloat16, NORM_COLS)
    first = (gl.arange(0, NORM_COLS, layout=gl.SliceLayout(0, s_l)) == 0)[None, :]
    at = prog.norm[2] + prog.seg * (2 * K.R + K.D)
    gl.store(at + z_at, _sum_rows(own[0], K.NORM == 5)[:, None] + own[0] * 0.0, mask=first)
    gl.store(at + v_at, _sum_rows(own[1], K.NORM == 3)[:, None] + own[1] * 0.0, mask=first)


@gluon.jit
def _sums_before(prog, col, K: gl.constexpr, H_IDX: gl.constexpr):
    """``NORM``: (Σk, Σv) over the lane's segments before this one, from what each published
    (read once this segment's flag has risen, past L1), in a fixed order."""
    z_at, v_at = _sums_at(prog, col, K, H_IDX)
    z, sv = _no_sums(K)
    for j in range(prog.seg):
        at = prog.norm[2] + j * (2 * K.R + K.D)
        z += gl.load(at + z_at, cache_modifier=".cg")
        sv += gl.load(at + v_at, cache_modifier=".cg")
    # (a sum weighted by β: in the first half of the columns, as :func:`_sum_rows` reads it)
    cols = gl.arange(0, NORM_COLS, layout=gl.SliceLayout(0, sv.type.layout))
    if K.NORM == 3:
        sv = gl.where((cols < NORM_COLS // 2)[None, :], sv, 0.0)
    if K.NORM == 5:
        z = gl.where((cols < NORM_COLS // 2)[None, :], z, 0.0)
    return z, sv


@gluon.jit
def _sum_rows(acc, WEIGHTED: gl.constexpr):
    """A sum by its rows from its product's [·, NORM_COLS] accumulator: every column the sum
    with a tile of ones; with β's tile (``WEIGHTED``: :func:`_store_offsets`) the first half of
    the columns β's 16-bit part's, the second its remainder's."""
    if WEIGHTED:
        return gl.sum(acc, axis=1) * (2.0 / NORM_COLS)
    else:
        return gl.max(acc, axis=1)


@gluon.jit
def _norm_step(state, sums, ring, st, s, diff, prog, K: gl.constexpr, H_IDX: gl.constexpr, j):
    """``NORM``'s chunk (γ = 1, bf16) of this consumer, normalised linear attention with
    f(x) = c + x: its half of ``q·H + c·Σv + (P ⊙ M)·v`` with P = q kᵀ + c, the state and the
    sums (Σk, Σv) carried past the chunk, and each row's denominator but its ``c·t0 + eps``:
    rowsum(P ⊙ M) + q·Σk. c·Σv enters O's accumulator as a product (a column of eighths
    against c·Σv's operand), q·Σk as another against Σk's; both operands carry their sum's
    remainder (:func:`_sum_operand`)."""
    BLOCK_N: gl.constexpr = K.BLOCK_N
    DH: gl.constexpr = K.DC // 2
    dtype: gl.constexpr = ring.b.dtype
    acc_l: gl.constexpr = _acc_layout(dtype, DH)
    a_l: gl.constexpr = _operand_layout(dtype, DH)
    s_l: gl.constexpr = _acc_layout(dtype, NORM_COLS)
    cst = prog.norm[0]
    b_t, c_t, v_t = ring.tiles(s, H_IDX)
    hz = H_IDX + _unhoisted(j, K)
    _store_copies(state, 1.0, st, hz, dtype, False, False)
    _sum_operand(sums[0], st.z.index(hz))
    _sum_operand(sums[1] * cst, st.sv.index(hz))
    fence_async_shared()
    sc = warpgroup_mma(b_t, c_t.permute((1, 0)), gl.zeros([BLOCK_N, BLOCK_N], gl.float32, acc_l),
                       use_acc=False, is_async=True)  # [BLOCK_N, BLOCK_N]
    o = warpgroup_mma(b_t, st.h.index(hz), gl.zeros([BLOCK_N, DH], gl.float32, acc_l),
                      use_acc=False, is_async=True)  # [BLOCK_N, DH]
    eighths = gl.full([BLOCK_N, NORM_COLS], 2.0 / NORM_COLS, dtype, a_l)
    o = warpgroup_mma(eighths, st.sv.index(hz).permute((1, 0)), o, is_async=True)
    qz = warpgroup_mma(b_t, st.z.index(hz), gl.zeros([BLOCK_N, NORM_COLS], gl.float32, s_l),
                       use_acc=False, is_async=True)  # [BLOCK_N, NORM_COLS]
    state = warpgroup_mma(c_t.permute((1, 0)), v_t, state, is_async=True)  # [R, DH]
    sums = _sums_step(sums, c_t, v_t, st, hz, K)
    sc = warpgroup_mma_wait(num_outstanding=6, deps=(sc,))
    p = gl.where(diff >= 0, sc + cst, 0.0)
    den = gl.sum(p, axis=1)
    o = warpgroup_mma_wait(num_outstanding=4, deps=(o,))
    o = warpgroup_mma(gl.convert_layout(p.to(dtype), a_l), v_t, o, is_async=True)
    o, state, qz, z, sv = warpgroup_mma_wait(num_outstanding=0,
                                             deps=(o, state, qz, sums[0], sums[1]))
    ring.release(s)
    qz = gl.sum(qz, axis=1) * (2.0 / NORM_COLS)
    return o, state, (z, sv), den + gl.convert_layout(qz, gl.SliceLayout(1, acc_l))


@gluon.jit
def _offsets(prog, row, length, layout: gl.constexpr, K: gl.constexpr):
    """The offsets' modes' per-row values of a chunk's tile rows (float32, 0 past the lane's
    end) in ``layout`` (a slice of a 2-D layout): α (``NORM`` 2 with a tensor) or β (3)."""
    BLOCK_N: gl.constexpr = K.BLOCK_N
    ri = gl.arange(0, BLOCK_N, layout=layout)
    return gl.load(prog.off + row + ri, mask=ri < length, other=0.0)


@gluon.jit
def _store_offsets(prog, row, length, dst, K: gl.constexpr):
    """``NORM`` 3: the chunk's column offsets β as the weights of Σv's product, [BLOCK_N,
    NORM_COLS] in ``dst``: β's 16-bit part in the first half of the columns, its remainder in
    the second (:func:`_sum_rows`)."""
    BLOCK_N: gl.constexpr = K.BLOCK_N
    w_l: gl.constexpr = gl.BlockedLayout([1, 8], [16, 2], [4, 1], [1, 0])
    beta = _offsets(prog, row, length, gl.SliceLayout(1, w_l), K)
    hi = beta.to(dst.dtype).to(gl.float32)
    cols = gl.arange(0, NORM_COLS, layout=gl.SliceLayout(0, w_l))
    dst.store(gl.where((cols < NORM_COLS // 2)[None, :], hi[:, None], (beta - hi)[:, None] +
                       gl.zeros([BLOCK_N, NORM_COLS], gl.float32, w_l)).to(dst.dtype))


@gluon.jit
def _offset_step(state, sums, ring, st, s, diff, prog, row, length, K: gl.constexpr,
                 H_IDX: gl.constexpr, j):
    """The offsets' chunk (``NORM`` 2 or 3; γ = 1, bf16, forward or reverse) of this consumer:
    the operator with a rank-one term on its scores, op(B', C', V) for B' = [B, α], C' = [C, β]:
    the scores take α_i·β_j on and below the diagonal, and each row's part from the rows before
    the chunk α_i·Σ β_j v_j beside q_i·H. ``NORM`` 2: β = 1 and α the rows' offsets (a float32
    row, or the constant c): the normaliser's dq (op(dO/den, v, k), α = dden) and dv (in
    reverse, op(k, q, dO/den), α = c); 3: α = 1 and β the columns' offsets: its dk (in
    reverse, op(v, dO/den, q), β = dden). Σ β_j v_j rides beside the state as Σv's product
    (:func:`_sums_step`, weighted by β's tile with 3), added to O's accumulator in fp32 once
    O's part from the state is in (the entering sum, taken before this chunk's product adds
    to it). Returns O's half, the state and the sums past the chunk."""
    BLOCK_N: gl.constexpr = K.BLOCK_N
    DH: gl.constexpr = K.DC // 2
    dtype: gl.constexpr = ring.b.dtype
    acc_l: gl.constexpr = _acc_layout(dtype, DH)
    a_l: gl.constexpr = _operand_layout(dtype, DH)
    b_t, c_t, v_t = ring.tiles(s, H_IDX)
    hz = H_IDX + _unhoisted(j, K)
    # (Σ β_j v_j before the chunk, by O's columns: read before this chunk's product adds to it)
    sv = gl.convert_layout(_sum_rows(sums[1], K.NORM == 3), gl.SliceLayout(0, acc_l))
    if K.NORM == 3:
        off = _offsets(prog, row, length, gl.SliceLayout(0, acc_l), K)  # β by columns
        _store_offsets(prog, row, length, st.ones.index(hz), K)
    elif prog.off is None:
        off = prog.norm[0]  # (α the constant c)
    else:
        off = _offsets(prog, row, length, gl.SliceLayout(1, acc_l), K)  # α by rows
    _store_copies(state, 1.0, st, hz, dtype, False, False)
    fence_async_shared()
    sc = warpgroup_mma(b_t, c_t.permute((1, 0)), gl.zeros([BLOCK_N, BLOCK_N], gl.float32, acc_l),
                       use_acc=False, is_async=True)  # [BLOCK_N, BLOCK_N]
    o = warpgroup_mma(b_t, st.h.index(hz), gl.zeros([BLOCK_N, DH], gl.float32, acc_l),
                      use_acc=False, is_async=True)  # [BLOCK_N, DH]
    state = warpgroup_mma(c_t.permute((1, 0)), v_t, state, is_async=True)  # [R, DH]
    sums = _sums_step(sums, c_t, v_t, st, hz, K)
    sc = warpgroup_mma_wait(num_outstanding=3, deps=(sc,))
    if K.NORM == 3:
        p = gl.where(diff >= 0, sc + off[None, :], 0.0)
    elif prog.off is None:
        p = gl.where(diff >= 0, sc + off, 0.0)
    else:
        p = gl.where(diff >= 0, sc + off[:, None], 0.0)
    o = warpgroup_mma_wait(num_outstanding=2, deps=(o,))
    if K.NORM == 3:
        o = o + sv[None, :]
    elif prog.off is None:
        o = o + off * sv[None, :]
    else:
        o = o + off[:, None] * sv[None, :]
    o = warpgroup_mma(gl.convert_layout(p.to(dtype), a_l), v_t, o, is_async=True)
    o, state, z, sv = warpgroup_mma_wait(num_outstanding=0, deps=(o, state, sums[0], sums[1]))
    ring.release(s)
    return o, state, (z, sv)


@gluon.jit
def _staging_of(ring, st, s, j, K: gl.constexpr, H_IDX: gl.constexpr):
    """Where chunk j's half of O is staged for its TMA store."""
    DUAL: gl.constexpr = K.DUAL
    if ring.b.dtype == gl.float32:
        # in the slot's own V tile, which the MMAs are done with
        return ring.v.index(2 * s + H_IDX)
    elif DUAL:
        # one staging buffer (O2 takes the second); the store of the last chunk's O has left
        # it, its O2 may still be in flight
        return st.o.index(H_IDX + _unhoisted(j, K))
    else:
        # two staging buffers: the store of two chunks ago has left this one before it is
        # rewritten, the last chunk's may still be in flight
        return st.o.index(2 * H_IDX + j % 2)


@gluon.jit
def _dual_step(ring, ops, st, s, diff, w_rows, h_up, prog, row, K: gl.constexpr,
               H_IDX: gl.constexpr, j, gates, extra=None):
    """O2's columns H_IDX·DH.. of chunk j (ring slot s) = the state's rows there: e times both
    consumers' copies (this one's first: the other's may not be written yet), then
    (E vᵀ ⊙ M) c[:, h]; the slot released, the columns stored. ``gates``: the chunk's
    (:func:`_chunk_gates`) or None; ``extra`` (``NORM`` 5, :func:`_chunk_step`'s): the scores
    take the columns' offsets β (``extra[2]``), the rows Σ β_i c_i (``extra[1]``)."""
    BLOCK_N: gl.constexpr = K.BLOCK_N
    DC: gl.constexpr = K.DC
    HALF_RANGE: gl.constexpr = K.HALF_RANGE
    HAS_DECAY: gl.constexpr = K.HAS_DECAY
    WEIGHTED: gl.constexpr = K.HAS_DECAY or K.HAS_GATE
    DH: gl.constexpr = DC // 2
    dtype: gl.constexpr = ring.b.dtype
    acc_l: gl.constexpr = _acc_layout(dtype, DH)
    a_l: gl.constexpr = _operand_layout(dtype, DH)
    s2 = warpgroup_mma(_tile(ring.e, 2 * s), _tile(ring.v, 2 * s).permute((1, 0)),
                       gl.zeros([BLOCK_N, BLOCK_N], gl.float32, acc_l), use_acc=False,
                       is_async=True)  # [BLOCK_N, BLOCK_N]
    s2 = warpgroup_mma(_tile(ring.e, 2 * s + 1), _tile(ring.v, 2 * s + 1).permute((1, 0)), s2,
                       is_async=True)
    hz = H_IDX + _unhoisted(j, K)
    o2 = warpgroup_mma(_tile(ring.e, 2 * s + H_IDX),
                       st.h.index(hz).slice(H_IDX * DH, DH).permute((1, 0)),
                       gl.zeros([BLOCK_N, DH], gl.float32, acc_l), use_acc=False,
                       is_async=True)  # [BLOCK_N, DH]
    mbarrier.wait(st.hbar.index(0), j & 1)  # the other consumer's copy is written
    if HALF_RANGE:  # the copies have their own scales: O2 in units of the other's
        o2 = warpgroup_mma_wait(num_outstanding=0, deps=(o2,))
        other_up = gl.max(st.hs_up.index(1 - hz).load(gl.SliceLayout(1, acc_l)), axis=0)
        o2 = o2 * (h_up / other_up)
    else:
        other_up = 1.0
    o2 = warpgroup_mma(_tile(ring.e, 2 * s + 1 - H_IDX),
                       st.h.index(1 - hz).slice(H_IDX * DH, DH).permute((1, 0)), o2,
                       is_async=True)
    s2 = warpgroup_mma_wait(num_outstanding=1, deps=(s2,))
    if extra is not None:
        p2 = gl.where(diff >= 0, s2 + extra[2][None, :], 0.0)
    else:
        p2 = _masked(s2, diff, prog.lg, HAS_DECAY, gates, LEAN=K.LEAN_MASK)
    p2_down, p2_up = _half_scale(p2, HALF_RANGE)
    o2 = warpgroup_mma_wait(num_outstanding=0, deps=(o2,))
    mbarrier.arrive(st.hbar.index(1), count=1)  # both copies read
    o2 = _rescaled(o2, w_rows, other_up / p2_up, WEIGHTED, HALF_RANGE)
    if extra is not None:
        o2 = o2 + extra[1][None, :]
    pa2 = gl.convert_layout((p2 * p2_down).to(dtype), a_l)
    o2 = warpgroup_mma(pa2, _tile(ring.c, s).slice(H_IDX * DH, DH, dim=1), o2, is_async=True)
    o2 = warpgroup_mma_wait(num_outstanding=0, deps=(o2,))
    ring.release(s)
    if K.ROWS == 2:  # (E = x: dC's rows take V' = w·x's weights)
        o2 = o2 * gates[3][:, None]
    _store_half(ops.o2, st.o.index(2 + hz), o2, p2_up, ops.scale, prog.bb, prog.hh, row,
                H_IDX * DH, BLOCK_N, DH, dtype)


@gluon.jit
def _program(N, H, LANES, SEG, SYNC, DECAY, PIECES, ROWS, K: gl.constexpr):
    """This program's :class:`Program`: its unit, or with ``SPLIT`` its unit and segment taken in
    ticket order. ``DECAY = (GAMMA, G)``: λ per head, the gates' tile sums (lanes, whole
    tiles); ``PIECES``, ``ROWS``: :func:`chunk_hopper_kernel`'s."""
    BLOCK_N: gl.constexpr = K.BLOCK_N
    D: gl.constexpr = K.D
    DC: gl.constexpr = K.DC
    HAS_DECAY: gl.constexpr = K.HAS_DECAY
    REVERSE: gl.constexpr = K.REVERSE
    SPLIT: gl.constexpr = K.SPLIT
    units = LANES * (D // DC)
    if SPLIT:
        t = gl.atomic_add(SYNC + 2 * units, 1)  # ticket, in the order programs actually start
        if t == gl.num_programs(0) - 1:  # every ticket taken: the counter zero for the next launch
            gl.atomic_xchg(SYNC + 2 * units, 0)
    else:
        t = gl.program_id(0)
    unit = t % units
    seg = t // units
    if D == DC:  # (a constant where one program holds every column: fewer registers)
        lane = unit
        col0 = 0
    else:
        lane = unit // (D // DC)
        col0 = (unit % (D // DC)) * DC
    # the segment: chunks i0 .. i0+steps-1 of its lane's sweep, n rows
    chunks = gl.cdiv(N, BLOCK_N)
    if SPLIT:
        i0 = seg * (SEG // BLOCK_N)
        steps = gl.minimum(chunks - i0, SEG // BLOCK_N)
    else:
        i0 = seg * 0
        steps = chunks
    last = i0 + steps >= chunks
    if REVERSE:
        n = gl.minimum(N, (chunks - i0) * BLOCK_N) - (chunks - i0 - steps) * BLOCK_N
    else:
        n = gl.minimum(N, (i0 + steps) * BLOCK_N) - i0 * BLOCK_N
    hh = lane % H
    GAMMA = DECAY[0]
    G = DECAY[1]
    if HAS_DECAY:
        lg = gl.log(gl.load(GAMMA + hh)).to(gl.float32)  # float64 λ in, log taken in float64
    else:
        lg = 0.0
    gates = None
    if K.HAS_GATE:
        gates = G + lane.to(gl.int64) * (chunks * BLOCK_N)
    bb = lane // H
    e_rows = None
    e_sr = None
    dg = None
    dg_blk = None
    if K.GATE_GRAD:
        gl.static_assert(K.REVERSE or not K.DUAL, "the pieces: the dual output in reverse "
                         "time only")
        E, e_sb, e_sh, e_sr, DG_ROWS, dg_blk = PIECES
        e_rows = E + bb.to(gl.int64) * e_sb + (hh // K.GROUPS[3]).to(gl.int64) * e_sh
        dg = DG_ROWS + lane.to(gl.int64) * N
    w, w_sn, skip, rd, rd_blk, rd_half = _lane_value_rows(ROWS, bb, hh, lane, N, K)
    norm = None
    den = None
    off = None
    if K.NORM:
        gl.static_assert(not (HAS_DECAY or K.HAS_GATE or K.GATE_GRAD or K.ROWS or
                              K.HALF_RANGE or K.HAS_S0 or K.STORE_SN) and D == DC and
                         DC == 128 and (K.NORM >= 2 or not REVERSE) and
                         K.DUAL == (K.NORM == 5) and (K.NORM != 5 or REVERSE),
                         "NORM: a sweep in bf16 without a decay, states or other modes, one "
                         "program a lane of 128 value columns; the denominators forward only, "
                         "the dual output's offsets (5) in reverse only")
        cst, eps, DEN, SUMS, sums_lane, OFF = ROWS  # (NORM's, in the row weights' place)
        lane_row = lane.to(gl.int64) * N
        if DEN is not None:  # (each None where the mode has none: 1 the offsets, 2 and 3 DEN)
            den = DEN + lane_row
        if OFF is not None:
            off = OFF + lane_row
        norm = (cst, eps, SUMS + lane.to(gl.int64) * sums_lane)
    return Program(bb, hh, N, i0, steps, n, lane, seg, last, unit, col0, lg, gates, e_rows, e_sr,
                   dg, dg_blk, w, w_sn, skip, rd, rd_blk, rd_half, norm, den, off)


@gluon.jit
def _lane_value_rows(ROWS, bb, hh, lane, N, K: gl.constexpr):
    """``ROWS``: the lane's row of the row weights, its row stride, its head's skip D and, with
    ``ROWS == 2``, its row of the row dots' first half's first block, the blocks' and the
    halves' distances (the kernel's ``ROWS``); else 0s."""
    if K.ROWS == 2:
        gl.static_assert(K.HAS_GATE and K.REVERSE and K.DUAL and K.GATE_GRAD and not K.SPLIT,
                         "E's row weights and the row dots: the reverse sweep with the dual "
                         "output and the gates' pieces")
        W, w_sb, w_sh, w_sn, SKIP, RD, rd_blk, rd_half = ROWS
        return (W + bb.to(gl.int64) * w_sb + hh.to(gl.int64) * w_sh, w_sn,
                gl.load(SKIP + hh).to(gl.float32), RD + lane.to(gl.int64) * N, rd_blk, rd_half)
    elif K.ROWS:
        gl.static_assert(K.HAS_GATE and not (K.REVERSE or K.DUAL or K.GATE_GRAD),
                         "V's row weights and the skip: a gated forward sweep")
        W, w_sb, w_sh, w_sn, SKIP = ROWS
        return (W + bb.to(gl.int64) * w_sb + hh.to(gl.int64) * w_sh, w_sn,
                gl.load(SKIP + hh).to(gl.float32), 0, 0, 0)
    else:  # (a returned tuple holds no bare None: 0s stand for them, never read)
        return 0, 0, 0.0, 0, 0, 0


@gluon.jit
def _buffers(b_desc, c_desc, v_desc, o_desc, e_desc, g_desc, K: gl.constexpr):
    """The shared memory: the :class:`Ring` and the consumers' :class:`Staging`."""
    BLOCK_N: gl.constexpr = K.BLOCK_N
    DC: gl.constexpr = K.DC
    DUAL: gl.constexpr = K.DUAL
    HALF_RANGE: gl.constexpr = K.HALF_RANGE
    R: gl.constexpr = K.R
    STAGES: gl.constexpr = K.STAGES
    DH: gl.constexpr = DC // 2
    dtype: gl.constexpr = b_desc.dtype
    b_bufs = gl.allocate_shared_memory(dtype, [STAGES] + b_desc.block_type.shape, b_desc.layout)
    c_bufs = gl.allocate_shared_memory(dtype, [STAGES] + c_desc.block_type.shape, c_desc.layout)
    v_bufs = gl.allocate_shared_memory(dtype, [2 * STAGES] + v_desc.block_type.shape,
                                       v_desc.layout)
    if dtype == gl.float32:
        # the state's copies in halves, K-major (DH × R/2 each); O staged in the ring's V tiles;
        # the weighted v is not needed (the weights go on cᵀ in registers)
        RH: gl.constexpr = R // 2 if R > 64 else R  # (:func:`_tf32_chunk`)
        h_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([DH, RH], dtype)
        h_bufs = gl.allocate_shared_memory(dtype, [2, DH, RH], h_layout)
        o_bufs = None
        vw_bufs = None
    else:
        h_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([R, DH], dtype)
        h_bufs = gl.allocate_shared_memory(dtype, [2, R, DH], h_layout)
        o_bufs = gl.allocate_shared_memory(dtype, [4] + o_desc.block_type.shape, o_desc.layout)
        vw_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, DH], dtype)
        vw_bufs = None
        if not K.NORM:
            vw_bufs = gl.allocate_shared_memory(dtype, [2, BLOCK_N, DH], vw_layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=2)  # both consumers release a slot
    e_bufs = None
    g_bufs = None
    if K.HAS_GATE and K.G_RING:
        g_bufs = gl.allocate_shared_memory(gl.float32, [STAGES] + g_desc.block_type.shape,
                                           g_desc.layout)
    hbar = None
    hs_up = None
    hl_bufs = None
    vwl_bufs = None
    z_bufs = None
    sv_bufs = None
    ones_bufs = None
    if K.NORM:  # (no weighted v: the ones in its place, and the normaliser's sums' operands)
        ones_bufs = gl.allocate_shared_memory(  # (NORM 5: β's tiles after the ones)
            dtype, [4 if K.NORM == 5 else 2, BLOCK_N, NORM_COLS],
            gl.NVMMASharedLayout.get_default_for([BLOCK_N, NORM_COLS], dtype))
    if K.NORM == 1:
        z_bufs = gl.allocate_shared_memory(
            dtype, [2, R, NORM_COLS], gl.NVMMASharedLayout.get_default_for([R, NORM_COLS], dtype))
        sv_bufs = gl.allocate_shared_memory(
            dtype, [2, DH, NORM_COLS],
            gl.NVMMASharedLayout.get_default_for([DH, NORM_COLS], dtype))
    if K.GATE_GRAD:  # (fp16/bf16: the remainders' copies, laid out as the copies themselves)
        hl_bufs = gl.allocate_shared_memory(dtype, [2, R, DH], h_layout)
        vwl_bufs = gl.allocate_shared_memory(dtype, [2, BLOCK_N, DH], vw_layout)
    if DUAL or K.E_RING:
        e_bufs = gl.allocate_shared_memory(dtype, [2 * STAGES] + e_desc.block_type.shape,
                                           e_desc.layout)
    if DUAL:
        # the state's copies: both written (0), both read (1); each consumer arrives once a chunk
        hbar = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        mbarrier.init(hbar.index(0), count=2)
        mbarrier.init(hbar.index(1), count=2)
        if HALF_RANGE:  # the copies' scales (each consumer's, broadcast over a row)
            hs_up = gl.allocate_shared_memory(gl.float32, [2, R],
                                              gl.SwizzledSharedLayout(1, 1, 1, [0]))
    return (Ring(b_bufs, c_bufs, v_bufs, e_bufs, g_bufs, ready, empty, STAGES),
            Staging(h_bufs, o_bufs, vw_bufs, hbar, hs_up, hl_bufs, vwl_bufs, z_bufs, sv_bufs,
                    ones_bufs))


@gluon.jit
def chunk_hopper_kernel(b_desc, c_desc, v_desc, o_desc, e_desc, o2_desc, STATES, RING, DECAY,
                        SIZE, scale, PIECES, g_desc, K: gl.constexpr, ROWS=None):
    """One program per *unit*, a lane (batch·head) and a block of ``DC`` of its D value columns
    (the units of a lane next to each other in launch order, so that they run together and read
    B and C from L2 after the first), or with ``SPLIT`` per unit and segment of ``SEG`` rows,
    taken in ticket order; 4 warps launched (the loader), the two consumer warp groups added by
    ``warp_specialize``, each holding R × DC/2 of the state. Descriptors over
    (batch, heads, N, ·): B, C blocks (1, 1, BLOCK_N, R), V and O blocks (1, 1, BLOCK_N, DC/2);
    ``DUAL``: E blocks (1, 1, BLOCK_N, D/2) and O2 blocks (1, 1, BLOCK_N, R/2) (R = D = DC),
    else both None. ``STATES = (S0, SN)``: float32 (lanes, R, D) or None; ``RING = (WS, SYNC,
    FLAGS)``: float32 (lanes, 2, R, D), the ring of published states (each unit its own
    columns), int32 two flags per unit (one per consumer) and the ticket counter (None without
    segments), the repair launch's lanes, FLAG_COLS value columns each; ``DECAY = (GAMMA, G)``:
    float64 (H,) or None, and with ``HAS_GATE`` the gates' tile sums (float32 (lanes, whole
    tiles), module docstring), else None; ``SIZE = (N, H, LANES, SEG)``; ``PIECES`` (``GATE_GRAD``,
    else None): ``(E, batch stride, head stride, row stride, rows, block stride)``, E shaped
    like V (its last dimension contiguous) and the pieces' rows float32 (D/DH blocks, batch,
    heads, N) contiguous; ``g_desc`` (``G_RING``, else None): the gates' tile sums as (batch,
    heads, tiles, BLOCK_N), blocks (1, 1, 1, BLOCK_N), through the ring; ``K``:
    :data:`Constants`; ``ROWS`` (``ROWS``, else None): ``(W, batch stride, head stride, row
    stride, D)``, V's row weights float32 (batch, heads, N) and the skip float32 (H,); with
    ``ROWS == 2`` then ``(RD, block stride, half stride)``: the row dots float32 (2, D/DH
    blocks, lanes, N), a block per consumer's columns. With ``NORM`` (never with ``ROWS``), ROWS is
    ``(c, eps, DEN, SUMS, lane stride, OFF)``: the denominators float32 (lanes, N; ``NORM`` 1,
    else None), the segments' published sums float32 (lanes, segments, 2R + D; with segments,
    else any pointer) and the offsets α or β float32 (lanes, N; ``NORM`` 2 with a row per row,
    3, 5; else None, the constant c α with 2)."""
    N, H, LANES, SEG = SIZE
    S0, SN = STATES
    WS, SYNC, FLAGS = RING
    prog = _program(N, H, LANES, SEG, SYNC, DECAY, PIECES, ROWS, K)
    ring, st = _buffers(b_desc, c_desc, v_desc, o_desc, e_desc, g_desc, K)
    ops = Operands(b_desc, c_desc, v_desc, o_desc, e_desc, o2_desc, g_desc, S0, SN, FLAGS, WS,
                   SYNC, scale)
    gl.warp_specialize([(_loader, (prog, ring, ops, K)),
                        (_consumer, (prog, ring, ops, st, K, 0)),
                        (_consumer, (prog, ring, ops, st, K, 1))], [4, 4], [240, 240])
