"""The per-token gates' gradient on Chunk's kernels: from the pieces the backward's sweeps write
(:func:`gate_gradient_from_pieces`, :func:`gate_gradient_from_rows`, and their buffers), or from the
straddle kernel (:func:`gate_gradient`, ``kernels/gate_straddle.py``), which sums the pairs that
straddle each row.
"""
from __future__ import annotations

import os

import torch

from .._gpu import (NoTriton, cdiv, dot_precision, launch, next_pow2,
                    rows_contiguous, strided)

from . import hopper_launch, tables

try:
    from ...kernels import (_tiles as tiles, gate_rows as rows_kernels,
                            gate_straddle as straddle_kernels)
except ImportError as err:  # without Triton: a clear error when a kernel is called
    tiles = rows_kernels = straddle_kernels = NoTriton(err)


def gate_piece_buffers(width: int, row: int, batch: int, seqs: int, heads: int, n: int, *,
                       dtype: torch.dtype, precision: str, dual: bool, device,
                       config: dict) -> tuple:
    """``(rows, totals)`` for one sweep's gates' gradient's pieces (``kernels/chunk_scan.py``,
    ``GATE_GRAD``): float32 ``(blocks, batch, heads, N)`` and ``(blocks, seqs·heads, chunks)``,
    a block per lane of the sweep's value columns (``width`` of them beside ``row``-wide rows,
    ``BLOCK_D`` of :func:`chunk_config` with the sweep's ``config``), chunks of its ``BLOCK_N``
    rows (packed sequences: each sequence's from its first row, zeros past its last)."""
    cfg = tables.chunk_config(row, width, dtype, precision, True, dual=dual, device=device,
                              config=config)
    blocks, block_n = cdiv(width, cfg["BLOCK_D"]), cfg["BLOCK_N"]
    rows = torch.empty(blocks, batch, heads, n, dtype=torch.float32, device=device)
    size = (blocks, seqs * heads, max(cdiv(n, block_n), 1))
    return rows, (torch.zeros if seqs != batch else torch.empty)(size, dtype=torch.float32,
                                                                  device=device)


def hopper_row_pieces(q: torch.Tensor, block_n: int, reverse: bool) -> tuple:
    """A sweep's pieces ``(rows, totals)`` (as the portable kernel writes them,
    :func:`gate_piece_buffers`) from the Hopper kernel's rows q, float32 ``(blocks, batch,
    heads, N)`` (a block per consumer's or program's columns, summed here), per chunk of ``block_n`` physical
    rows: forward in time (the dB sweep: q = e + δ) each row's sum of q over the rows from it to
    its chunk's end (I + II); in reverse (the dV sweep: q = e) over the rows physically before it
    (logically after it: III); and each chunk's total of q, ``(1, batch·heads, chunks)`` (the
    δ sum to 0 over a chunk). Sums in a fixed order."""
    blocks, batch, heads, n = q.shape
    q = q[0] if blocks == 1 else q.sum(0)
    # (the running sums within tiles the gates take: forward the sums to each tile's end, in
    # reverse from its start, less the row's own)
    sums = hopper_launch.running_tile_sums(q, block_n, not reverse).view(batch, heads, -1, block_n)
    totals = sums[..., -1] if reverse else sums[..., 0]
    rows = sums.view(batch, heads, -1)[..., :n]
    return (rows - q if reverse else rows)[None], totals.reshape(1, batch * heads, -1)


