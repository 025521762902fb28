"""Registers and spills of Chunk's scan kernel per launch configuration, compiled for a GPU
architecture without one (Triton's compiler and ``ptxas`` on the host; no device needed).

``--hopper`` compiles the warp-specialised Hopper forward instead (``kernels/chunk_hopper.py``,
:func:`compile_hopper`), whose partitions hold their own register budgets (``setmaxnreg``):
``ptxas`` then reports the launch budget (168) and the spills of the partition that has them.

``python -m leetrepro.probes.regs [--arch 90] [--configs fp16:decay:64:3 ...]`` compiles the kernel
as :mod:`leetrepro.methods.chunk` launches it (r = d = 128, 8 warps, batch 1's split form unless a
config ends in ``:one``) and prints ``ptxas -v``'s registers, stack frame and spill bytes per
thread. The kernel holds a 128 × 128 fp32 state per program (64 registers per thread at 8 warps)
beside the chunk's products: what does not fit in 255 registers goes to local memory, whose
traffic shows up in a profile as L1/TEX scoreboard stalls (NOTES.md).
"""
from __future__ import annotations

import argparse
import itertools
import os
import shutil
import subprocess
import sys
import tempfile

POINTER = {"fp16": "*fp16", "bf16": "*bf16", "fp32": "*fp32"}
DEFAULT = ["fp16:0-1:64:3", "fp16:decay:64:3", "fp16:decay:32:3", "fp32:0-1:32:2",
           "fp32:decay:64:2", "fp32:decay:32:2"]


def compile_ptx(dtype: str, decay: bool, block_n: int, stages: int, split: bool = True,
                arch: int = 90, precision: str = "tf32", groups: tuple = (1, 1, 1, 1),
                gate_grad: bool = False, reverse: bool = False, dual: bool = False,
                rows: int = 0, norm: int = 0, repair: bool = False) -> str:
    """The PTX of ``chunk_scan_kernel`` for one configuration (forward, no state in or out;
    ``groups``: the kernel's ``GROUPS``, B, C, V, E read by groups of heads). ``gate_grad``: a
    gated backward sweep with the gates' gradient's pieces instead (per-token gates, the
    repair launch's flags; ``reverse``, ``dual``: the reverse sweep, with dC's output; ``rows``
    2: with E's row weights, dx and the row dots, Mamba-2's), as ``leetrepro.ops`` launches
    it. ``norm``: normalised linear attention's forward in the sweep (1), or the scores' offsets
    (2 by rows, 3 by columns, 4 constant; ``reverse`` too); ``repair``: the repair launch's
    variant (one segment a lane)."""
    if gate_grad:
        return _compile_gate_grad_ptx(dtype, block_n, stages, split, arch, precision, reverse,
                                      dual, rows)
    from ..kernels._tiles import Constants
    p = POINTER[dtype]
    strided = (p, "i64", "i64", "i64")
    sig = dict(B=strided, C=strided, V=strided, O=strided, E="constexpr", O2="constexpr",
               STATES=("constexpr", "constexpr"),
               RING=("*fp32", "*i32", "*i32") if split else ("constexpr", "constexpr", "*i32"),
               DECAY=("*fp64" if decay else "constexpr", "constexpr"), CU="constexpr",
               SIZE=("i32",) * 6,
               SCALE=("fp32", "fp32", "fp32", "*fp32", "*fp32", "i32") if norm == 1 else
               ("fp32", "fp32", "fp32", "constexpr" if norm == 4 else "*fp32", "i32", "i32")
               if norm else "fp32", K="constexpr", REPAIR="constexpr", DG="constexpr")
    # (every parameter named, the defaulted DG too: Triton 3.9 types only what is listed)
    const = {(4,): None, (5,): None, (6, 0): None, (6, 1): None, (8, 1): None,
             (9,): None, (14,): None,
             (12,): Constants(BLOCK_N=block_n, BLOCK_R=128, BLOCK_D=128,
                              PRECISION=precision if dtype == "fp32" else "tf32",
                              HAS_DECAY=decay, HALF_RANGE=dtype != "fp32", GROUPS=groups,
                              SPLIT=split, NORM=norm, REVERSE=reverse),
             (13,): repair}
    if norm == 4:
        const[(11, 3)] = None
    if not split:
        const.update({(7, 0): None, (7, 1): None})
    if not decay:
        const[(8, 0)] = None
    return _scan_ptx(sig, const, stages, arch)


