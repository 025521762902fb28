"""The per-token gates' gradient inside Chunk's backward sweeps: whether the sweeps carry its
pieces (:func:`_in_sweeps`), the buffers and options each sweep takes (:func:`_piece_sweeps`),
the straddle kernel where they do not (:func:`_straddle_gradient`), and the row dots' buffer
of Mamba-2's rows (:func:`_row_dots`).
"""
from __future__ import annotations

import contextlib
import os

import torch

from ..decay.per_token import final_pairs
from ..methods import chunk
from ..methods._gpu import dot_precision
from ..registry import Method, on_change
from ..tuning import HOPPER
from . import forward

#: :func:`_piece_sweeps`' decisions by call signature (:func:`_piece_key`): a model's layers
#: repeat one signature, and deciding afresh took a third of a gated backward's Python (136 of
#: 378 calls at a 125M model's layer, ``probes.launches``' plan)
_PIECES: dict = {}


def _row_dots(m: Method, rows, pieces, B: torch.Tensor, V: torch.Tensor) -> torch.Tensor | None:
    """The row dots' buffer (float32 ``(2, blocks, batch·heads, N)``, summed over its blocks
    after the sweep) where the reverse sweep with the dual output takes ``rows``
    (:func:`_gradients`): Chunk's, carrying the gates' pieces (on the Hopper kernel where it
    takes them, ``chunk.tables.HOPPER_ROW_DOTS``: a block per consumer's DC/2 columns); else None."""
    if rows is None or pieces is None or not pieces["dual"]:
        return None
    if m.fn is not chunk.chunk_scan:
        return None
    dc = pieces["hopper"][1]
    if dc and chunk.hopper_launch._hopper_rows_unfit(B, V, 2):
        return None
    blocks = 2 * V.shape[-1] // dc if dc else 1
    return torch.empty(2, blocks, V.shape[0] * V.shape[1], V.shape[2], dtype=torch.float32,
                       device=V.device)


def _straddles(m: Method, V: torch.Tensor) -> bool:
    """Whether the gates' gradient is taken by its straddle kernel
    (:func:`leetrepro.methods.chunk.gate_gradient`): fp16/bf16/fp32 on a GPU, or under Triton's
    interpreter beside a Triton method (a PyTorch method on the CPU keeps to PyTorch: the
    interpreter is the tests' stand-in for a GPU, not a CPU's way to run); float64 and the rest
    take the row dots (:func:`gate_gradient`)."""
    return V.dtype in (torch.float16, torch.bfloat16, torch.float32) and chunk.HAS_TRITON and \
        (V.is_cuda or (m.language == "triton" and os.environ.get("TRITON_INTERPRET") == "1"))


#: the widest r or d at which ``gate_grad="auto"`` takes dg from the sweeps' pieces: past it
#: Falcon-H1's SSD forward + backward (d_state 256) ran 2.1× slower than with the straddle kernel
#: beside sweeps the Hopper kernel may take (the pieces' sweeps are the portable kernel's, at
#: 32-row chunks there; 4.5× before each took at most ``chunk.tables.PIECE_COLS`` value columns, H200,
#: NOTES.md); past it only the Hopper kernel's pieces, with ``chunk.tables.HOPPER_PIECES_WIDE``
PIECES_MAX_WIDTH = 128


