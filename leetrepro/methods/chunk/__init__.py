"""Chunk-scan (Chunk): this project's kernel for the operator, lightningAttention-2's chunked form
made single-pass for every batch size (design and measurements in NOTES.md).

For chunks of L rows with state H (r × d, fp32) entering chunk [s, s+L):
    O_[s:s+L] = (B C ᵀ ⊙ M)_chunk V_chunk + diag(λ^1..λ^L) B_chunk H,
    H ← λ^L H + (diag(λ^(L-1)..λ^0) C_chunk)ᵀ V_chunk.
At batch·heads too small to fill the GPU, each head's N rows are split into segments whose states
are chained through a two-slot ring buffer (``kernels/chunk_scan.py``): B, V, O once and C, V twice
(segments short enough for the second read to hit L2 measured slower on the H100: their
pipelines are too short; NOTES.md). At batch·heads ≥ 2 × SMs: one pass, exactly the four tensors.
Time O(N·(L·(r+d) + r·d)); extra memory O(batch·heads·r·d) (the ring, two states per lane).

State in and out (for prompts processed in pieces and for generation): ``initial_state`` S0
``(batch, heads, r, d)`` and ``output_final_state=True`` returning ``(O, S_N)`` (S_N in float32) with
    S_N = λ^N S0 + Σ_j λ^(N-1-j) c_jᵀ v_j,   O_i += λ^(i+1) b_i S0,
the convention of RetNet's recurrent form and flash-linear-attention (S_t = λ S_{t-1} + c_tᵀ v_t,
o_t = b_t S_t), so running two halves with the state passed on equals running the whole.

The method in files that each do one job, bottom up: :mod:`.tables` (tiles, rules and the Hopper
switches), :mod:`.hopper_launch` (the Hopper kernel's launcher), :mod:`.plans` (what a call
launches), :mod:`.scan` (the entries), :mod:`.gate_grads` (the per-token gates' gradient). The
names below are theirs; a switch or table (``HOPPER_NORM``, ``PIECES_DC``, …) is read and set on
its own module (``chunk.tables.HOPPER_NORM``), and a function replaced in a test on the module
that calls it.
"""
from . import gate_grads, hopper_launch, plans, scan, tables
from .gate_grads import (gate_gradient, gate_gradient_from_pieces, gate_gradient_from_rows,
                         gate_piece_buffers, hopper_row_pieces)
from .hopper_launch import (HopperLaunch, gluon_dtype, hopper_constants, hopper_norm_unfit,
                            hopper_operand_unfit, hopper_pieces, hopper_pieces_unfit, hopper_unfit,
                            rows_unfit, tile_gate_sums)
from .plans import ApartPlan, LaunchPlan, launch_plan, zeroed_counters
from .scan import chunk_scan, chunk_state, per_head_like
from .tables import (HAS_TRITON, Operands, block_d, chunk_config, few_lanes, force_kernel,
                     gate_grad_block, groups_of, hopper_split, hopper_tiles, hopper_wins,
                     misaligned, operand_kind, piece_cols, regime, straddle_tiles, tuned_table)

__all__ = ["ApartPlan", "HAS_TRITON", "HopperLaunch", "LaunchPlan", "Operands", "block_d",
           "chunk_config", "chunk_scan", "chunk_state", "few_lanes", "force_kernel",
           "gate_grad_block", "gate_gradient", "gate_gradient_from_pieces",
           "gate_gradient_from_rows", "gate_piece_buffers", "gate_grads", "gluon_dtype",
           "groups_of", "hopper_constants", "hopper_launch", "hopper_norm_unfit",
           "hopper_operand_unfit", "hopper_pieces", "hopper_pieces_unfit", "hopper_row_pieces",
           "hopper_split", "hopper_tiles", "hopper_unfit", "hopper_wins", "launch_plan",
           "misaligned", "operand_kind", "per_head_like", "piece_cols", "plans", "regime",
           "rows_unfit", "scan", "straddle_tiles", "tables", "tile_gate_sums", "tuned_table",
           "zeroed_counters"]
