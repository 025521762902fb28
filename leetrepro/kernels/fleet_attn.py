"""FleetAttention forward in Triton (Algorithm 5 / Appendix B.4, decay of Appendix C.1).

One program owns a (batch·head, value-column block) pair and sweeps the row blocks in order; for
each row block it loops over the ranks j, adding diag(b_j)(λ-cumsum(diag(c_j) V_blk) + λ^(i+1) l^j)
into an on-chip accumulator, and carries the prefix sums l^j (one per rank, fp32) in a workspace of
(batch·heads, r, d) that only this program touches. The sum over ranks therefore happens inside one
program: no race, bit-identical results run after run.

FA_modify (Appendix D, Table 9) is the same kernel launched with the ranks split across programs
(``RANK_GROUPS`` > 1) that add their partial sums into O with a plain load-add-store: concurrent
programs lose each other's updates. It is wrong by design and exists only to reproduce Table 9.
"""
import triton
import triton.language as tl


@triton.jit
def _decayed_scan(x1, a1, x2, a2):
    # composition of y -> a1*y + x1 then y -> a2*y + x2: the linear recurrence y_i = λ y_{i-1} + x_i
    return x1 * a2 + x2, a1 * a2


@triton.jit
def fa_fwd_kernel(B, C, V, O, L_WS, GAMMA, N, R, D, H, RANKS_PER_PROGRAM,
                  HAS_DECAY: tl.constexpr, ACCUMULATE: tl.constexpr,
                  BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    bh = tl.program_id(0)
    d0 = tl.program_id(1) * BLOCK_D
    j0 = tl.program_id(2) * RANKS_PER_PROGRAM
    j1 = tl.minimum(j0 + RANKS_PER_PROGRAM, R)
    bc_base = bh.to(tl.int64) * N * R
    vo_base = bh.to(tl.int64) * N * D
    ws_base = bh.to(tl.int64) * R * D
    rows = tl.arange(0, BLOCK_N)
    cols = d0 + tl.arange(0, BLOCK_D)
    d_ok = cols < D
    if HAS_DECAY:
        lg = tl.log(tl.load(GAMMA + bh % H)).to(tl.float32)  # float64 λ in, log taken in float64
        w_in = tl.exp((rows + 1).to(tl.float32) * lg)              # weight of l^j at row i
        w_out = tl.exp((BLOCK_N - 1 - rows).to(tl.float32) * lg)   # weight of row i in the next l^j
        block_decay = tl.exp(BLOCK_N * lg)
        lam = tl.zeros((BLOCK_N, BLOCK_D), dtype=tl.float32) + tl.exp(lg)
    for s in range(0, N, BLOCK_N):
        n = s + rows
        n_ok = n < N
        tile = n_ok[:, None] & d_ok[None, :]
        vo_off = vo_base + n[:, None].to(tl.int64) * D + cols[None, :]
        v = tl.load(V + vo_off, mask=tile, other=0.0).to(tl.float32)
        acc = tl.zeros((BLOCK_N, BLOCK_D), dtype=tl.float32)
        for j in range(j0, j1):
            b_j = tl.load(B + bc_base + n.to(tl.int64) * R + j, mask=n_ok, other=0.0).to(tl.float32)
            c_j = tl.load(C + bc_base + n.to(tl.int64) * R + j, mask=n_ok, other=0.0).to(tl.float32)
            x = c_j[:, None] * v
            l_j = tl.load(L_WS + ws_base + j * D + cols, mask=d_ok, other=0.0)
            if HAS_DECAY:
                cs, _ = tl.associative_scan((x, lam), 0, _decayed_scan)
                cs += w_in[:, None] * l_j[None, :]
                l_j = block_decay * l_j + tl.sum(w_out[:, None] * x, axis=0)
            else:
                cs = tl.cumsum(x, axis=0) + l_j[None, :]
                l_j = l_j + tl.sum(x, axis=0)
            acc += b_j[:, None] * cs
            tl.store(L_WS + ws_base + j * D + cols, l_j, mask=d_ok)
        if ACCUMULATE:  # FA_modify: unsynchronised read-add-write across rank groups (a race)
            acc += tl.load(O + vo_off, mask=tile, other=0.0).to(tl.float32)
        tl.store(O + vo_off, acc.to(O.dtype.element_ty), mask=tile)