def _in_sweeps(m: Method, opts: dict, dO: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
               V: torch.Tensor, cu_seqlens=None) -> bool:
    """Whether the gates' gradient comes from Chunk's backward sweeps (their pieces,
    :func:`leetrepro.methods.chunk.gate_gradient_from_pieces`) rather than the straddle kernel:
    Chunk (not with ``kernel="hopper"`` named: its sweeps may take the pieces on either kernel,
    :func:`_piece_sweeps`) on a GPU or under Triton's interpreter, where its option
    ``gate_grad`` says so: ``"sweeps"``, or ``"auto"`` with fp16/bf16 inputs (fp32 inputs keep
    the straddle kernel at every ``fp32_precision``: see the end of the function). The pairs
    that span a whole chunk come from a running sum of the chunks' totals, which adds up any
    rounding of the states the totals are taken from: the state as a 16-bit dot operand and its
    update's weighted rows rounded to 16 bits put bf16 dg 1.4e-2 from float64 at 64 chunks
    (H100, NOTES.md). The sweeps carrying the pieces in fp16/bf16 therefore take each of those two
    products twice, the rounding's remainder as a second operand (``kernels/_tiles.py``:
    ``state_remainder``,
    ``accumulate_state``'s ``EXACT``): bf16 and fp16 dg then within 1.3× of the straddle
    kernel's error, up to N = 32768 with strong gates (H100, NOTES.md). ``"auto"`` keeps the
    straddle kernel for fp32 and where r or d exceeds :data:`PIECES_MAX_WIDTH`, unless
    ``chunk.tables.HOPPER_PIECES_WIDE`` and the Hopper kernel takes both sweeps' pieces there."""
    source = opts.get("gate_grad", "auto")
    # (where the straddle kernel could run: the sweeps' pieces are the alternative there)
    if m.fn is not chunk.chunk_scan or opts.get("kernel") == "hopper" or source == "straddle" \
            or not _straddles(m, V):
        return False
    if source == "sweeps":
        return True
    if max(B.shape[-1], V.shape[-1]) > PIECES_MAX_WIDTH:
        return chunk.tables.HOPPER_PIECES_WIDE and not opts.get("config") and \
            opts.get("kernel", "auto") != "portable" and \
            all(chunk.hopper_pieces(*sweep, reverse=rev, cu_seqlens=cu_seqlens)
                for sweep, rev in zip(_piece_operands(dO, B, C, V), (False, True)))
    # fp32 keeps the straddle kernel at every precision: with exact dots ("ieee", "tf32x3") the
    # pieces' dg put A's and dt_bias's gradients of Mamba-2's SSD 1.9e-3 and 2.7e-3 from float64
    # at 2 × 8192 rows (H200), the straddle kernel 4.8e-6 and 3.6e-6 (NOTES.md)
    return V.dtype != torch.float32


def _piece_operands(dO, B, C, V) -> tuple:
    """The two sweeps carrying dg's pieces as ``(B', C', V', E)``: op(B', C', V') with the pieces'
    row vectors E: the dB sweep forward in time, op(dO, V, C) beside B, and the dV sweep in
    reverse, op(C, B, dO) beside V."""
    return (dO, V, C, B), (C, B, dO, V)


def _piece_sweeps(opts: dict, dO, B, C, V, dual: bool, cu_seqlens, rows: bool = False) -> tuple:
    """``(opts, pieces)`` of a gated backward whose sweeps carry dg's pieces: the options with
    the row block both sweeps take (:func:`leetrepro.methods.chunk.gate_grad_block`), and
    ``pieces``: the dB sweep's buffers (``forward``: r value columns beside d-wide rows), the
    reverse sweep's (dV's d columns beside r-wide rows; ``dual``: with dC's, where the dual
    sweep can take them), the ``block`` and each sweep's launch ``configs`` (the row block, and
    a plain sweep's value columns at most :data:`leetrepro.methods.chunk.tables.PIECE_COLS`).
    ``hopper``: the value columns a program holds (DC, 0 for the portable kernel) of the dB
    sweep and of the reverse sweep where each takes its pieces on the Hopper kernel
    (:func:`leetrepro.methods.chunk.hopper_pieces`; not with the caller's config): then dV's
    sweep apart from dC's, a portable sweep beside it at that kernel's row block (where its own
    holds as many rows), its buffer the kernel's rows (a block per consumer, or per program:
    ``chunk.tables.HOPPER_ROWS_SUMMED``; no totals:
    :func:`leetrepro.methods.chunk.hopper_row_pieces` takes them, or with both sweeps there
    :func:`leetrepro.methods.chunk.gate_gradient_from_rows` dg itself). ``rows``: the dual sweep
    would carry Mamba-2's row dots too (:func:`_row_dots`)."""
    key = _piece_key(opts, dO, B, C, V, dual, cu_seqlens, chunk.tables, rows)
    decided = _PIECES.get(key)
    if decided is None:
        if len(_PIECES) >= 1024:
            _PIECES.clear()
        decided = _PIECES[key] = _piece_decision(opts, dO, B, C, V, dual, cu_seqlens, rows)
    hopper, dual, block, config, configs, precision = decided
    config, configs = dict(config), tuple(dict(c) for c in configs)  # (the caller's own)
    batch, heads, n = V.shape[0], V.shape[1], V.shape[2]
    seqs = batch if cu_seqlens is None else cu_seqlens.numel() - 1

    def buffers(width, row, cfg, with_dc=False):
        return chunk.gate_piece_buffers(width, row, batch, seqs, heads, n, dtype=V.dtype,
                                        precision=precision, dual=with_dc, device=V.device,
                                        config=cfg)

    def rows(width, dc):  # (the Hopper kernel's: a block per consumer's DC/2 columns, or
        # per program's DC, zeros its consumers add into: chunk.tables.HOPPER_ROWS_SUMMED)
        summed = chunk.tables.HOPPER_ROWS_SUMMED
        return (torch.zeros if summed else torch.empty)(
            (1 if summed else 2) * width // dc, batch, heads, n, dtype=torch.float32,
            device=V.device), None
    r, d = B.shape[-1], V.shape[-1]
    return dict(opts, config=config), dict(
        forward=rows(r, hopper[0]) if hopper[0] else buffers(r, d, configs[0]),
        reverse=rows(d, hopper[1]) if hopper[1] else buffers(d, r, configs[1], dual),
        block=block, dual=dual, configs=configs, hopper=list(hopper))


