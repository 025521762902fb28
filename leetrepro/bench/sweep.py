"""The launch tables of this GPU, measured: Chunk's rows per block (BLOCK_N) × pipeline stages and
LA's warps × stages, per operand kind (fp16/bf16 "half", fp32 with tf32 products; for Chunk also
"exact", fp32 with ``fp32_precision="tf32x3"``) and mask, chosen
by timing every candidate at the two shapes that bound the designs (batch 1, N = 100000: N cut
into segments; batch 16, N = 25600: one pass per lane), heads 32, r = d = 128. The best by
geometric mean of the two medians is written to ``data/<gpu>/chunk_config.csv`` and
``la_config.csv`` (every timing to ``chunk_sweep.csv``, ``la_sweep.csv``), which the launchers
read on that GPU (:func:`leetrepro.tuning.launch_table`; ``make tune``). Candidates that
do not fit the GPU's shared memory are skipped.

On an sm_90 GPU, ``kernel`` then times Chunk's two forward kernels against each other (the
portable Triton kernel and the warp-specialised Hopper one, :func:`kernel_rows`), interleaved, at
the shapes of each regime: one pass per lane over many waves of lanes (batch 16, N = 25600)
and over a training micro-batch's few (batch 4, N = 4096: its own regime,
``chunk.few_lanes``; again with B and C in one group, as Mamba-2 reads them), and N cut into
segments (batch 1, N = 100000 and 8192), fp16, bf16 and fp32 (tf32), both masks, the forward
and the backward's dual sweep, at each head shape models use (:func:`head_shapes`: the state
split over programs at r or d = 256 and two plain sweeps for a dual call at r ≠ d change the
balance). ``chunk_kernel.csv`` names, per operand kind, dtype, mask, regime (one pass over many
lanes or few, a head each or in groups; split, long or short N; each forward or dual) and head
shape, the Hopper kernel where it was faster at every shape of the regime, else the portable
one; ``method="Chunk"`` follows it (``kernel="auto"``). Rows are written after each head shape.
``--heads 64x64 …`` measures some head shapes and keeps the others' rows;
``python -m leetrepro.bench.sweep --table-from data/<gpu>`` rewrites the table from the timings
already there (``chunk_kernel_sweep.csv``), no GPU needed.

    python -m leetrepro.bench.sweep --out data/h200 [--methods Chunk LA kernel] [--kinds exact]
        [--heads 64x64 128x256]
"""
from __future__ import annotations

import math
import os
import sys

import torch

from ..decay.per_head import alibi_gammas
from ..api import causal_linear_decoder
from .harness import gpu_main, median, random_inputs, time_calls

#: operand kind -> (dtype, fp32_precision): the rows of the launch tables
KINDS = {"half": (torch.float16, None), "tf32": (torch.float32, "tf32"),
         "exact": (torch.float32, "tf32x3")}
SHAPES = ((1, 100000), (16, 25600))
#: per method: the two swept parameters (the table's columns), their candidates per operand kind
#: (the kinds the method's table has), and the launch settings they set (the ``config`` option).
#: Chunk's exact products split every operand in three tf32 parts: 16-row chunks spill a third of
#: what 32-row ones do (``probes.regs``), and larger ones do not fit
SWEEPS = {
    "Chunk": (("block_n", "stages"),
              dict.fromkeys(("half", "tf32"), [(n, s) for n in (32, 64, 128) for s in (1, 2, 3, 4)])
              | {"exact": [(n, s) for n in (16, 32) for s in (1, 2, 3)]},
              lambda n, s: {"BLOCK_N": n, "num_stages": s}),
    "LA": (("warps", "stages"),
           dict.fromkeys(("half", "tf32"), [(w, s) for w in (4, 8) for s in (1, 2, 3)]),
           lambda w, s: {"num_warps": w, "num_stages": s}),
}


