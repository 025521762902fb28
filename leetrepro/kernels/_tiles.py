"""Tile code shared by the chunked Triton kernels (lightningAttention-2, chunk-scan).

Conventions: a chunk is BLOCK_N consecutive *logical* rows s..s+BLOCK_N-1 of one (batch, head);
in reverse time (``REVERSE``) logical row t is physical row N-1-t, so the same code computes the
operator on time-reversed rows (the backward's dV and dC) without copying anything. Decays enter
as log λ in fp32 (each kernel takes it, in float64, of the float64 λ every launcher passes) and
only ever as λ^k with k ≥ 0.

Per-token gates (``HAS_GATE``; the launcher folds a γ into them and passes no γ then): a chunk's
gates are loaded beside its rows (fp32, one per row, read at the row's physical position: in
reverse time the launcher passes them shifted, ``leetrepro.decay.per_token.shift_gates``) and summed
*within the chunk* (:func:`chunk_gates`); every weight is exp of a difference of those running
sums with the later row first, never exp(+G), and a segment's decay is its gates' total. A gate
of −1e4 (a hard reset) makes every weight across it exactly 0.

Non-finite inputs (NaN/Inf in rows of C or V, e.g. padding of uninitialised memory): the scores
are masked with ``where``; a lane whose output came out non-finite is recomputed by a repair
launch with :func:`isolate_nonfinite` (chunk_scan.py says how), so a non-finite row never reaches
an earlier row, while every later row turns NaN, as the exact formula has it.

Precision policy (both kernels): dot operands in the input dtype (fp16/bf16), accumulation and the
carried state in fp32; fp32 inputs use ``PRECISION`` (tf32 by default, tf32x3 or ieee on request).
When the fp32 state or the fp32 scores become an fp16 operand, they are first scaled by a power
of two so that their largest entry sits near 2^14 (:func:`half_operand`): an fp16 state would
otherwise overflow past 65504 where the output itself fits, or lose its small entries to
subnormals. Powers of two are exact, so nothing else changes. bf16 has fp32's range and needs no
scaling, but takes the same path: measured on the H100 it is as fast or faster in every cell
(NOTES.md), the second product summed outside the MMA accumulator.
"""
import collections

import triton
import triton.language as tl

#: the chunked kernels' compile-time constants, one bundle (their ``K`` parameter), fixed per
#: call signature by the launcher: decay or 0-1 mask, packed sequences, state in and out, time
#: reversed, the dual output, fp16's range scaling, the tiles, fp32's dot precision, per-token
#: gates. Read in a compiled kernel, a field comes out as a plain Python value, which shapes and
#: static ranges refuse: each function binds the fields it reads to constexpr names first
#: (``BLOCK_N: tl.constexpr = K.BLOCK_N``). ``GROUPS``: the heads sharing one head of B, C, V
#: and E, in that order: 1 where a tensor has a head per lane; more where its heads are groups
#: read in place by every lane of the group (Mamba-2's B and C; grouped-query attention).
#: The gates' gradient (``gate_straddle.py``): ``SEG_BLOCKS`` the BLOCK_N blocks of its
#: segments. ``GATE_GRAD``: a backward sweep also writes the gates' gradient's pieces
#: (:func:`gate_pieces`). ``SPLIT``: the chunk-scan kernel's segments chained through its ring.
#: ``ANGLES = (BLOCK_A, A, HALF)``: with A > 0 the gates' gradient's kernel also sums each
#: row's A turned pairs (Mamba-3's angles) over the pairs straddling it (``HALF``: its pair
#: tiles rounded to bf16 for their products). ``ROWS``: a forward sweep with gates also takes
#: per-row weights w of V's rows (V' = w·V inside the products: Mamba-2's dt) and a per-head
#: skip D (O = op(B, C, V') + D·V in the output's one store). ``NORM``: normalised linear
#: attention's forward in the sweep (``chunk_scan.py``'s ``_normalised``).
Constants = collections.namedtuple(
    "Constants", "BLOCK_N BLOCK_R BLOCK_D PRECISION HAS_DECAY VARLEN HAS_S0 STORE_SN REVERSE DUAL "
                 "HALF_RANGE HAS_GATE GROUPS SEG_BLOCKS GATE_GRAD SPLIT ANGLES ROWS NORM",
    defaults=(False,) * 8 + ((1, 1, 1, 1), 1, False, False, (16, 0, False), False, False))


