"""The gates' gradient from the rows the Hopper kernel's sweeps write, in one pass
(``leetrepro.methods.chunk.gate_gradient_from_rows``), and the running sums within tiles that
kernel reads its gates as (``leetrepro.methods.chunk.tile_gate_sums``).

Per lane (batch·head), chunks of ``BLOCK_N`` rows: the dB sweep's rows q_f (forward in time: each
row's e + δ, ``GATE_GRAD``) and the dV sweep's q_r (e), each a float32 row per block of value
columns (summed here, blocks in order). A row's dg is

    dg_t = Σ_(s ≥ t in its chunk) q_f[s]  +  Σ_(s < t in its chunk) q_r[s]  +  K_c
    K_c  = Σ_(c' > c) (E_c' − F_c')  −  F_c  (+ T_N)

with E_c, F_c the chunk's totals of q_f and q_r, the sum over later chunks in float64 (its terms
cancel over a long sequence), T_N the final state's pairs ⟨dS_N, S_N⟩ / scale (``TAIL``), all
times ``scale``: the same sums as ``hopper_row_pieces`` and ``gate_gradient_from_pieces`` take in
about twenty PyTorch passes over these rows. One program a lane walks its chunks from the last,
``TILES`` of them a step; every sum in a fixed order (the same inputs give the same bits).
"""
import triton
import triton.language as tl