def sweep(method: str, device, meta: dict, reps: int, kinds=None) -> list[dict]:
    """Every candidate of ``method`` at every kind (of ``kinds``, default all) × shape × mask: one
    row each (``ms`` or NaN)."""
    (p1, p2), per_kind, options = SWEEPS[method]
    rows = []
    for kind, candidates in per_kind.items():
        if kinds is not None and kind not in kinds:
            continue
        dtype, precision = KINDS[kind]
        extra = {} if precision is None else {"fp32_precision": precision}
        for batch, n in SHAPES:
            B, C, V = random_inputs(batch, 32, n, 128, 128, dtype=dtype, device=device)
            for decay in (False, True):
                g = alibi_gammas(32).to(device) if decay else None
                for a, b in candidates:
                    row = dict(meta, kind=kind, decay=decay, batch=batch, N=n, **{p1: a, p2: b})
                    try:
                        call = lambda: causal_linear_decoder(  # noqa: E731
                            B, C, V, g, method=method, config=options(a, b), **extra)
                        call()
                        row["ms"] = median(time_calls(call, [()], reps, device)) * 1e3
                    except Exception as exc:  # too much shared memory for this GPU, say
                        row["ms"] = math.nan
                        row["error"] = f"{type(exc).__name__}: {str(exc)[:80]}"
                        torch.cuda.empty_cache()
                    rows.append(row)
                    print(f"{method} {kind} b{batch} N={n} decay={decay!s:5s} {p1}={a:3d} {p2}={b} "
                          f"{row['ms']:8.3f} ms", flush=True)
            B = C = V = None  # the memory freed before the next shape
            torch.cuda.empty_cache()
    return rows


#: the shapes that decide Chunk's kernel, per regime (split: N cut into segments; one pass per
#: lane over many waves of lanes and over a training micro-batch's few, ``chunk.few_lanes``)
KERNEL_SHAPES = {False: ((16, 25600), (4, 4096)), True: ((1, 100000), (1, 8192))}


def head_shapes(names=None) -> tuple:
    """The head shapes ``(r, d, heads)`` the kernel table is measured at (those of
    :data:`leetrepro.bench.layouts.HEAD_SHAPES`, which models use), or those of them named
    ``"RxD"`` in ``names``."""
    from .layouts import HEAD_SHAPES
    if not names:
        return HEAD_SHAPES
    known = {f"{r}x{d}": (r, d, h) for r, d, h in HEAD_SHAPES}
    unknown = [x for x in names if x not in known]
    if unknown:
        raise ValueError(f"--heads {' '.join(unknown)}: the table's head shapes are "
                         f"{' '.join(known)}")
    return tuple(known[x] for x in names)


#: the groups of B and C at the micro-batch shape's second measure (Mamba-2's one group: B and C
#: read once for all heads, so the Hopper kernel's TMA stream halves where the portable one's
#: latency-bound loop does not change, H200 NOTES.md)
KERNEL_GROUPS = 1


def kernel_rows(device, meta: dict, reps: int, shapes=None, kinds=None) -> list[dict]:
    """Chunk's portable and Hopper kernels at every regime's shapes, each head shape ``(r, d,
    heads)`` of ``shapes`` (default :func:`head_shapes`), fp16/bf16 and fp32 (tf32; ``kinds``:
    those operand kinds only), both masks: one row per cell with both medians (calls interleaved
    in one process). Each cell twice: the forward, and the backward's dual sweep (dV and dC in
    reverse time: what ``kernel="hopper"`` runs for it, its own dual sweep at r = d ≤ 128 in
    fp16/bf16, elsewhere two of its plain sweeps, against the portable kernel's one dual sweep;
    ``dual`` column; only where the backward runs a dual sweep, r and d ≤ 128). The micro-batch
    shape is measured again with B and C in :data:`KERNEL_GROUPS` groups (``groups`` column; 0:
    a head each). A cell the Hopper kernel cannot take (fp32 at r = 256) is left out: the table
    has no row for it, and the portable kernel runs it."""
    from ..methods.chunk import few_lanes, operand_kind
    rows = []
    dtypes = [t for t in (torch.float16, torch.bfloat16, torch.float32)
              if kinds is None or operand_kind(t, "tf32") in kinds]
    for r, d, h in shapes or head_shapes():
        for split, sizes in KERNEL_SHAPES.items():
            for batch, n in sizes:
                few = not split and few_lanes(batch * h, device)
                for groups in ((0, KERNEL_GROUPS) if few else (0,)):
                    for dtype in dtypes:
                        rows += _kernel_cell(device, meta, reps, r, d, h, split, batch, n, few,
                                             groups, dtype)
    return rows