def constants(cfg: dict, **flags) -> Constants:
    """The :data:`Constants` of a launch: the tiles of a launcher's table entry ``cfg``
    (``BLOCK_N``, ``BLOCK_R``, ``BLOCK_D``) and ``flags``."""
    return Constants(BLOCK_N=cfg["BLOCK_N"], BLOCK_R=cfg["BLOCK_R"], BLOCK_D=cfg["BLOCK_D"],
                     **flags)


@triton.jit
def row_positions(s, N, BLOCK_N: tl.constexpr, REVERSE: tl.constexpr, PAD=0):
    """Logical rows s..s+BLOCK_N-1: (in range, physical row as int64). ``PAD`` (reverse time): N
    counts that many rows before the first physical one (N-1 in reverse), which are out of range:
    the reverse sweep's chunks then end where the forward's do (the gates' gradient's pieces,
    :func:`gate_pieces`)."""
    rows = s + tl.arange(0, BLOCK_N)
    if REVERSE:
        phys = N - 1 - rows
    else:
        phys = rows
    return (rows < N) & (rows >= PAD), phys.to(tl.int64)


@triton.jit
def and_flag(ok, flag):
    """``ok & flag`` for a tile mask ``ok`` and a scalar boolean ``flag``, the flag broadcast as an
    integer: Triton 3.9's interpreter refuses a mask that a scalar boolean was combined into."""
    return ok & ((ok.to(tl.int32) * 0 + flag.to(tl.int32)) != 0)


@triton.jit
def columns(first, size, BLOCK: tl.constexpr):
    """``(indices, in range)``: BLOCK columns from ``first`` of a dimension of ``size``, the
    *columns* every loader here takes."""
    idx = first + tl.arange(0, BLOCK)
    return idx, idx < size


@triton.jit
def lane_rows(X, seq, head, bos, VARLEN: tl.constexpr):
    """A lane's rows of a tensor given as ``X = (pointer, batch stride, head stride, row stride)``
    (elements): ``(pointer, offset of the lane's row 0, row stride)``, the *rows* every loader
    here takes. The lane is batch ``seq`` and head ``head``, or with ``VARLEN`` the packed batch
    of one from row ``bos``. int64 offsets: batch 16 × 32 heads × N 100000 × 128 overflows
    int32."""
    ptr, s_b, s_h, s_t = X
    if VARLEN:
        return ptr, head * s_h + bos * s_t, s_t
    else:
        return ptr, seq.to(tl.int64) * s_b + head * s_h, s_t


@triton.jit
def load_rows(rows, phys, ok, cols):
    """The (BLOCK_N, len(cols)) tile of rows ``phys`` (in range where ``ok``) of a lane's
    ``rows`` (:func:`lane_rows`), columns ``cols = (indices, in range)``; 0 outside."""
    ptr, base, stride = rows
    idx, col_ok = cols
    return tl.load(ptr + base + phys[:, None] * stride + idx[None, :],  # [BLOCK_N, len(cols)]
                   mask=ok[:, None] & col_ok[None, :], other=0.0)


@triton.jit
def store_rows(rows, phys, ok, cols, x):
    """:func:`load_rows`' tile written back, converted to the tensor's dtype."""
    ptr, base, stride = rows
    idx, col_ok = cols
    tl.store(ptr + base + phys[:, None] * stride + idx[None, :], x.to(ptr.dtype.element_ty),
             mask=ok[:, None] & col_ok[None, :])


@triton.jit
def load_chunk(b_rows, c_rows, v_rows, phys, ok, cols_r, cols_d, ISOLATE: tl.constexpr):
    """One chunk's b, c [BLOCK_N, BLOCK_R] and v [BLOCK_N, BLOCK_D] tiles (each tensor's lane
    rows, :func:`lane_rows`) and, with ISOLATE (the repair), c and v with their non-finite
    entries zeroed and the per-row 0/NaN that poisons rows from a bad one on."""
    b = load_rows(b_rows, phys, ok, cols_r)
    c = load_rows(c_rows, phys, ok, cols_r)
    v = load_rows(v_rows, phys, ok, cols_d)
    if ISOLATE:
        c, c_bad = isolate_nonfinite(c)
        v, v_bad = isolate_nonfinite(v)
        return b, c, v, c_bad + v_bad
    else:
        return b, c, v, 0.0


@triton.jit
def load_gates(g_rows, phys, ok):
    """A chunk's gates (fp32 [BLOCK_N], 0 past the lane's end) from the lane's gate rows
    (:func:`lane_rows` of the (batch, heads, N) gates)."""
    ptr, base, stride = g_rows
    return tl.load(ptr + base + phys * stride, mask=ok, other=0.0).to(tl.float32)