def _piece_key(opts: dict, dO, B, C, V, dual: bool, cu_seqlens, tables, rows: bool) -> tuple:
    """What :func:`_piece_decision` reads: the four tensors' shapes, strides and 16-byte
    alignment, dtype and device (the GPU's SMs and capability), the options it reads, whether the
    row dots come too (``rows``), the sequences' count, and Chunk's switches (``tables``) at this
    call."""
    config = opts.get("config")
    return (dO.shape, B.shape, C.shape, V.shape, dO.stride(), B.stride(), C.stride(), V.stride(),
            dO.data_ptr() % 16, B.data_ptr() % 16, C.data_ptr() % 16, V.data_ptr() % 16,
            V.dtype, V.device, dual, rows, None if cu_seqlens is None else cu_seqlens.numel(),
            opts.get("kernel", "auto"), opts.get("fp32_precision", "tf32"),
            None if not config else tuple(sorted(config.items())), tables.HOPPER_PIECES,
            tables.HOPPER_DUAL_PIECES, tables.HOPPER_DUAL_PIECES_SHARE, tables._FORCED[0],
            tables.HOPPER_PIECES_SEGMENTS, tables.HOPPER_DUAL_ROWS_ANY_LANES,
            id(tables.PIECES_DC),
            tables.PIECE_COLS)


def _piece_decision(opts: dict, dO, B, C, V, dual: bool, cu_seqlens, rows: bool = False) -> tuple:
    """:func:`_piece_sweeps`' decisions, the tensors' values unread: ``(hopper, dual, block,
    config, configs, precision)``."""
    r, d = B.shape[-1], V.shape[-1]
    precision = dot_precision(V.dtype, opts.get("fp32_precision", "tf32"))
    hopper = [0, 0]  # (the dB sweep's DC, the reverse sweep's)
    dual = dual and forward._dual_fits(B, V)
    hopper_dual = False
    if not opts.get("config") and opts.get("kernel", "auto") != "portable":
        hopper = [chunk.hopper_pieces(*sweep, reverse=rev, cu_seqlens=cu_seqlens) or 0
                  for sweep, rev in zip(_piece_operands(dO, B, C, V), (False, True))]
        if dual:  # (the reverse sweep with dC's dual output, where the Hopper kernel takes it)
            both = chunk.hopper_pieces(C, B, dO, V, reverse=True, dual=True, rows=rows,
                                       cu_seqlens=cu_seqlens)
            hopper_dual = bool(both)
            hopper[1] = both or hopper[1]
    if any(hopper) and not all(hopper):  # (the portable sweep beside it at 64-row chunks)
        row, width, with_dc = (d, r, False) if not hopper[0] else (r, d, dual)
        if chunk.chunk_config(row, width, V.dtype, precision, True, dual=with_dc,
                              device=V.device)["BLOCK_N"] < HOPPER["BLOCK_N"]:
            hopper, hopper_dual = [0, 0], False
    dual = dual and (not hopper[1] or hopper_dual)
    # (a row block the caller's config names serves both; each plain sweep its own value
    # columns, at most chunk.tables.PIECE_COLS, unless the caller's config names them: the dual sweep
    # holds its whole state)
    block = HOPPER["BLOCK_N"] if any(hopper) else \
        chunk.gate_grad_block(r, d, V.dtype, precision, dual, V.device)
    config = dict(BLOCK_N=block) | (opts.get("config") or {})
    block = config["BLOCK_N"]
    configs = tuple((dict(BLOCK_D=chunk.piece_cols(row, width)) if capped else {}) | config
                    for row, width, capped in ((d, r, True), (r, d, not dual)))
    return (tuple(hopper), dual, block, tuple(config.items()),
            tuple(tuple(c.items()) for c in configs), precision)