def _kernel_cell(device, meta, reps, r, d, h, split, batch, n, few, groups, dtype) -> list[dict]:
    """:func:`kernel_rows`' rows of one shape and dtype: each mask, forward and dual sweep."""
    from ..methods.chunk import chunk_scan, operand_kind
    from ..ops.forward import _dual_fits
    from .harness import interleaved_medians
    B, C, V = random_inputs(batch, h, n, r, d, dtype=dtype, device=device)
    if groups:  # (each group's rows those of its first head: the same values a head reads)
        B, C = (x[:, ::h // groups].contiguous() for x in (B, C))
    dO = torch.randn_like(V)
    # (one pass per lane asked for outright: at a micro-batch's few lanes the launcher might
    # cut N into segments, another regime's rows)
    one = {} if split else dict(segment=n)
    rows = []
    for decay in (False, True):
        g = alibi_gammas(h).to(device) if decay else None
        calls = {
            False: {k: (lambda k=k: causal_linear_decoder(B, C, V, g, method="Chunk", kernel=k,
                                                          **one))
                    for k in ("portable", "hopper")},
            True: {k: (lambda k=k: chunk_scan(C, B, dO, g, reverse=True, dual=V, kernel=k, **one))
                   for k in ("portable", "hopper")}}
        if not _dual_fits(B, V):  # the backward runs its sweeps apart there
            del calls[True]
        for dual, fns in calls.items():
            try:
                fns["hopper"]()
            except ValueError:  # the Hopper kernel cannot take this cell
                continue
            med = interleaved_medians(fns, [()], reps, device, warmup=2)
            rows.append(dict(meta, kind=operand_kind(dtype, "tf32"), dtype=str(dtype).split(".")[-1],
                             r=r, d=d, heads=h, groups=groups, decay=decay, split=split,
                             dual=dual, few=few, batch=batch, N=n,
                             portable_ms=med["portable"] * 1e3, hopper_ms=med["hopper"] * 1e3))
            print(f"kernel {r}x{d} h{h}{f' g{groups}' if groups else ''} {dtype} b{batch} N={n} "
                  f"decay={decay!s:5s} {'dual' if dual else 'fwd '} portable "
                  f"{med['portable'] * 1e3:8.3f} ms  hopper {med['hopper'] * 1e3:8.3f} ms",
                  flush=True)
    B = C = V = dO = None  # the memory freed before the next shape
    torch.cuda.empty_cache()
    return rows


def kernel_table(df, meta: dict | None = None):
    """Per (kind, dtype, decay, regime, head shape r × d): ``hopper`` where it beat the portable
    kernel at every shape of the regime, else ``portable``; ``speedup``: the geometric mean of
    portable ÷ hopper. fp16 and bf16 are decided apart: the Hopper kernel keeps an fp16 state in
    range with a scale a chunk that bf16 does not need (0.8× the portable kernel at 64 × 64 in
    fp16 where bf16 is 1.1-1.3×, H200). Regimes (:func:`leetrepro.methods.chunk.regime`): one
    pass per lane, over many waves of lanes or a micro-batch's few (these with B and C a head
    each or in groups); N split into segments, long (N ≥ ``chunk.tables.SHORT_SPLIT_N``) or short,
    where an eager call's host time weighs; each for the forward and the dual sweep. Timings
    without r and d columns (made before the head shapes were swept) are r = d = 128's; without
    a dtype column, the kind's rows stand for each of its dtypes. ``meta``: the run's provenance
    (default: the rows' own)."""
    import pandas as pd

    from ..methods.chunk import regime
    if meta is None:
        meta = {k: df[k].iloc[0] for k in ("gpu", "commit", "commit_origin", "source", "date",
                                            "torch", "triton", "cuda", "python") if k in df}

    def column(name, default):  # (blank where rows from before the column were merged in)
        return df[name].fillna(default) if name in df else pd.Series([default] * len(df), df.index)

    dual, few, groups = column("dual", False), column("few", False), column("groups", 0)
    df = df.assign(regime=[regime(sp, n, bool(du), bool(fw), bool(gr))
                           for sp, n, du, fw, gr in zip(df.split, df.N, dual, few, groups)],
                   r=column("r", 128), d=column("d", 128), dtype=column("dtype", ""))
    out = []
    for (kind, dtype, decay, reg, r, d), g in df.groupby(["kind", "dtype", "decay", "regime",
                                                          "r", "d"]):
        ratio = g.portable_ms / g.hopper_ms
        out.append(dict(kind=kind, dtype=dtype, decay=decay, regime=reg, r=r, d=d,
                        kernel="hopper" if (ratio > 1).all() else "portable",
                        speedup=math.exp(ratio.map(math.log).mean()), **meta))
    return pd.DataFrame(out)


def best_table(df, params: tuple[str, str], meta: dict):
    """Per (kind, decay): the candidate with the least geometric mean over the shapes, among those
    that ran at every shape."""
    ok = df.dropna(subset=["ms"])
    score = (ok.assign(log_ms=ok.ms.map(math.log))
             .groupby(["kind", "decay", *params]).agg(log_ms=("log_ms", "mean"),
                                                       shapes=("ms", "size")))
    score = score[score.shapes == len(SHAPES)].reset_index()
    best = score.loc[score.groupby(["kind", "decay"]).log_ms.idxmin()]
    table = best.assign(geomean_ms=best.log_ms.map(math.exp))[
        ["kind", "decay", *params, "geomean_ms"]].copy()
    for k, v in meta.items():
        table[k] = v
    return table


def write_rows(frame, path: str, kinds=None, shapes=None) -> None:
    """``frame`` to ``path``; with ``kinds`` (a run that measured those operand kinds only) and/or
    ``shapes`` (those head shapes ``(r, d)`` only) the rows already in ``path`` outside what was
    measured (another kind, or another head shape) are kept, as they were measured (rows without
    r and d columns are r = d = 128's)."""
    import pandas as pd

    if (kinds is not None or shapes is not None) and os.path.exists(path):
        kept = pd.read_csv(path, dtype=str, keep_default_na=False)  # as written, digit for digit
        measured = pd.Series(True, index=kept.index)
        if kinds is not None:
            measured &= kept.kind.isin(kinds)
        if shapes is not None:
            for col in ("r", "d"):
                if col not in kept:
                    kept[col] = "128"
            measured &= pd.Series([(int(r), int(d)) in shapes for r, d in zip(kept.r, kept.d)],
                                  index=kept.index)
        frame = pd.concat([kept[~measured], frame.astype(str)], ignore_index=True)
    frame.to_csv(path, index=False)


def _arguments(p) -> None:
    p.add_argument("--methods", nargs="*", default=[*SWEEPS, "kernel"],
                   choices=[*SWEEPS, "kernel"],
                   help="the launch tables to measure (kernel: Chunk's forward kernel, sm_90 only)")
    p.add_argument("--kinds", nargs="*", choices=list(KINDS), default=None,
                   help="measure these operand kinds only (kernel: half, tf32); the other kinds' "
                        "rows already in the output folder's tables are kept (with their own "
                        "provenance)")
    p.add_argument("--heads", nargs="*", default=None, metavar="RxD",
                   help="kernel: measure these head shapes only (default: every one of "
                        "bench.layouts.HEAD_SHAPES); the table's rows of the others are kept")
    p.add_argument("--reps", type=int, default=7)


def main(argv=None) -> int:
    import pandas as pd

    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] == ["--table-from"]:  # no GPU: the kernel table again from a run's timings
        folder = argv[1]
        table = kernel_table(pd.read_csv(os.path.join(folder, "chunk_kernel_sweep.csv")))
        table.to_csv(os.path.join(folder, "chunk_kernel.csv"), index=False)
        print(table.to_string(index=False))
        return 0
    args, setup = gpu_main("sweep", __doc__, argv, _arguments, output="the launch tables")
    if setup is None:
        return 2
    device, meta, out = setup
    for method in args.methods:
        if method == "kernel":
            if torch.cuda.get_device_capability(device) != (9, 0):
                print("kernel: Chunk's Hopper kernel needs an sm_90 GPU; not measured", flush=True)
                continue
            # (written after each head shape, its rows replacing that shape's: a run cut short
            # keeps what it measured)
            for r, d, h in head_shapes(args.heads):
                df = pd.DataFrame(kernel_rows(device, meta, args.reps, [(r, d, h)], args.kinds))
                if df.empty:  # none of --kinds is the kernel table's
                    break
                table = kernel_table(df, meta)
                write_rows(df, os.path.join(out, "chunk_kernel_sweep.csv"), args.kinds, {(r, d)})
                write_rows(table, os.path.join(out, "chunk_kernel.csv"), args.kinds, {(r, d)})
                print(table.to_string(index=False))
                print(f"-> {out}/chunk_kernel.csv ({r}x{d})", flush=True)
            continue
        df = pd.DataFrame(sweep(method, device, meta, args.reps, args.kinds))
        if df.empty:  # none of --kinds is one of this method's
            continue
        name = method.lower()
        table = best_table(df, SWEEPS[method][0], meta)
        write_rows(df, os.path.join(out, f"{name}_sweep.csv"), args.kinds)
        write_rows(table, os.path.join(out, f"{name}_config.csv"), args.kinds)
        print(table.to_string(index=False))
        print(f"-> {out}/{name}_config.csv", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