@triton.jit
def chunk_gates(g_rows, phys, ok, BLOCK_N: tl.constexpr):
    """A chunk's decays from its gates: (w_in, w_out, decay, intra) as :func:`chunk_weights` and
    :func:`intra_mask` give them for γ, with G the chunk's running gate sums (inclusive):
    exp(G_i) onto the incoming state, exp(G_last − G_j) into the outgoing one, exp(G_last) the
    state's own decay, exp(G_i − G_j) (i ≥ j) within the chunk. Rows past the end carry gate 0
    (so G_last is the last row's) and w_out 0."""
    gk = load_gates(g_rows, phys, ok)
    G = tl.cumsum(gk, axis=0)
    last = tl.sum(gk, axis=0)
    w_in = tl.exp(G)
    w_out = tl.where(ok, tl.exp(last - G), 0.0)
    rows = tl.arange(0, BLOCK_N)
    lower = rows[:, None] >= rows[None, :]
    intra = tl.exp(tl.where(lower, G[:, None] - G[None, :], float("-inf")))  # [BLOCK_N, BLOCK_N]
    return w_in, w_out, tl.exp(last), intra


@triton.jit
def intra_mask(lg, BLOCK_N: tl.constexpr, HAS_DECAY: tl.constexpr):
    """The chunk's own (BLOCK_N, BLOCK_N) mask: λ^(i-j) for i ≥ j, exactly 0 above the diagonal."""
    rows = tl.arange(0, BLOCK_N)
    diff = rows[:, None] - rows[None, :]
    if HAS_DECAY:
        return tl.where(diff >= 0, tl.exp(tl.maximum(diff, 0).to(tl.float32) * lg), 0.0)
    return tl.where(diff >= 0, 1.0, 0.0)


@triton.jit
def chunk_weights(lg, s, N, BLOCK_N: tl.constexpr, HAS_DECAY: tl.constexpr):
    """For the chunk at logical row s: λ^(i+1) (rows of b, onto the incoming state), λ^(len-1-j)
    (rows of c, into the outgoing state; 0 past N) and λ^len (the state's own decay)."""
    rows = tl.arange(0, BLOCK_N)
    if HAS_DECAY:
        length = tl.minimum(N - s, BLOCK_N)
        w_in = tl.exp((rows + 1).to(tl.float32) * lg)
        w_out = tl.where(rows < length,
                         tl.exp(tl.maximum(length - 1 - rows, 0).to(tl.float32) * lg), 0.0)
        decay = tl.exp(length.to(tl.float32) * lg)
    else:
        w_in = tl.full((BLOCK_N,), 1.0, tl.float32)
        w_out = w_in
        decay = 1.0
    return w_in, w_out, decay


@triton.jit
def isolate_nonfinite(x):
    """(x with its NaN/Inf entries set to 0, per row 0 or NaN)."""
    z = x * 0  # 0 where finite, NaN where not
    return tl.where(z == 0, x, 0), tl.sum(z.to(tl.float32), axis=1)


@triton.jit
def has_nonfinite(x):
    """Whether the tile holds a NaN or Inf (one reduction)."""
    return tl.sum(tl.sum(x * 0.0, axis=1), axis=0) != 0.0


@triton.jit
def half_operand(x, dtype: tl.constexpr):
    """The fp32 tile x as an fp16 dot operand, scaled by 2^-e so that its largest entry is near
    2^14, and the factor 2^e the product must be multiplied by."""
    m = tl.maximum(tl.max(tl.max(tl.abs(x), axis=1), axis=0), 1e-30)  # an all-zero tile: any e
    e = tl.minimum(tl.ceil(tl.log2(m)) - 14.0, 100.0)  # NaN falls through: the product is NaN anyway
    return (x * tl.exp2(-e)).to(dtype), tl.exp2(e)


@triton.jit
def accumulate_state(state, c, v, w_out, decay, HAS_DECAY: tl.constexpr, PRECISION: tl.constexpr,
                     EXACT: tl.constexpr = False):
    """state ← λ^len state + (diag(w_out) c)ᵀ v, on the tensor cores, accumulated in fp32.
    ``EXACT`` (16-bit c): the weighted rows' rounding to 16 bits taken back by a second product
    of its remainder, the update then fp32's (the gates' gradient's pieces telescope across
    chunks and add up that rounding otherwise: NOTES.md)."""
    if HAS_DECAY:
        state = state * decay
        cw = c.to(tl.float32) * w_out[:, None]
        c = cw.to(c.dtype)
        if EXACT:
            if c.dtype != tl.float32:
                state = tl.dot(tl.trans((cw - c.to(tl.float32)).to(c.dtype)), v, acc=state,
                               input_precision=PRECISION)
    return tl.dot(tl.trans(c), v, acc=state, input_precision=PRECISION)