on_change(_PIECES.clear)


def _piece_opts(opts: dict, pieces: dict, i: int) -> dict:
    """The options of the dB sweep (``i`` 0) or the reverse sweep (1) carrying the pieces: its
    launch config on the portable kernel, or the Hopper kernel asked for by name with its DC."""
    if pieces["hopper"][i]:
        return dict(opts, config=dict(DC=pieces["hopper"][i]), kernel="hopper")
    return dict(opts, config=pieces["configs"][i])


def shared_sums(m: Method, gate, reverse_gate):
    """The scope of a backward's sweeps: Chunk's gated sweeps read one set of tile sums of
    ``gate`` and ``reverse_gate`` (:func:`leetrepro.methods.chunk.hopper_launch.shared_tile_sums`);
    nothing for other methods, or where the reverse sweeps read the same gates (none: no gates,
    or no reverse sweep)."""
    if reverse_gate is gate:
        return contextlib.nullcontext()
    if m.fn is not chunk.chunk_scan:
        return contextlib.nullcontext()
    return chunk.hopper_launch.shared_tile_sums(gate, reverse_gate)


def _straddle_gradient(dO, B, C, V, gate, initial_state, dS, cu_seqlens, scale, precision=None):
    return chunk.gate_gradient(B, C, V, dO, gate, initial_state=initial_state, dS=dS,
                               cu_seqlens=cu_seqlens, scale=scale, precision=precision)


def _exact_dots(m: Method, opts: dict, dtype: torch.dtype) -> bool:
    """Whether method ``m`` with ``opts`` computes its products to float32's accuracy or better
    on inputs of ``dtype``: float64; float32 in the PyTorch methods, or in the kernels with
    ``fp32_precision`` "ieee" or "tf32x3" (their default, tf32, rounds the operands to 10 bits)."""
    if dtype == torch.float64:
        return True
    if dtype != torch.float32:
        return False
    return m.language == "torch" or \
        opts.get("fp32_precision", m.options.get("fp32_precision")) in ("ieee", "tf32x3")


def gradient_from_pieces(pieces: dict, dS, SN, cu_seqlens, scale: float,
                         like: torch.Tensor | None = None) -> torch.Tensor:
    """dg, float32 ``(batch, heads, N)``, from the pieces Chunk's two sweeps wrote
    (:func:`_piece_sweeps`' ``pieces``): where the Hopper kernel wrote both sweeps' rows, one
    pass over them (:func:`leetrepro.methods.chunk.gate_gradient_from_rows`); else each sweep's
    chunk sums (the Hopper kernel's rows summed by chunks here) and their running sums
    (:func:`leetrepro.methods.chunk.gate_gradient_from_pieces`). ⟨dS_N, S_N⟩ joins each
    sequence's last row (``dS``, ``SN``: the final state's gradient and the state); the one pass
    writes it in ``like``'s layout and dtype (the gates'). O(N) a lane."""
    tail = final_pairs(dS, SN)
    tail = None if tail is None else tail / scale
    if all(pieces["hopper"]) and cu_seqlens is None:  # (both sweeps' rows: one pass)
        return chunk.gate_gradient_from_rows(pieces["forward"][0], pieces["reverse"][0],
                                             pieces["block"], tail, scale, like)
    for i, name in enumerate(("forward", "reverse")):
        if pieces["hopper"][i]:  # (the Hopper kernel's rows: their sums within each chunk)
            pieces[name] = chunk.hopper_row_pieces(pieces[name][0], pieces["block"], i == 1)
    return chunk.gate_gradient_from_pieces(pieces["forward"], pieces["reverse"], pieces["block"],
                                           cu_seqlens, tail, scale)
