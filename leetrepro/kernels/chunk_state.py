"""The state a sequence adds, without its outputs: S = Σ_j λ^(N-1-j) c_jᵀ v_j (``REVERSE``: rows read
backwards, S = Σ_j λ^j c_jᵀ v_j). Two tensor passes (C and V read, nothing written but the state):
what a rank of a sequence-parallel run needs before the ranks exchange their states
(``leetrepro.distributed``), in the forward (C, V) and in the backward (B, dO, reverse time).

Grid (lane, segment), a lane one (batch·head, value-column block): each program sums its segment
from zero (``_tiles.segment_state``, the same loop as chunk-scan's first step) into its slot of the
fp32 workspace P; the launcher (``leetrepro.methods.chunk.chunk_state``) weights the segments by
λ^(N - end) and sums them, in a fixed order (bit-identical run to run).
"""
import triton
import triton.language as tl

from ._tiles import segment_state


@triton.jit
def chunk_state_kernel(C, V, P, GAMMA, N, R, D, H, SEG, SC_B, SC_H, SC_T, SV_B, SV_H, SV_T,
                       HAS_DECAY: tl.constexpr, REVERSE: tl.constexpr,
                       BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr,
                       PRECISION: tl.constexpr):
    lane = tl.program_id(0)
    seg = tl.program_id(1)
    n_db = tl.cdiv(D, BLOCK_D)
    bh = lane // n_db
    d0 = (lane % n_db) * BLOCK_D
    # each tensor through its own (batch, head, row) strides: time-major slices read in place
    c_base = (bh // H).to(tl.int64) * SC_B + (bh % H).to(tl.int64) * SC_H
    v_base = (bh // H).to(tl.int64) * SV_B + (bh % H).to(tl.int64) * SV_H
    cols_r = tl.arange(0, BLOCK_R)
    cols_d = d0 + tl.arange(0, BLOCK_D)
    if HAS_DECAY:
        lg = tl.log(tl.load(GAMMA + bh % H)).to(tl.float32)  # float64 λ in, log taken in float64
    else:
        lg = 0.0
    start = seg * SEG
    end = tl.minimum(start + SEG, N)
    local = segment_state(C, V, c_base, v_base, start, end, N, lg, cols_r, cols_r < R, cols_d,
                          cols_d < D, SC_T, SV_T, BLOCK_R, BLOCK_D, BLOCK_N, HAS_DECAY, REVERSE,
                          PRECISION)
    tile = cols_r[:, None] * BLOCK_D + tl.arange(0, BLOCK_D)[None, :]
    tl.store(P + (lane * tl.num_programs(1) + seg).to(tl.int64) * BLOCK_R * BLOCK_D + tile, local)