@triton.jit
def segment_state(c_rows, v_rows, g_rows, start, end, N, lg, cols_r, cols_d, K: tl.constexpr,
                  PAD=0, W_ROWS=0):
    """``(S, log decay)``: S = Σ_{start≤j<end} λ^(end-1-j) c_jᵀ v_j over logical rows (fp32
    [BLOCK_R, BLOCK_D]), the state a segment adds from zero, and the log of the segment's own
    decay (``(end - start)·log λ``; with gates their sum; 0 for the 0-1 mask); with ``K.NORM``
    also the rows' sums of c and v (:func:`add_norm_sums`). ``end - start``
    is a multiple of BLOCK_N unless end = N. ``g_rows``: the lane's gate rows (``HAS_GATE``) or
    None. ``K``: the kernel's constants (``BLOCK_N``, ``BLOCK_R``, ``BLOCK_D``, ``HAS_DECAY``,
    ``HAS_GATE``, ``REVERSE``, ``PRECISION``, ``ROWS`` read here); ``PAD``:
    :func:`row_positions`'; ``W_ROWS`` (``ROWS``): the lane's rows of V's row weights."""
    BLOCK_D: tl.constexpr = K.BLOCK_D
    BLOCK_N: tl.constexpr = K.BLOCK_N
    BLOCK_R: tl.constexpr = K.BLOCK_R
    HAS_DECAY: tl.constexpr = K.HAS_DECAY
    HAS_GATE: tl.constexpr = K.HAS_GATE
    PRECISION: tl.constexpr = K.PRECISION
    REVERSE: tl.constexpr = K.REVERSE
    local = tl.zeros((BLOCK_R, BLOCK_D), dtype=tl.float32)
    total = tl.full([], 0.0, tl.float32)
    sums = no_norm_sums(K)
    for s in range(start, end, BLOCK_N):
        ok, phys = row_positions(s, N, BLOCK_N, REVERSE, PAD)
        c = load_rows(c_rows, phys, ok, cols_r)  # [BLOCK_N, BLOCK_R]
        v = load_rows(v_rows, phys, ok, cols_d)  # [BLOCK_N, BLOCK_D]
        if HAS_GATE:
            gk = load_gates(g_rows, phys, ok)
            last = tl.sum(gk, axis=0)
            w_out = tl.where(ok, tl.exp(last - tl.cumsum(gk, axis=0)), 0.0)
            if K.ROWS == 1:
                w_out = w_out * load_gates(W_ROWS, phys, ok)
            local = accumulate_state(local, c, v, w_out, tl.exp(last), True, PRECISION,
                                     K.GATE_GRAD)
            total += last
        else:
            w_in, w_out, decay = chunk_weights(lg, s, N, BLOCK_N, HAS_DECAY)
            local = accumulate_state(local, c, v, w_out, decay, HAS_DECAY, PRECISION)
            if K.NORM:
                sums = add_norm_sums(sums, c, v, PRECISION)
    if HAS_DECAY:
        total = (end - start).to(tl.float32) * lg
    if K.NORM:
        res = (local, total, sums)
    else:
        res = (local, total)
    return res


@triton.jit
def no_norm_sums(K: tl.constexpr):
    """``K.NORM``'s sums of a lane's c and v rows before any (``chunk_scan.py``'s
    ``_normalised``): float32 [BLOCK_R, 16] and [16, BLOCK_D], each column (row) the same."""
    BLOCK_R: tl.constexpr = K.BLOCK_R
    BLOCK_D: tl.constexpr = K.BLOCK_D
    return tl.zeros([BLOCK_R, 16], dtype=tl.float32), tl.zeros([16, BLOCK_D], dtype=tl.float32)


@triton.jit
def add_norm_sums(sums, c, v, PRECISION: tl.constexpr):
    """:func:`no_norm_sums`' sums with a chunk's rows c and v added, as products with a tile of
    ones (no fp32 copy of a row tile in registers)."""
    BLOCK_N: tl.constexpr = c.shape[0]
    ones = tl.full([BLOCK_N, 16], 1.0, c.dtype)
    return (tl.dot(tl.trans(c), ones, acc=sums[0], input_precision=PRECISION),
            tl.dot(tl.trans(ones.to(v.dtype)), v, acc=sums[1], input_precision=PRECISION))


