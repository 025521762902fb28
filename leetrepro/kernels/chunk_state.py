"""The state a sequence adds, without its outputs: S = Σ_j λ^(N-1-j) c_jᵀ v_j (``REVERSE``: rows read
backwards, S = Σ_j λ^j c_jᵀ v_j). Two tensor passes (C and V read, nothing written but the state):
what a rank of a sequence-parallel run needs before the ranks exchange their states
(``leetrepro.distributed``), in the forward (C, V) and in the backward (B, dO, reverse time).

Grid (lane, segment), a lane one (batch·head, value-column block): each program sums its segment
from zero (``_tiles.segment_state``, the same loop as chunk-scan's first step) into its slot of the
fp32 workspace P; the launcher (``leetrepro.methods.chunk.chunk_state``) weights the segments by
λ^(N - end) (with gates, exp of the gates' sum after the segment) and sums them, in a fixed
order (bit-identical run to run).
"""
import triton
import triton.language as tl

from ._tiles import columns, lane_rows, segment_state


@triton.jit
def chunk_state_kernel(C, V, P, DECAY, SIZE, K: tl.constexpr):
    """C, V: ``(pointer, batch stride, head stride, row stride)`` (time-major slices read in
    place; C may hold groups, ``K.GROUPS[1]`` heads to a group); P: float32 (lanes, segments,
    BLOCK_R, BLOCK_D); ``DECAY = (GAMMA, G)``: float64 λ per head or None, the per-token gates as
    ``(pointer, strides)`` (``K.HAS_GATE``) or None; ``SIZE = (N, R, D, H, SEG)``; ``K``:
    :data:`_tiles.Constants`."""
    BLOCK_D: tl.constexpr = K.BLOCK_D
    BLOCK_R: tl.constexpr = K.BLOCK_R
    HAS_DECAY: tl.constexpr = K.HAS_DECAY
    HAS_GATE: tl.constexpr = K.HAS_GATE
    N, R, D, H, SEG = SIZE
    GAMMA, G = DECAY
    lane = tl.program_id(0)
    seg = tl.program_id(1)
    n_db = tl.cdiv(D, BLOCK_D)
    bh = lane // n_db
    d0 = (lane % n_db) * BLOCK_D
    head = (bh % H).to(tl.int64)
    GC: tl.constexpr = K.GROUPS[1]  # (C in groups: the lane's head reads its group, in place)
    c_rows = lane_rows(C, bh // H, head // GC, 0, False)
    v_rows = lane_rows(V, bh // H, head, 0, False)
    g_rows = lane_rows(G, bh // H, head, 0, False) if HAS_GATE else 0
    cols_r = columns(0, R, BLOCK_R)
    cols_d = columns(d0, D, BLOCK_D)
    if HAS_DECAY:
        lg = tl.log(tl.load(GAMMA + bh % H)).to(tl.float32)  # float64 λ in, log taken in float64
    else:
        lg = 0.0
    start = seg * SEG
    end = tl.minimum(start + SEG, N)
    local, _ = segment_state(c_rows, v_rows, g_rows, start, end, N, lg, cols_r, cols_d,
                             K)  # [BLOCK_R, BLOCK_D]
    tile = cols_r[0][:, None] * BLOCK_D + tl.arange(0, BLOCK_D)[None, :]
    tl.store(P + (lane * tl.num_programs(1) + seg).to(tl.int64) * BLOCK_R * BLOCK_D + tile,
             local)