def _scan_ptx(sig: dict, const: dict, stages: int, arch: int) -> str:
    """``chunk_scan_kernel``'s PTX for a signature and its constants, as Chunk launches it (8
    warps)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from ..kernels import chunk_scan as scan_kernels
    src = ASTSource(fn=scan_kernels.chunk_scan_kernel, signature=sig, constexprs=const)
    compiled = triton.compile(src, target=GPUTarget("cuda", arch, 32),
                              options=dict(num_warps=8, num_stages=stages))
    return compiled.asm["ptx"]


def _compile_gate_grad_ptx(dtype, block_n, stages, split, arch, precision, reverse, dual,
                           rows=0) -> str:
    from ..kernels._tiles import Constants
    p = POINTER[dtype]
    strided = (p, "i64", "i64", "i64")
    sig = dict(B=strided, C=strided, V=strided, O=strided, E=strided,
               O2=strided if dual else "constexpr", STATES=("constexpr", "constexpr"),
               RING=("*fp32", "*i32", "*i32") if split else ("constexpr", "constexpr", "*i32"),
               DECAY=("constexpr", ("*fp32", "i64", "i64", "i64")), CU="constexpr",
               SIZE=("i32",) * 6, K="constexpr", REPAIR="constexpr",
               SCALE=("fp32", "*fp32", "i64", "i64", "i64", "*fp32", "*fp32", "i64", "i64")
               if rows == 2 else "fp32",
               DG=("*fp32", "i64", "i64", "i64", "i64", "*fp32", "i32"))
    const = {(6, 0): None, (6, 1): None, (8, 0): None, (9,): None, (13,): False,
             (12,): Constants(BLOCK_N=block_n, BLOCK_R=128, BLOCK_D=128,
                              PRECISION=precision if dtype == "fp32" else "tf32",
                              HALF_RANGE=dtype != "fp32", HAS_GATE=True, REVERSE=reverse,
                              DUAL=dual, GATE_GRAD=True, SPLIT=split, ROWS=rows)}
    if not dual:
        const[(5,)] = None
    if not split:
        const.update({(7, 0): None, (7, 1): None})
    return _scan_ptx(sig, const, stages, arch)


def compile_hopper(dtype: str, decay: bool, split: bool = True, arch: int = 90,
                   reverse: bool = False, dual: bool = False, r: int = 128,
                   d: int = 128, dc: int | None = None, gates: bool = False,
                   groups: tuple = (1, 1, 1, 1), gate_grad: bool = False,
                   rows: int = 0, late_pairs: bool | None = None, norm: int = 0,
                   half_pairs: bool | None = None, col_sums: bool | None = None):
    """``chunk_hopper_kernel`` compiled as :mod:`leetrepro.methods.chunk` launches it (head
    dimensions r, d; state in and out, the launch options of ``tuning.HOPPER`` and the tiles of
    ``chunk.hopper_tiles``), fp16, bf16 or fp32, with segments
    chained (``split``, batch 1) or one program per lane, forward or in reverse time (the
    backward), with or without the ``dual`` output (the backward's dC beside dV); ``groups``:
    B, C, V, E read by groups of heads (the kernel's ``GROUPS``); ``gate_grad``: a gated
    backward sweep writing the gates' gradient's pieces (``GATE_GRAD``, one segment a lane);
    ``rows``: a gated forward sweep taking V's row weights and the skip (``ROWS``); 2: the
    reverse sweep with the dual output and the pieces taking E's row weights and the row dots;
    ``late_pairs``: the dB sweep's own pairs after O's store (``LATE_PAIRS``; default the
    launcher's switch); ``norm``: normalised linear attention's forward (``NORM`` 1: bf16, γ = 1,
    no states), or the scores' offsets by rows (2) or columns (3), forward or in reverse, or a
    constant offset (4: ``NORM`` 2 without a row of them); ``half_pairs``: the dB sweep's own
    pairs by halves of the chunk's columns (``HALF_PAIRS``; default the launcher's switch);
    ``col_sums``: their columns' sums in a layout of a column's rows a thread (``COL_SUMS``,
    likewise).
    Triton's compiled kernel: ``metadata.shared`` is the shared memory a launch asks for."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    from .._dtypes import parse_dtype
    from ..methods.chunk import gluon_dtype, hopper_constants
    from ..methods.chunk.hopper_launch import _gates_layout, _tma_layout, hopper_kernels
    from ..tuning import HOPPER
    kern = hopper_kernels.chunk_hopper_kernel
    gdt = gluon_dtype(parse_dtype(dtype))
    bn = HOPPER["BLOCK_N"]

    def desc(cols):
        block = [1, 1, bn, cols]
        return f"tensordesc<{dtype}[{', '.join(map(str, block))}],{_tma_layout(bn, cols, gdt)!r}>"

    const = hopper_constants(r=r, d=d, dtype=parse_dtype(dtype), decay=decay, has_s0=not norm,
                             store_sn=not norm, split=split, reverse=reverse, dual=dual, dc=dc,
                             gates=gates, groups=groups, gate_grad=gate_grad, rows=rows,
                             late_pairs=late_pairs, norm=(0, 1, 2, 3, 2, 5)[norm],
                             half_pairs=half_pairs, col_sums=col_sums)
    dh = const.DC // 2
    sig = dict(b_desc=desc(r), c_desc=desc(r), v_desc=desc(dh), o_desc=desc(dh),
               e_desc=desc(d // 2), o2_desc=desc(r // 2), STATES=("*fp32", "*fp32"),
               RING=("*fp32", "*i32", "*i32"),
               DECAY=("*fp64" if decay else "constexpr", "*fp32" if gates else "constexpr"),
               SIZE=("i32",) * 4, scale="fp32",
               PIECES=(f"*{dtype}", "i32", "i32", "i32", "*fp32", "i32") if gate_grad
               else "constexpr",
               g_desc=(f"tensordesc<fp32[1, 1, 1, {bn}],{_gates_layout(bn)!r}>" if const.G_RING
                       else "constexpr"), K="constexpr",
               ROWS=("*fp32", "i32", "i32", "i32", "*fp32") +
               (("*fp32", "i32", "i32") if rows == 2 else ()) if rows else
               # (the normaliser's and the offsets' in the row weights' place)
               ("fp32", "fp32", "*fp32" if norm == 1 else "constexpr", "*fp32", "i32",
                "constexpr" if norm in (1, 4) else "*fp32") if norm else "constexpr")
    constexprs = {(13,): const}
    if not const.G_RING:
        constexprs[(12,)] = None
    if not rows and not norm:
        constexprs[(14,)] = None
    if norm:  # (the denominators with the normaliser, the offsets' row with the offsets)
        constexprs[(14, 5) if norm == 1 else (14, 2)] = None
        if norm == 4:
            constexprs[(14, 5)] = None
    if not gate_grad:
        constexprs[(11,)] = None
    if const.E_RING:  # (the pieces' row vectors through the ring: E's block DC/2 columns)
        sig.update(e_desc=desc(dh), o2_desc="constexpr")
        constexprs[(5,)] = None
    elif not dual:
        sig.update(e_desc="constexpr", o2_desc="constexpr")
        constexprs.update({(4,): None, (5,): None})
    if not decay:
        constexprs[(8, 0)] = None
    if not gates:
        constexprs[(8, 1)] = None
    src = GluonASTSource(fn=kern, signature=sig, constexprs=constexprs)
    return triton.compile(src, target=GPUTarget("cuda", arch, 32),
                          options=dict(num_warps=HOPPER["num_warps"], maxnreg=HOPPER["maxnreg"]))


#: the Triton release whose code generation the register and spill budgets were set on (the
#: Makefile's TRITON, torch's pin); another release's allocates otherwise (3.9.0 spills more in
#: the Hopper sweeps: notes/house.md)
TUNED_TRITON = "3.6."


def budgets_apply() -> bool:
    """Whether this Triton is the release the budgets were set on (:data:`TUNED_TRITON`)."""
    import triton
    return triton.__version__.startswith(TUNED_TRITON)


def spill_bytes(usage: str) -> int:
    """The spill stores per thread in a :func:`ptxas_usage` line."""
    import re
    found = re.search(r"(\d+) bytes spill stores", usage)
    return int(found.group(1)) if found else 0


def ptxas_usage(ptx: str, arch: int = 90) -> str:
    """``ptxas -v``'s resource lines for a PTX text: registers, stack frame, spill stores/loads."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "kernel.ptx")
        with open(path, "w") as f:
            f.write(ptx)
        res = subprocess.run([_ptxas(arch), f"-arch=sm_{arch}a", "-v", path, "-o", os.devnull],
                             capture_output=True, text=True, check=True)
    return _usage_lines(res.stderr)


def _usage_lines(log: str) -> str:
    """The resource lines of ``ptxas -v``'s log (registers, stack frame, spills), joined."""
    return "; ".join(line.split(":", 1)[-1].strip() for line in log.splitlines()
                     if "registers" in line or "spill" in line)


def compiled_usage(make, arch: int = 90) -> tuple:
    """``(compiled, usage)``: the kernel ``make()`` compiles and ptxas's resource line for it
    (:func:`ptxas_usage`'s form). Triton runs ``ptxas -v`` when it compiles: its log is asked for
    and read here, so a fresh compile is not assembled twice (a second ptxas run was a third of
    the register check's time); a kernel from Triton's cache has no log, and ptxas runs again on
    its PTX."""
    import contextlib
    import io
    from triton import knobs
    log, before = io.StringIO(), getattr(knobs.nvidia, "dump_ptxas_log", None)
    try:
        if before is not None:
            knobs.nvidia.dump_ptxas_log = True
        with contextlib.redirect_stdout(log):
            compiled = make()
    finally:
        if before is not None:
            knobs.nvidia.dump_ptxas_log = before
    return compiled, _usage_lines(log.getvalue()) or ptxas_usage(compiled.asm["ptx"], arch)


def _resources(make, arch: int) -> str:
    """``shared=<bytes>`` (what a launch asks of the SM's shared memory) and ptxas's usage line
    of the kernel ``make()`` compiles (:func:`compiled_usage`): a process pool's job's answer."""
    compiled, usage = compiled_usage(make, arch)
    return f"shared={compiled.metadata.shared} {usage}"


def _ptxas(arch: int) -> str:
    """The ptxas Triton ships with (it reads the PTX version that Triton writes; a system ptxas
    older than the Triton release refuses it), else the one on PATH."""
    try:
        from triton.backends.nvidia import compiler
        return compiler.get_ptxas(arch).path
    except Exception:  # a Triton build without its own ptxas
        found = shutil.which("ptxas")
        if found:
            return found
        raise


def hopper_unfit_for(dtype: str, r: int = 128, d: int = 128, dual: bool = False) -> str | None:
    """Why the Hopper kernel cannot take a call of ``dtype`` at head dimensions r, d (with the
    ``dual`` output): its launcher's own rule, asked of stand-in tensors; None where it can."""
    import torch

    from .._dtypes import parse_dtype
    from ..methods.chunk import hopper_operand_unfit
    b, v = (torch.empty(1, 1, 64, k, dtype=parse_dtype(dtype)) for k in (r, d))
    return hopper_operand_unfit(b, b, v, dual=v if dual else None)


def compile_straddle(kernel: str, dtype: str, r: int = 128, d: int = 64, arch: int = 90,
                     angles: int = 0):
    """The gates' gradient's kernel ``kernel`` (``segment_states`` or ``straddle_gradient``,
    ``kernels/gate_straddle.py``) compiled as :func:`leetrepro.methods.chunk.gate_gradient`
    launches it (its tiles, warps and one stage; grouped B and C, the states walked in reverse
    from a given one; with ``angles`` > 0 the turned pairs' sums too, B and C a head a lane):
    Triton's compiled kernel, whose ``metadata.shared`` and ``asm["ptx"]`` the probe reads."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from ..kernels import gate_straddle
    from ..kernels._tiles import Constants
    from ..methods import chunk
    from ..methods._gpu import next_pow2
    kern = getattr(gate_straddle, kernel)
    strided = (POINTER[dtype], "i64", "i64", "i64")
    block_r, block_d = chunk.straddle_tiles(r)
    K = Constants(BLOCK_N=chunk.tables.STRADDLE_BLOCK_N, BLOCK_R=block_r, BLOCK_D=block_d,
                  PRECISION="tf32x3" if dtype == "fp32" else "tf32", HAS_S0=True, REVERSE=True,
                  HALF_RANGE=dtype == "fp16", SEG_BLOCKS=chunk.tables.STRADDLE_SEGMENT_BLOCKS,
                  GROUPS=(1, 1, 1, 1) if angles else (16, 16, 1, 1),
                  ANGLES=(max(16, next_pow2(angles)), angles,
                          chunk.tables.STRADDLE_ANGLE_HALF_TILES and dtype == "bf16"))
    kinds = dict(Bt=strided, Ct=strided, Xt=strided, V=strided, Y=strided, DO=strided,
                 G=("*fp32", "i64", "i64", "i64"), WS="*fp32", WF="*fp32", WR="*fp32",
                 DG="*fp32", S="*fp32", INV_SCALE="fp32", SIZE=("i32",) * 5, DA="*fp32")
    sig, const = {}, {}
    for i, name in enumerate(kern.arg_names):
        if name in ("CU", "K") or (name == "DA" and not angles):
            sig[name] = "constexpr"
            const[(i,)] = K if name == "K" else None
        else:
            sig[name] = kinds[name]
    src = ASTSource(fn=kern, signature=sig, constexprs=const)
    return triton.compile(src, target=GPUTarget("cuda", arch, 32),
                          options=dict(num_warps=chunk.tables.STRADDLE_WARPS, num_stages=1))


def compile_gate_rows(tail: bool, arch: int = 90):
    """The gates' gradient from the Hopper kernel's rows (``kernels/gate_rows.py``) compiled as
    :func:`leetrepro.methods.chunk.gate_gradient_from_rows` launches it, with the final state's
    pairs (``tail``) or without: Triton's compiled kernel."""
    from ..kernels.gate_rows import gate_rows_kernel
    from ..methods.chunk.tables import GATE_ROWS_TILES
    from ..tuning import HOPPER
    sig = dict(QF="*fp32", QR="*fp32", TAIL="*fp64" if tail else "constexpr",
               DG=("*fp32", ("i32",) * 3), SIZE=("i32",) * 5, scale="fp32", BLOCK_N="constexpr",
               TILES="constexpr",
               HAS_TAIL="constexpr")
    const = dict(BLOCK_N=HOPPER["BLOCK_N"], TILES=GATE_ROWS_TILES, HAS_TAIL=tail)
    if not tail:
        const["TAIL"] = None
    return compile_portable(gate_rows_kernel, sig, const, 4, arch)


def compile_portable(kernel, signature: dict, constexprs: dict, num_warps: int, arch: int = 90):
    """A portable Triton kernel compiled for ``arch`` on the host: ``signature`` by parameter
    (Triton's type strings, tuples for tuple arguments, ``"constexpr"`` for constexprs),
    ``constexprs`` by name."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    names = list(signature)
    const = {(names.index(k),): v for k, v in constexprs.items()}
    src = ASTSource(fn=kernel, signature=signature, constexprs=const)
    return triton.compile(src, target=GPUTarget("cuda", arch, 32),
                          options=dict(num_warps=num_warps))


def passes_jobs() -> list:
    """The one-launch passes around the operator as their launchers launch them at the shapes
    measured (Codestral: 128 heads, d_state 128, d_inner 8192, 10240 convolution channels of
    width 4; bf16): ``(label, kernel,
    signature, constexprs, num_warps)``."""
    from ..kernels import causal_conv, gate_rows, gated_norm, ssd_rows
    import torch

    from ..methods.chunk.hopper_launch import LOG2E, sums_blocks
    from ..methods.chunk.tables import GATE_ROWS_TILES
    from ..tuning import HOPPER
    from ..models import _conv, _norm
    i3, p16, p32 = ("i32",) * 3, "*bf16", "*fp32"
    c = "constexpr"
    # (the launcher's rule for time-major gates at Codestral's 128 heads)
    heads_tiles = sums_blocks(torch.empty(1, 8192, 128, device="meta").transpose(1, 2))
    return [
        ("tile_sums", gate_rows.tile_sums_kernel,
         dict(G=p32, OUT=p32, SIZE=i3, STRIDES=i3, BLOCK_N=c, TILES=c, REVERSE=c, TWIN=c,
              FOLD=c, SHIFT_TWIN=c, UNIT=c, HB=c),
         dict(BLOCK_N=HOPPER["BLOCK_N"], TILES=GATE_ROWS_TILES, REVERSE=True, TWIN=None,
              FOLD=None, SHIFT_TWIN=False, UNIT=LOG2E, HB=1), 4),
        ("tile_sums_twin", gate_rows.tile_sums_kernel,
         dict(G=p32, OUT=p32, SIZE=i3, STRIDES=i3, BLOCK_N=c, TILES=c, REVERSE=c,
              TWIN=(p32, p32, i3), FOLD=c, SHIFT_TWIN=c, UNIT=c, HB=c),
         dict(BLOCK_N=HOPPER["BLOCK_N"], TILES=GATE_ROWS_TILES, REVERSE=False, FOLD=None,
              SHIFT_TWIN=False, UNIT=LOG2E, HB=1), 4),
        # (the gates folded, shifted and summed in one launch: ``hopper_launch.folded_gate_sums``,
        # a forward's alone and a backward's with its twin)
        ("tile_sums_fold_alone", gate_rows.tile_sums_kernel,
         dict(G=p32, OUT=p32, SIZE=i3, STRIDES=i3, BLOCK_N=c, TILES=c, REVERSE=c, TWIN=c,
              FOLD=("fp32", p32, p32), SHIFT_TWIN=c, UNIT=c, HB=c),
         dict(BLOCK_N=HOPPER["BLOCK_N"], TILES=GATE_ROWS_TILES, REVERSE=False, TWIN=None,
              SHIFT_TWIN=False, UNIT=LOG2E, HB=1), 4),
        ("tile_sums_fold", gate_rows.tile_sums_kernel,
         dict(G=p32, OUT=p32, SIZE=i3, STRIDES=i3, BLOCK_N=c, TILES=c, REVERSE=c,
              TWIN=(p32, p32, i3), FOLD=("fp32", p32, p32), SHIFT_TWIN=c, UNIT=c, HB=c),
         dict(BLOCK_N=HOPPER["BLOCK_N"], TILES=GATE_ROWS_TILES, REVERSE=False,
              SHIFT_TWIN=True, UNIT=LOG2E, HB=1), 4),
        # (time-major gates: a block of heads a program, its loads along them)
        ("tile_sums_fold_heads", gate_rows.tile_sums_kernel,
         dict(G=p32, OUT=p32, SIZE=i3, STRIDES=i3, BLOCK_N=c, TILES=c, REVERSE=c,
              TWIN=(p32, p32, i3), FOLD=("fp32", p32, p32), SHIFT_TWIN=c, UNIT=c, HB=c),
         dict(BLOCK_N=HOPPER["BLOCK_N"], TILES=heads_tiles[1], REVERSE=False, SHIFT_TWIN=True,
              UNIT=LOG2E, HB=heads_tiles[0]), 4),
        ("group_sums", ssd_rows.group_sums,
         dict(X=p16, OUT=p16, XS=i3, OS=i3, SIZE=("i32",) * 4, BLOCK_T=c, BLOCK_R=c,
              UNROLL=c), dict(BLOCK_T=32, BLOCK_R=128, UNROLL=1), 4),
        ("group_sums_many", ssd_rows.group_sums,
         dict(X=p16, OUT=p16, XS=i3, OS=i3, SIZE=("i32",) * 4, BLOCK_T=c, BLOCK_R=c,
              UNROLL=c), dict(BLOCK_T=16, BLOCK_R=64, UNROLL=8), 4),
        ("dt_gates", ssd_rows.dt_gates,
         dict(RAW=p32, BIAS=p32, A=p32, DT=p32, G=p32, STRIDES=i3, SIZE=i3, LIMIT=("fp32",) * 2,
              K=c),
         dict(K=ssd_rows.DtConstants(BLOCK_T=32, BLOCK_H=128, HAS_BIAS=True, SOFTPLUS=True,
                                     HAS_LIMIT=True)), 4),
        ("dt_gates_backward", ssd_rows.dt_gates_backward,
         dict(RAW=p32, BIAS=p32, A=p32, DDT=p32, DG=p32, DRAW=p32, PARTS=p32, STRIDES=i3,
              GRAD_STRIDES=("i32",) * 6, SIZE=i3, LIMIT=("fp32",) * 2, K=c),
         dict(K=ssd_rows.DtConstants(BLOCK_T=32, BLOCK_H=128, HAS_BIAS=True, SOFTPLUS=True,
                                     HAS_LIMIT=True, HAS_DDT=True, HAS_DG=True)), 4),
    ] + [
        (f"gated_norm_{way}{label}", kernel, sig, dict(BLOCK_G=width, ROWS=16),
         _norm._warps(width))
        # (Codestral's 8 groups of 1024 channels, and a whole row of 8192: one group)
        for label, width in (("", 1024), ("_row", 8192))
        for way, kernel, sig in (
            ("forward", gated_norm.gated_norm_forward,
             dict(Y=(p16, "i32"), Z=(p16, "i32"), W=p16, OUT=p16, RSTD=p32, SIZE=i3,
                  eps="fp32", BLOCK_G=c, ROWS=c)),
            ("backward", gated_norm.gated_norm_backward,
             dict(DOUT=(p16, "i32"), Y=(p16, "i32"), Z=(p16, "i32"), W=p16, RSTD=p32, DY=p16,
                  DZ=p16, DW=p32, SIZE=i3, BLOCK_G=c, ROWS=c)))
    ] + [
        ("causal_conv_forward", causal_conv.causal_conv_forward,
         dict(X=(p16, "i32", "i32"), W=p16, BIAS=p16, SEQ="*i32", OUT=p16, SIZE=("i32",) * 2,
              K=c, BLOCK_T=c, BLOCK_C=c, HAS_BIAS=c, HAS_SEQ=c),
         dict(K=4, BLOCK_T=_conv.FORWARD[0], BLOCK_C=_conv.FORWARD[1], HAS_BIAS=True,
              HAS_SEQ=False),
         _conv.FORWARD[2]),
        ("causal_conv_backward", causal_conv.causal_conv_backward,
         dict(X=(p16, "i32", "i32"), W=p16, BIAS=p16, SEQ="*i32", DOUT=(p16, "i32", "i32"),
              DX=p16, PARTS=p32, SIZE=i3, K=c, K_PAD=c, BLOCK_T=c, BLOCK_C=c, HAS_BIAS=c,
              HAS_SEQ=c),
         dict(K=4, K_PAD=4, BLOCK_T=_conv.BACKWARD[0], BLOCK_C=_conv.BACKWARD[1], HAS_BIAS=True,
              HAS_SEQ=False),
         _conv.BACKWARD[2]),
        # (a decode step at Zamba2's conv channels, bf16 rows, float32 state)
        ("causal_conv_update", causal_conv.causal_conv_update,
         dict(X=p16, STATE=p32, W=p16, BIAS=p16, OUT=p16, SIZE=i3, XS=i3, SS=i3, OS=i3,
              BLOCK_C=c, BLOCK_W=c, HAS_BIAS=c, SILU=c),
         dict(BLOCK_C=256, BLOCK_W=4, HAS_BIAS=True, SILU=True), 4),
    ] + normalizer_jobs() + [state_update_job(), mamba3_step_job(), mamba3_step_job(step=8)] + \
        mamba3_rows_jobs()


def mamba3_step_job(p: int = 128, dv: int = 64, angles: int = 32, step: int | None = None
                    ) -> tuple:
    """Mamba-3's decode step (``methods.mamba3_step``) at mamba_ssm's test heads (headdim_qk 128,
    headdim_v 64, rope fraction 0.5), bf16 rows, float32 states; ``step``: the state's rows a
    loop step (all of them by default)."""
    from ..kernels import mamba3_step
    from ..methods._gpu import next_pow2
    from ..methods.mamba3_step import warps
    c, f32, b16 = "constexpr", "*fp32", "*bf16"
    step = dv if step is None else step
    label = "mamba3_step" if step == dv else f"mamba3_step_rows{step}"
    return (label, mamba3_step.mamba3_step,
            dict(QK=b16, VZ=b16, SCAL=f32, BIAS=f32, ANGLES=f32, D=f32,
                 STATES=(f32, f32, b16, b16), SLOTS="*i64", OUT=b16, SIZE=("i32",) * 6, K=c),
            dict(K=mamba3_step.StepConstants(BLOCK_P=p, BLOCK_V=dv, BLOCK_A=next_pow2(angles),
                                             HAS_D=True, HAS_Z=True, STEP_V=step)),
            warps(p, step))


def mamba3_rows_jobs(p: int = 128, angles: int = 32, dv: int = 64) -> list:
    """Mamba-3's row passes (``methods.mamba3_rows``) both ways at mamba_ssm's test heads
    (headdim_qk 128, rope fraction 0.5, headdim 64), bf16 Q, K, V and Z, float32 angles,
    weights, turned rows and the operator's output."""
    from ..kernels import mamba3_rows
    from ..methods._gpu import next_pow2
    from ..methods.mamba3_rows import (BLOCK_T_ANGLES, BLOCK_T_BACK, BLOCK_T_OUT, WARPS,
                                       WARPS_ANGLES, WARPS_OUT, _blocks)
    c, f32, rows = "constexpr", "*fp32", ("*bf16", "i32", "i32", "i32")
    f32_rows, th = (f32, "i32", "i32", "i32"), (f32, "i32", "i32", "i32", "i32")
    blocks = _blocks(angles, p)
    back_out = ("*bf16", "*bf16", f32, f32, f32, f32)  # (dXq, dXk, DQB, DKB, dθ, dw)
    gated = dict(HAS_Z=True, BLOCK_T=BLOCK_T_OUT, BLOCK_D=next_pow2(dv))
    angles_blocks = dict(BLOCK_T=BLOCK_T_ANGLES, BLOCK_A=next_pow2(angles))
    angles_sig = dict(ANG=th, DT=f32_rows, TH0=f32, TH=f32, SEQ="*i64", SIZE=("i32",) * 3,
                      HAS_TH0=c, VARLEN=c, BLOCK_T=c, BLOCK_A=c)
    angles_back_sig = dict(DTH=th, ANG=th, DT=f32_rows, DANG=f32, DDT=f32, DTH0=f32, SEQ="*i64",
                           SIZE=("i32",) * 3, VARLEN=c, BLOCK_T=c, BLOCK_A=c)
    return [
        ("mamba3_rotate", mamba3_rows.rotate_rows,
         dict(Q=rows, K=rows, QB=f32, KB=f32, TH=th, W=f32_rows, OUT_Q=f32, OUT_KEY=f32, OWN=f32,
              SIZE=("i32",) * 2, CONST=c),
         dict(CONST=mamba3_rows.RowConstants(REP=4, ROUND="bf16", TH_T=True, **blocks)),
         WARPS[0]),
        ("mamba3_rotate_backward", mamba3_rows.rotate_rows_backward,
         dict(DQ=f32_rows, DKEY=f32_rows, DOWN=f32, RQ=f32, RKEY=f32, K=rows, KB=f32, TH=th,
              W=f32_rows, OUT=back_out, SIZE=("i32",) * 2, CONST=c),
         dict(CONST=mamba3_rows.RowConstants(REP=4, ROUND="bf16", TH_T=True, DTHETA=True,
                                             **dict(blocks, BLOCK_T=BLOCK_T_BACK))), WARPS[1]),
        # (the straddling pairs' path: bf16 rows and gradients, no dθ, the training shape's
        # 64 heads a q/k head)
        ("mamba3_rotate_backward_pairs", mamba3_rows.rotate_rows_backward,
         dict(DQ=rows, DKEY=rows, DOWN=f32, RQ="*bf16", RKEY="*bf16", K=rows, KB=f32, TH=th,
              W=f32_rows, OUT=back_out, SIZE=("i32",) * 2, CONST=c),
         dict(CONST=mamba3_rows.RowConstants(REP=64, ROUND="bf16", TH_T=True, DTHETA=False,
                                             **dict(blocks, BLOCK_T=BLOCK_T_BACK))), WARPS[1]),
    ] + [  # (the angles unpacked, then packed: a segmented scan)
        (f"mamba3_angles{'_packed' if varlen else ''}", mamba3_rows.angle_sums, angles_sig,
         dict(angles_blocks, VARLEN=varlen, HAS_TH0=True), WARPS_ANGLES)
        for varlen in (False, True)
    ] + [
        (f"mamba3_angles{'_packed' if varlen else ''}_backward", mamba3_rows.angle_sums_backward,
         angles_back_sig, dict(angles_blocks, VARLEN=varlen), WARPS_ANGLES)
        for varlen in (False, True)
    ] + [
        ("mamba3_gated_output", mamba3_rows.gated_output,
         dict(O=f32_rows, V=rows, Z=rows, W=f32_rows, Y="*bf16", SIZE=("i32",) * 3, HAS_Z=c,
              BLOCK_T=c, BLOCK_D=c), gated, WARPS_OUT),
        ("mamba3_gated_output_backward", mamba3_rows.gated_output_backward,
         dict(DY=rows, O=f32_rows, V=rows, Z=rows, W=f32_rows, DO=f32, DV="*bf16", DZ="*bf16",
              DW=f32, SIZE=("i32",) * 3, HAS_Z=c, BLOCK_T=c, BLOCK_D=c), gated, WARPS_OUT)]


def state_update_job(headdim: int = 64, dstate: int = 128) -> tuple:
    """mamba_ssm's state update (``methods.state_update``) as launched at Codestral's heads
    (headdim 64, dstate 128), bf16 with a float32 state."""
    from ..kernels import state_update
    from ..methods._gpu import next_pow2
    t4, c = ("*bf16", "i32", "i32", "i32"), "constexpr"
    p, n = next_pow2(headdim), next_pow2(dstate)
    return ("selective_state_update", state_update.selective_state_update,
            dict(STATE=("*fp32", "i32", "i32", "i32", "i32"), X=t4, DT=t4, A=("*fp32", "i32", "i32", "i32"),
                 B=t4, C=t4, D=("*fp32", "i32", "i32"), Z=t4, DT_BIAS=("*fp32", "i32", "i32"),
                 OUT="*bf16", SIZE=("i32",) * 4, K=c),
            dict(K=state_update.StateConstants(BLOCK_P=p, BLOCK_N=n, HAS_D=True, HAS_Z=True,
                                               HAS_BIAS=True, SOFTPLUS=True)),
            max(1, min(8, p * n // 1024)))


def normalizer_jobs(r: int = 128, d: int = 128) -> list:
    """Normalised linear attention's passes (``methods.normalizer``) as launched at r × d, bf16:
    ``(label, kernel, signature, constexprs, num_warps)``."""
    import torch

    from ..kernels import normalizer
    from ..methods import normalizer as launcher
    t4, p32, c = ("*bf16", "i32", "i32", "i32"), "*fp32", "constexpr"
    size, warps = ("i32",) * 4, lambda kind: launcher._warps(kind, r, d)  # noqa: E731
    blocks = launcher._options(r, d)
    back = launcher._options(r, d, launcher.BACKWARD_BLOCK_N)
    block_c, block_w, scan_warps = launcher.SCAN_BLOCK
    sig = lambda **names: {k: (t4 if v == "t" else p32 if v == "f" else  # noqa: E731
                               "fp32" if v == "s" else size if v == "z" else c)
                           for k, v in names.items()}
    return [
        ("normalizer_totals", normalizer.normalizer_totals,
         sig(K="t", V="t", SUMS="f", SIZE="z", BLOCK_N=c, BLOCK_R=c, BLOCK_D=c), blocks,
         warps("totals")),
        ("normalizer_chunk_scan", normalizer.normalizer_chunk_scan,
         {"SUMS": p32, "OUT": p32, "CHUNKS": "i32", "WIDTH": "i32", "REVERSE_FROM": "i32",
          "BLOCK_C": c, "BLOCK_W": c}, dict(BLOCK_C=block_c, BLOCK_W=block_w), scan_warps),
        ("normalizer_forward", normalizer.normalizer_forward,
         sig(NUM="t", Q="t", K="t", V="t", O="t", DEN="f", SUMS="f", SIZE="z", c="s",
             eps="s", BLOCK_N=c, BLOCK_R=c, BLOCK_D=c, HAS_C=c, RUN=c),
         dict(blocks, HAS_C=True, RUN=launcher._run(torch.bfloat16)),
         warps("forward")),
        ("normalizer_prologue", normalizer.normalizer_prologue,
         sig(DO="t", O="t", DEN="f", Q="t", K="t", DNUM="t", DDEN="f", SUMS="f", SIZE="z",
             BLOCK_N=c, BLOCK_R=c, BLOCK_D=c, WITH_SUMS=c), dict(back, WITH_SUMS=True),
         warps("prologue")),
        ("normalizer_epilogue", normalizer.normalizer_epilogue,
         dict(sig(GRADS=c, Q="t", K="t", DO="t", DEN="f", DDEN="f", SUMS="f", NORMS=c,
                  SIZE="z", c="s", BLOCK_N=c, BLOCK_R=c, BLOCK_D=c, WANT=c, RUN=c),
              GRADS=(t4,) * 3, NORMS=(p32, p32, "fp32")),
         dict(back, WANT=15, RUN=launcher._run(torch.bfloat16)),
         warps("epilogue")),
    ] + [(kernel.__name__, kernel, names | {"SIZE": ("i32",) * 3},
          dict(BLOCK_N=launcher.BLOCK_N, BLOCK_R=blocks["BLOCK_R"]), warps("rows"))
         for kernel, names in (
             (normalizer.row_normalize_forward,
              sig(X="t", Y="t", S="f", SIZE="z", eps="s", BLOCK_N=c, BLOCK_R=c)),
             (normalizer.row_normalize_backward,
              sig(DY="t", Y="t", S="f", DX="t", SIZE="z", eps="s", BLOCK_N=c, BLOCK_R=c)))]


def _passes_usage(job: tuple) -> str:
    """``shared=<bytes>`` and ptxas's usage line of one pass's kernel (a pool's job: its index
    in :func:`passes_jobs`, the arch)."""
    index, arch = job
    label, kernel, sig, const, warps = passes_jobs()[index]
    return _resources(lambda: compile_portable(kernel, sig, const, warps, arch), arch)


#: the gates' gradient's kernels as the probe compiles them: (kernel, dtype, r, d, angles), the
#: last two with Mamba-3's turned pairs (32 angles of d_state 128, fp16's range scaling)
STRADDLE_JOBS = tuple((k, dtype, r, d, 0) for k in ("segment_states", "straddle_gradient")
                      for dtype, r, d in (("bf16", 128, 64), ("fp16", 128, 128),
                                          ("fp32", 128, 64), ("bf16", 64, 32))) + \
    (("straddle_gradient", "bf16", 128, 64, 32), ("straddle_gradient", "fp16", 128, 64, 32))


def _straddle_usage(job: tuple) -> str:
    """``shared=<bytes>`` and ptxas's usage line of one straddle variant (a pool's job)."""
    kernel, dtype, r, d, angles, arch = job
    return _resources(lambda: compile_straddle(kernel, dtype, r, d, arch, angles), arch)


#: the other head shapes the Hopper kernel takes, compiled for the register check in its sweeps
#: with the decay and segments (the largest variant of each): forward, and reverse with the dual
#: output where it takes one (else plain reverse), bf16 and fp32
HOPPER_SHAPES = ((64, 64), (128, 64), (64, 128), (128, 256), (256, 128), (256, 256))


def _hopper_usage(kw: dict) -> str:
    """``shared=<bytes>`` (what a launch asks of the SM's shared memory) and ptxas's usage line
    of one Hopper variant (a process pool's job)."""
    return _resources(lambda: compile_hopper(**kw), kw["arch"])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--arch", type=int, default=90, help="compute capability ×10 (90: H100/H200)")
    p.add_argument("--configs", nargs="*", default=DEFAULT,
                   help="dtype:mask:BLOCK_N:stages[:one] (mask 0-1 or decay; :one = batch 16's one pass)")
    p.add_argument("--hopper", action="store_true",
                   help="the Hopper kernel, fp16/bf16 × both masks × one pass/segments × forward/"
                        "reverse/reverse with the dual output, and fp32 (tf32) forward/reverse; "
                        "with per-token gates, B and C read by groups of heads, and normalised "
                        "linear attention's forward (--configs ignored)")
    p.add_argument("--straddle", action="store_true",
                   help="the gates' gradient's two kernels (kernels/gate_straddle.py): shared "
                        "memory per program, registers and spills (--configs ignored)")
    p.add_argument("--passes", action="store_true",
                   help="the one-launch passes around the operator (gate tile sums, group sums, "
                        "step sizes, the gated norm): shared memory, registers and spills "
                        "(--configs ignored)")
    args = p.parse_args(argv)
    if args.passes:
        from concurrent.futures import ProcessPoolExecutor
        labels = [job[0] for job in passes_jobs()]
        with ProcessPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
            usages = pool.map(_passes_usage, [(i, args.arch) for i in range(len(labels))])
            for label, usage in zip(labels, usages):
                print(f"pass {label} {usage}", flush=True)
        return 0
    if args.straddle:
        from concurrent.futures import ProcessPoolExecutor
        with ProcessPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
            usages = pool.map(_straddle_usage, [job + (args.arch,) for job in STRADDLE_JOBS])
            for (kernel, dtype, r, d, angles), usage in zip(STRADDLE_JOBS, usages):
                turned = f" angles={angles}" if angles else ""
                print(f"straddle {kernel} {dtype} {r}x{d}{turned} {usage}", flush=True)
        for tail in (False, True):  # (and dg from the Hopper kernel's rows)
            usage = ptxas_usage(compile_gate_rows(tail, args.arch).asm["ptx"], args.arch)
            print(f"rows gate_rows_kernel tail={tail} {usage}", flush=True)
        return 0
    if args.hopper:
        # forward and reverse sweeps, and the reverse sweep with the dual output (the backward's),
        # at r = d = 128 in every variant; the other head shapes in their largest
        jobs = []
        for (reverse, dual), split, dtype, mask in itertools.product(
                ((False, False), (True, False), (True, True)), (False, True),
                ("fp16", "bf16", "fp32"), ("0-1", "decay")):
            if dual and hopper_unfit_for(dtype, dual=True):  # (half precision only)
                continue
            jobs.append((f"{dtype}:{mask}:{'split' if split else 'one'}"
                         f"{':reverse' if reverse else ''}{':dual' if dual else ''}",
                         dict(dtype=dtype, decay=mask == "decay", split=split, reverse=reverse,
                              dual=dual)))
        for (r, d), dtype, reverse in itertools.product(HOPPER_SHAPES, ("bf16", "fp32"),
                                                        (False, True)):
            if hopper_unfit_for(dtype, r, d):
                continue
            dual = reverse and not hopper_unfit_for(dtype, r, d, dual=True)
            jobs.append((f"{r}x{d} {dtype}:decay:split{':reverse' if reverse else ''}"
                         f"{':dual' if dual else ''}",
                         dict(dtype=dtype, decay=True, split=True, reverse=reverse, dual=dual,
                              r=r, d=d)))
        # per-token gates (fp16/bf16): the forward, one pass and segments; the backward's dual
        # sweep (fp16 too: its scales)
        for dtype, (reverse, dual), split in (
                ("bf16", (False, False), False), ("bf16", (False, False), True),
                ("bf16", (True, True), True), ("fp16", (True, True), True)):
            jobs.append((f"gates {dtype}:gates:{'split' if split else 'one'}"
                         f"{':reverse:dual' if dual else ''}",
                         dict(dtype=dtype, decay=False, split=split, reverse=reverse, dual=dual,
                              gates=True)))
        # B and C read by groups of heads (Mamba-2's 16 heads a group at d_state 128, headdim
        # 64): the forward with gates, and the backward's dB sweep, whose V operand is the
        # grouped C
        for (r, d), groups in (((128, 64), (16, 16, 1, 1)), ((64, 128), (1, 1, 16, 1))):
            jobs.append((f"groups bf16 {r}x{d}:gates:split",
                         dict(dtype="bf16", decay=False, split=True, gates=True, r=r, d=d,
                              groups=groups)))
        # the gated backward's sweeps writing the gates' gradient's pieces (one pass):
        # the remainders' copies at the widest state a consumer holds and at Mamba-2's shapes
        # (as launched: chunk.tables.PIECES_DC's columns a program; the dB sweep forward in time with
        # r and d swapped, its r the operator's d)
        from ..methods.chunk.tables import PIECES_DC
        for dtype, (r, d), reverse in (("bf16", (128, 128), True), ("fp16", (128, 128), True),
                                       ("bf16", (128, 64), True), ("bf16", (64, 64), True),
                                       ("bf16", (64, 128), False), ("fp16", (64, 128), False),
                                       ("bf16", (64, 64), False), ("bf16", (128, 128), False),
                                       # (Falcon-H1's d_state 256: chunk.tables.HOPPER_PIECES_WIDE)
                                       ("bf16", (256, 64), True), ("bf16", (64, 256), False)):
            jobs.append((f"pieces {dtype} {r}x{d}:gates:one{':reverse' if reverse else ''}",
                         dict(dtype=dtype, decay=False, split=False, reverse=reverse, gates=True,
                              r=r, d=d, dc=min(d, PIECES_DC[(r, reverse)]), gate_grad=True)))
        # (in segments, chunk.tables.HOPPER_PIECES_SEGMENTS: the first pass adds the remainder's
        # product; the shapes of a 125M and a 1.3B model's layer)
        for (r, d), reverse, dual in (((64, 64), True, True), ((128, 128), False, False),
                                      ((128, 128), True, False)):
            jobs.append((f"pieces bf16 {r}x{d}:gates:split{':reverse' if reverse else ''}"
                         f"{':dual' if dual else ''}",
                         dict(dtype="bf16", decay=False, split=True, reverse=reverse, dual=dual,
                              gates=True, r=r, d=d, gate_grad=True,
                              dc=None if dual else min(d, PIECES_DC[(r, reverse)]))))
        # (the dB sweep's own pairs beside O's MMAs at the widest, where chunk.tables.HOPPER_LATE_PAIRS
        # has them after O's store)
        jobs.append(("pieces bf16 128x128:gates:one:early",
                     dict(dtype="bf16", decay=False, split=False, gates=True, r=128, d=128,
                          dc=128, gate_grad=True, late_pairs=False)))
        # (each consumer the whole own pairs' tile over its half of E's columns, the A/B's other
        # side of chunk.tables.HOPPER_HALF_PAIRS)
        jobs.append(("pieces bf16 64x128:gates:one:wholepairs",
                     dict(dtype="bf16", decay=False, split=False, gates=True, r=64, d=128,
                          dc=min(128, PIECES_DC[(64, False)]), gate_grad=True, half_pairs=False)))
        # (the half pairs' columns summed a column's rows a thread, chunk.tables.HOPPER_COLUMN_SUMS:
        # at 128 × 64, the most shared memory of the shapes that take them; at Mamba-2's shape
        # its A/B's other side, the sums in the accumulator's layout)
        for (r, d), on in (((128, 64), True), ((64, 128), False)):
            jobs.append((f"pieces bf16 {r}x{d}:gates:one:{'' if on else 'no'}colsums",
                         dict(dtype="bf16", decay=False, split=False, gates=True, r=r, d=d,
                              dc=min(d, PIECES_DC[(r, False)]), gate_grad=True, col_sums=on)))
        for dtype in ("bf16", "fp16"):  # (the dual output beside them: chunk.tables.HOPPER_DUAL_PIECES)
            jobs.append((f"pieces {dtype} 64x64:gates:one:reverse:dual",
                         dict(dtype=dtype, decay=False, split=False, reverse=True, dual=True,
                              gates=True, r=64, d=64, gate_grad=True)))
        # V's row weights and the skip in the gated forward (Mamba-2's SSD, B and C by groups),
        # where chunk.hopper_unfit lets them in: r ≤ 128, d = 64
        for (r, groups), split in itertools.product(((128, (16, 16, 1, 1)), (64, (80, 80, 1, 1))),
                                                    (False, True)):
            jobs.append((f"rows bf16 {r}x64:gates:{'split' if split else 'one'}",
                         dict(dtype="bf16", decay=False, split=split, gates=True, r=r, d=64,
                              groups=groups, rows=True)))
        # E's row weights and the row dots in the reverse sweep with the dual output and the
        # pieces (Mamba-2's backward, where chunk.tables.HOPPER_ROW_DOTS lets them in: r = d = 64)
        for dtype in ("bf16", "fp16"):
            jobs.append((f"rowdots {dtype} 64x64:gates:one:reverse:dual",
                         dict(dtype=dtype, decay=False, split=False, reverse=True, dual=True,
                              gates=True, r=64, d=64, groups=(80, 80, 1, 1), gate_grad=True,
                              rows=2)))
        # normalised linear attention's forward (``chunk.hopper_norm_unfit``: bf16, d = 128), one
        # pass and segments
        for r, split in itertools.product((128, 64), (False, True)):
            jobs.append((f"norm bf16 {r}x128:0-1:{'split' if split else 'one'}",
                         dict(dtype="bf16", decay=False, split=split, r=r, d=128, norm=1)))
        # and its gradients' sweeps: the rows' offsets forward (dq) and in reverse (dv), the
        # columns' in reverse (dk), one pass and segments
        for mode, reverse, split in itertools.product((2, 3, 4, 5), (False, True), (False, True)):
            if mode != 2 and not reverse:  # (dk and dv: in reverse; 5: dk as dv's dual output)
                continue
            jobs.append((f"norm bf16 128x128:offsets{mode}:{'split' if split else 'one'}"
                         f"{':reverse' if reverse else ''}{':dual' if mode == 5 else ''}",
                         dict(dtype="bf16", decay=False, split=split, reverse=reverse, r=128,
                              d=128, norm=mode, dual=mode == 5)))
        # fewer value columns a program (``config``'s DC, for sweeps): the largest variants
        for dtype, dc in (("bf16", 32), ("fp32", 64)):
            jobs.append((f"dc{dc} {dtype}:decay:split:reverse",
                         dict(dtype=dtype, decay=True, split=True, reverse=True, dc=dc)))
        # compiling is one core's work per variant: as many at once as there are cores
        from concurrent.futures import ProcessPoolExecutor
        with ProcessPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
            usages = pool.map(_hopper_usage, [dict(kw, arch=args.arch) for _, kw in jobs])
            for (label, _), usage in zip(jobs, usages):
                print(f"hopper {label} {usage}", flush=True)
        return 0
    for cfg in args.configs:
        dtype, mask, block_n, stages, *rest = cfg.split(":")
        ptx = compile_ptx(dtype, mask == "decay", int(block_n), int(stages), split=rest != ["one"],
                          arch=args.arch)
        print(f"{cfg:22s} {ptxas_usage(ptx, args.arch)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