@triton.jit
def state_operand(state, dtype: tl.constexpr, HALF_RANGE: tl.constexpr):
    """The fp32 state as a dot operand of ``dtype`` and the factor its products need."""
    if HALF_RANGE:
        return half_operand(state, dtype)
    else:
        return state.to(dtype), 1.0


@triton.jit
def state_remainder(state, h, h_scale):
    """What the fp32 state loses as the 16-bit operand ``h`` (:func:`state_operand`): the
    remainder, an operand of the same scale, whose product added to h's is the fp32 state's to
    about 2^-16."""
    return (state * (1.0 / h_scale) - h.to(tl.float32)).to(h.dtype)


@triton.jit
def chunk_output(x, y, z, h, h_scale, w_in, intra, HAS_DECAY: tl.constexpr,
                 HALF_RANGE: tl.constexpr, PRECISION: tl.constexpr):
    """Rows of one chunk, in fp32: diag(w_in) x·H + (x yᵀ ⊙ mask) z, with H = h·h_scale the
    incoming state as an operand (:func:`state_operand`). The operator's output is
    (x, y, z) = (b, c, v) with H the state; its dual op(E, V, C) is (e, v, c) with Hᵀ. The decay
    scales the fp32 product, not the operand x (no round trip of x through fp32)."""
    out = chunk_inter(x, h, h_scale, w_in, HAS_DECAY, HALF_RANGE, PRECISION)
    scores, own = chunk_intra(x, y, z, intra, HALF_RANGE, PRECISION)
    return out + own


@triton.jit
def chunk_inter(x, h, h_scale, w_in, HAS_DECAY: tl.constexpr, HALF_RANGE: tl.constexpr,
                PRECISION: tl.constexpr):
    """:func:`chunk_output`'s rows from the incoming state, diag(w_in) x·H (fp32)."""
    inter = tl.dot(x, h, input_precision=PRECISION)
    if HALF_RANGE:
        inter = inter * h_scale
    if HAS_DECAY:
        inter = inter * w_in[:, None]
    return inter


@triton.jit
def chunk_intra(x, y, z, intra, HALF_RANGE: tl.constexpr, PRECISION: tl.constexpr):
    """:func:`chunk_output`'s chunk's own part, ``(scores, own)``: the masked scores x yᵀ ⊙ mask
    ([BLOCK_N, BLOCK_N] fp32, exactly 0 above the diagonal) and scores·z."""
    # where, not a product: a non-finite y_j must not reach rows i < j through 0 × NaN
    scores = tl.where(intra != 0.0, tl.dot(x, tl.trans(y), input_precision=PRECISION) * intra, 0.0)
    if HALF_RANGE:
        p, p_scale = half_operand(scores, z.dtype)
        return scores, tl.dot(p, z, input_precision=PRECISION) * p_scale
    else:
        return scores, tl.dot(scores.to(z.dtype), z, input_precision=PRECISION)


@triton.jit
def gate_pieces(e, scores, w, z, REVERSE: tl.constexpr, PRECISION: tl.constexpr):
    """The gates' gradient's pieces a sweep's chunk holds (``notebooks/derivations.py``, "The
    gates' gradient from the pieces the backward's sweeps hold"): ``(rows, total)``, fp32.

    Per row, e = w · inter (``e``, [BLOCK_N] fp32, taken as soon as :func:`chunk_inter` is: the
    row's pairs with a column before the chunk, w_i = b_i and inter = dB's part from the state in
    the forward-time dB sweep, where (x, y, z) = (dO, v, c); v_j and dV's part in the reverse
    sweep: pairs with a row after the chunk), and their chunk total. Forward time, each row t
    gets Σ_(i ≥ t) e_i (II) plus the chunk's own pairs j < t ≤ i (I: the masked scores
    (dO_i·v_j) times b_i·c_j, summed over i ≥ t and then j < t); reverse time, the e of the rows
    logically after it (III: physical j < t). A lane holding a block of the value columns gets
    its block's part of each (every term is a sum over those columns)."""
    after = tl.cumsum(e, axis=0, reverse=True)
    if REVERSE:
        return after - e, tl.sum(e, axis=0)
    pairs = scores * tl.dot(w, tl.trans(z), input_precision=PRECISION)  # [i, j]
    below = tl.cumsum(pairs, axis=0, reverse=True)  # [t, j]: Σ_(i ≥ t) pairs
    rows = tl.arange(0, pairs.shape[0])
    own = tl.sum(tl.where(rows[None, :] < rows[:, None], below, 0.0), axis=1)
    return own + after, tl.sum(e, axis=0)