def gate_gradient_from_rows(q_f: torch.Tensor, q_r: torch.Tensor, block_n: int,
                            tail: torch.Tensor | None = None, scale: float = 1.0,
                            like: torch.Tensor | None = None) -> torch.Tensor:
    """dg, float32 ``(batch, heads, N)``, from the Hopper kernel's rows of both sweeps (float32
    ``(blocks, batch, heads, N)``: the dB sweep's q_f forward in time, the dV sweep's q_r), as
    :func:`hopper_row_pieces` of each then :func:`gate_gradient_from_pieces` (no packed
    sequences; ``tail`` and ``scale`` as there) give it: one launch of ``kernels/gate_rows.py``
    on a GPU (or under Triton's interpreter), where those took about twenty PyTorch passes over
    the rows (:data:`GATE_ROWS_ON_GPU`); those two elsewhere. ``like``: the gates, whose layout
    and dtype the kernel writes dg in (``torch.empty_like``: a time-major g's dg time-major, no
    copy after). O(N) a lane, every sum in a fixed order."""
    blocks, batch, heads, n = q_f.shape
    if isinstance(rows_kernels, NoTriton) or n == 0 or not (
            q_f.is_cuda and tables.GATE_ROWS_ON_GPU or os.environ.get("TRITON_INTERPRET") == "1"):
        return gate_gradient_from_pieces(hopper_row_pieces(q_f, block_n, False),
                                         hopper_row_pieces(q_r, block_n, True), block_n, None,
                                         tail, scale)
    dg = torch.empty(batch, heads, n, dtype=torch.float32, device=q_f.device) if like is None \
        else torch.empty_like(like)
    lanes = batch * heads
    launch(rows_kernels.gate_rows_kernel, (lanes,),
           dict(QF=q_f.contiguous(), QR=q_r.contiguous(),
                TAIL=None if tail is None else tail.reshape(lanes).to(torch.float64).contiguous(),
                DG=(dg, tuple(dg.stride())), SIZE=(n, lanes, blocks, q_r.shape[0], heads),
                scale=float(scale),
                BLOCK_N=block_n, TILES=tables.GATE_ROWS_TILES, HAS_TAIL=tail is not None),
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
    if angles and 2 * angles > min(r, tables.STRADDLE_MAX_R):
        raise ValueError(f"angles={angles} turns 2·{angles} of r = {r} dims; the kernel takes "
                         f"2·angles ≤ min(r, {tables.STRADDLE_MAX_R})")
    if n == 0 or B.numel() == 0 or V.numel() == 0:
        dg = V.new_zeros(batch, heads, n, dtype=torch.float32)
        return (dg, V.new_zeros(batch, heads, n, angles, dtype=torch.float32)) if angles else dg
    # (b_i·c_j is a sum over r, and so is every term: pieces of r, summed)
    if r > tables.STRADDLE_MAX_R:
        return _in_pieces_of_r(B, C, V, dO, g, dict(
            initial_state=initial_state, dS=dS, final_state=final_state, cu_seqlens=cu_seqlens,
            scale=scale, precision=precision), angles)
    if os.environ.get("TRITON_INTERPRET") == "1" and V.dtype == torch.bfloat16:
        B, C, V, dO = (x.float() for x in (B, C, V, dO))  # (the interpreter's bf16 dot is wrong)
    B, C, V, dO = (rows_contiguous(x) for x in (B, C, V, dO))
    seqs = batch if cu_seqlens is None else cu_seqlens.numel() - 1
    block_r, block_d = tables.straddle_tiles(r)
    n_db = cdiv(d, block_d)
    blocks = tables.STRADDLE_ANGLE_SEGMENT_BLOCKS if angles else tables.STRADDLE_SEGMENT_BLOCKS
    seg = tables.STRADDLE_BLOCK_N * blocks
    slots = cdiv(n, seg) + (0 if cu_seqlens is None else seqs)
    programs = seqs * heads * n_db  # (lanes; packed, the workspace's rows are a head's, shared)
    ws = torch.empty(2, (seqs if cu_seqlens is None else 1) * heads * n_db, slots, block_r,
                     block_d, dtype=torch.float32, device=V.device)
    dg = (torch.empty if cu_seqlens is None else torch.zeros)(
        n_db, batch, heads, n, dtype=torch.float32, device=V.device)
    K = tiles.constants(dict(BLOCK_N=tables.STRADDLE_BLOCK_N, BLOCK_R=block_r, BLOCK_D=block_d),
                        PRECISION=dot_precision(V.dtype, precision or "tf32x3"),
                        VARLEN=cu_seqlens is not None,
                        HALF_RANGE=V.dtype == torch.float16, SEG_BLOCKS=blocks,
                        GROUPS=(heads // B.shape[1], heads // C.shape[1], 1, 1),
                        ANGLES=(max(16, next_pow2(angles)), angles,
                                tables.STRADDLE_ANGLE_HALF_TILES and V.dtype == torch.bfloat16))
    state = (lambda x: None if x is None else x.to(torch.float32).contiguous())
    common = dict(G=strided(g.to(torch.float32)), CU=cu_seqlens, SIZE=(n, r, d, heads, slots),
                  num_warps=tables.STRADDLE_WARPS, num_stages=1)
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
    step = tables.STRADDLE_MAX_R
    for k in range(0, B.shape[-1], step):
        piece = (lambda x: None if x is None else x[..., k:k + step, :])
        part = {n: piece(x) if n in ("initial_state", "dS", "final_state") else x
                for n, x in options.items()}
        parts.append(gate_gradient(B[..., k:k + step], C[..., k:k + step], V,
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