@triton.jit
def gate_rows_kernel(QF, QR, TAIL, DG, SIZE, scale, BLOCK_N: tl.constexpr, TILES: tl.constexpr,
                     HAS_TAIL: tl.constexpr):
    """QF, QR: float32 ``(blocks, lanes, N)`` contiguous; TAIL: float64 ``(lanes,)`` or None;
    ``DG = (dg, its strides)``: dg ``(batch, heads, N)`` at any strides (the gates' own layout,
    time-major say) and float dtype, written rounded to it; ``SIZE = (N, lanes, QF's blocks,
    QR's blocks, heads)``."""
    N, LANES, NF, NR, HEADS = SIZE
    SB, SH, SN = DG[1]
    out = DG[0]
    lane = tl.program_id(0).to(tl.int64)
    tiles = tl.arange(0, TILES)
    k = tl.arange(0, BLOCK_N)
    chunks = tl.cdiv(N, BLOCK_N)
    later = tl.zeros([1], tl.float64)  # Σ over the chunks already walked of E − F
    if HAS_TAIL:
        later += tl.load(TAIL + lane + tl.zeros([1], tl.int64))
    steps = tl.cdiv(chunks, TILES)
    for step in range(steps):
        first = (steps - 1 - step) * TILES  # (the step's first chunk: walked from the last)
        rows = (first + tiles)[:, None] * BLOCK_N + k[None, :]  # [TILES, BLOCK_N]
        ok = rows < N
        qf = tl.zeros([TILES, BLOCK_N], tl.float32)
        for b in range(NF):
            qf += tl.load(QF + (b * LANES + lane) * N + rows, mask=ok, other=0.0)
        qr = tl.zeros([TILES, BLOCK_N], tl.float32)
        for b in range(NR):
            qr += tl.load(QR + (b * LANES + lane) * N + rows, mask=ok, other=0.0)
        e = tl.sum(qf, axis=1)  # [TILES]
        f = tl.sum(qr, axis=1)
        diff = e.to(tl.float64) - f.to(tl.float64)
        # (for each chunk, E − F over the step's chunks after it, then the earlier steps')
        after = tl.cumsum(diff, axis=0, reverse=True) - diff + later
        kc = (after - f.to(tl.float64)).to(tl.float32)
        dg = tl.cumsum(qf, axis=1, reverse=True) + (tl.cumsum(qr, axis=1) - qr) + kc[:, None]
        tl.store(out + (lane // HEADS) * SB + (lane % HEADS) * SH + rows.to(tl.int64) * SN,
                 dg * scale, mask=ok)
        later += tl.sum(diff, axis=0)


@triton.jit
def _tile_sums(G, OUT, unit, step, SIZE, STRIDES, BLOCK_N: tl.constexpr, TILES: tl.constexpr,
               REVERSE: tl.constexpr, SHIFT: tl.constexpr, FOLD, WHICH: tl.constexpr,
               UNIT: tl.constexpr, HB: tl.constexpr):
    N, HEADS, WHOLE = SIZE
    SB, SH, SN = STRIDES
    rows = (step * TILES + tl.arange(0, TILES))[:, None] * BLOCK_N + \
        tl.arange(0, BLOCK_N)[None, :]
    rows = rows.to(tl.int64)[:, :, None]  # [TILES, BLOCK_N, 1]
    blocks = tl.cdiv(HEADS, HB)
    head = (unit % blocks) * HB + tl.arange(0, HB)[None, None, :]  # [1, 1, HB]
    lane = (unit // blocks) * HEADS + head
    src = rows + 1 if SHIFT else rows  # (the reverse sweeps' gates: row t carries g_(t+1))
    g = tl.load(G + (unit // blocks) * SB + head * SH + src * SN, mask=(src < N) & (head < HEADS),
                other=0.0).to(tl.float32)
    if FOLD is not None:  # (raised to the floor, NaN kept, and written as the kernels read it)
        g = tl.where(src < N, tl.maximum(g, FOLD[0], propagate_nan=tl.PropagateNan.ALL), 0.0)
        tl.store(FOLD[1 + WHICH] + lane * N + rows, g, mask=(rows < N) & (head < HEADS))
    sums = tl.cumsum(g, axis=1, reverse=REVERSE)
    if UNIT != 1.0:
        sums = sums * UNIT
    tl.store(OUT + lane * (WHOLE * BLOCK_N) + rows, sums,
             mask=(rows < WHOLE * BLOCK_N) & (head < HEADS))


@triton.jit
def tile_sums_kernel(G, OUT, SIZE, STRIDES, BLOCK_N: tl.constexpr, TILES: tl.constexpr,
                     REVERSE: tl.constexpr, TWIN=None, FOLD=None, SHIFT_TWIN: tl.constexpr = False,
                     UNIT: tl.constexpr = 1.0, HB: tl.constexpr = 1):
    """Running sums of the gates within each tile of ``BLOCK_N`` rows, from the tile's first row
    (``REVERSE``: from its last back), in float32. G: ``(batch, heads, N)`` at any strides
    ``STRIDES``, any float dtype; OUT: float32 ``(batch·heads, whole tiles·BLOCK_N)`` contiguous,
    the rows past N read as 0; ``SIZE = (N, heads, whole tiles)``. A program takes ``TILES``
    tiles (axis 1 of the grid: its steps) of ``HB`` heads of one batch row (axis 0: batch rows
    times blocks of heads): more than one where the gates' rows are not contiguous (time-major
    gates, heads innermost), so that its loads are (a head a program read 4 bytes of each
    32-byte sector: 9.3 µs for Mamba-2's 2 × 64 heads × 8192, H200). ``TWIN = (G2, OUT2,
    STRIDES2)``: a second gates' sums, in the other direction, by the grid's second row on
    axis 2 (a backward's forward and reverse gates in one launch); ``SHIFT_TWIN``: G2 read one
    row on (row t takes row t + 1's gate, the last row 0: ``decay.per_token.shift_gates`` of
    one sequence).
    ``FOLD = (floor, FOLDED, FOLDED2)``: each gate raised to ``floor`` before it is summed
    (``decay.per_token.fold_gates``, NaN kept) and written to FOLDED (the twin's to FOLDED2),
    float32 ``(batch·heads, N)`` contiguous: the gates the other kernels read, from the same
    launch. ``UNIT``: the sums written times it (log2 e: the Hopper kernel's base-2 exponents)."""
    unit = tl.program_id(0).to(tl.int64)
    if TWIN is None:
        _tile_sums(G, OUT, unit, tl.program_id(1), SIZE, STRIDES, BLOCK_N, TILES,
                   REVERSE, False, FOLD, 0, UNIT, HB)
    elif tl.program_id(2) == 0:
        _tile_sums(G, OUT, unit, tl.program_id(1), SIZE, STRIDES, BLOCK_N, TILES,
                   REVERSE, False, FOLD, 0, UNIT, HB)
    else:
        _tile_sums(TWIN[0], TWIN[1], unit, tl.program_id(1), SIZE, TWIN[2], BLOCK_N,
                   TILES, not REVERSE, SHIFT_TWIN, FOLD, 1, UNIT, HB)
