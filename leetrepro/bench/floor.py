"""Distance to the memory floor: our kernels next to flash-linear-attention, in one process.

``make floor`` (or ``python -m leetrepro.bench.floor --out data/<gpu>``) times, per cell (dtype ×
batch ×
N × mask; heads 32, r = d = 128, inputs ``randn``, ALiBi-style decays), each entry below with CUDA
events around the Python call (launch overhead counts), median of ``--reps`` after a warm-up,
alternating two input sets where memory allows. It prints one line per cell and writes
``floor.csv``: median, floor = (|B|+|C|+|V|+|O|)·bytes / measured copy bandwidth, median/floor,
time relative to flash-linear-attention (``vs_fla``) and to the original LA (``vs_original``, from
``data/anchors``, measured on the H100 only, so on other GPUs empty; fp32 only: its fp16 config does
not launch on an H100), the error against the
float64 oracle (first sequence of the batch, N ≤ 25600) and the workspace: peak memory beyond
inputs and output. ``host_us``: the median host time of one call with the GPU idle before it (what
launching costs the CPU); ``graph_us`` (N ≤ 2048): the median time per replay of the call captured
in a CUDA graph (``graph_note`` where it cannot be captured). ``first_call_s``: the wall time of the
entry's first call in the cell (compilation of a kernel configuration new to the process, or
flash-linear-attention's autotuning of a new shape, included): what a user's first call of that
shape costs.

Entries: ``auto`` (the default method, what a user gets), ``Chunk`` (fp32: tf32 dots),
``Chunk/tf32x3`` (fp32 only: meets the 1e-5 contract), ``LA``, and ``fla`` =
``fla.ops.simple_gla.chunk_simple_gla`` (the optional ``bench`` dependency
``fla-core``; its time-major layout is prepared outside the timed call, ``scale=1``).
"""
from __future__ import annotations

import os
import sys
import time

import torch

from .. import _paths
from .._dtypes import SHORT_NAMES, parse_dtype
from ..decay.per_head import alibi_gammas
from ..api import causal_linear_decoder
from ..complexity import io_bytes
from ..reference import reference, rel_error
from .harness import (failed_status, fla_chunk_simple_gla, gpu_main, graph_seconds, host_seconds,
                      peak_above, random_inputs, time_calls)

GRID_N = {1: [128, 512, 2048, 8192, 25600, 100000], 16: [128, 512, 2048, 8192, 25600]}
#: cells up to this N are also timed as a CUDA-graph replay (``graph_us``): there the eager call
#: is host-bound, and a captured step is how such calls should be made
GRAPH_N = 2048


def entries(dtype: torch.dtype, names) -> dict:
    """name -> fn(B, C, V, g, fla_inputs) for the entries that run this dtype."""
    out = {}
    for name in names:
        if name == "fla":
            chunk_simple_gla = fla_chunk_simple_gla()
            if chunk_simple_gla is None:
                continue
            out[name] = (lambda B, C, V, g, t, f=chunk_simple_gla:
                         f(t[0], t[1], t[2], g_gamma=t[3], scale=1.0)[0])
        elif "/" in name:
            method, precision = name.split("/")
            if dtype == torch.float32:
                out[name] = (lambda B, C, V, g, t, m=method, p=precision:
                             causal_linear_decoder(B, C, V, g, method=m, fp32_precision=p))
        else:
            out[name] = (lambda B, C, V, g, t, m=name: causal_linear_decoder(B, C, V, g, method=m))
    return out


def original_times(gpu: str, method: str = "LA") -> dict:
    """(dtype, batch, decay, N) -> the original code's median seconds for ``method`` (its
    abbreviation) measured on GPU ``gpu`` (its full name, as ``provenance`` records it) in
    ``data/anchors``; dtype as ``fp32``/``fp16``/``bf16``. {} where none was measured there (the
    anchors hold the H100 only: another GPU's times are no reference for this one)."""
    path = _paths.data("anchors", "h100-originals-and-fla.csv")
    if not os.path.exists(path):
        return {}
    import pandas as pd
    df = pd.read_csv(path)
    df = df[(df.method == method) & (df.status == "ok") & (df.gpu == gpu)
            & df.code.str.startswith("original")]
    return {(r.dtype, int(r.batch), bool(r.decay), int(r.N)): float(r.median_s)
            for r in df.itertuples()}


def with_references(df):
    """``vs_fla`` and ``vs_original`` of every row of a ``floor.csv`` table: its median over
    flash-linear-attention's in the same cell and over the original LA's on the same GPU
    (:func:`original_times`; None where the anchors have no such cell)."""
    df = df.copy()
    orig = original_times(df.gpu.iloc[0]) if len(df) else {}
    key = ["dtype", "batch", "decay", "N"]
    ok = df.status == "ok"
    fla = df[ok & (df.method == "fla")].set_index(key).median_s
    cells = list(df[key].itertuples(index=False, name=None))
    df["vs_fla"] = [m / fla[c] if s and c in fla.index else None
                    for m, c, s in zip(df.get("median_s", [None] * len(df)), cells, ok)]
    df["vs_original"] = [m / orig[c] if s and c in orig else None
                         for m, c, s in zip(df.get("median_s", [None] * len(df)), cells, ok)]
    return df


def measure_cell(fns: dict, dtype, batch, n, decay, reps, bw, device, heads=32, rank=128, dim=128,
                 check_error: bool = True) -> list[dict]:
    per = batch * heads * n * (2 * rank + dim) * dtype.itemsize
    sets = 2 if per < 2 * 2 ** 30 else 1
    gen = torch.Generator(device=device).manual_seed(n + batch)
    inputs = [random_inputs(batch, heads, n, rank, dim, dtype=dtype, device=device, generator=gen)
              for _ in range(sets)]
    g = alibi_gammas(heads).to(device) if decay else None
    fla_g = torch.log(g).float() if decay else torch.zeros(heads, device=device)
    fla_in = [tuple(t.transpose(1, 2).contiguous() for t in s) + (fla_g,) for s in inputs] \
        if "fla" in fns else [None] * sets
    floor_s = io_bytes(n, rank, dim, batch=batch, heads=heads, itemsize=dtype.itemsize) / bw
    ref = None
    if check_error and n <= 25600:
        B, C, V = (t[:1] for t in inputs[0])
        ref = reference(B, C, V, g, row_block=512)
    rows = []
    for name, fn in fns.items():
        row = dict(dtype=SHORT_NAMES[dtype], batch=batch, decay=decay, N=n, method=name, floor_s=floor_s)
        try:
            torch.cuda.synchronize(device)
            t0 = time.perf_counter()
            out = fn(*inputs[0], g, fla_in[0])  # warm-up (compiles)
            torch.cuda.synchronize(device)
            row["first_call_s"] = time.perf_counter() - t0
            if ref is not None:
                o = out[:1] if name != "fla" else out[:1].transpose(1, 2)
                row["rel_error"] = rel_error(o, ref)
            del out
            out, peak = peak_above(lambda a=inputs[0], f=fla_in[0]: fn(*a, g, f), device)
            row["workspace_MB"] = (peak - out.numel() * out.element_size()) / 2 ** 20
            del out
            args = [(s[0], s[1], s[2], g, f) for s, f in zip(inputs, fla_in)]
            times = sorted(time_calls(fn, args, reps, device))
            row.update(median_s=times[len(times) // 2], min_s=times[0], max_s=times[-1],
                       reps=reps, status="ok", host_us=host_seconds(fn, args[0], reps, device) * 1e6)
            row["floor_ratio"] = row["median_s"] / floor_s
            if n <= GRAPH_N:
                try:
                    row["graph_us"] = graph_seconds(fn, args[0], reps, device) * 1e6
                except Exception as err:  # a call that cannot be captured: said, not fatal
                    row["graph_note"] = f"{type(err).__name__}: {str(err)[:80]}"
                    torch.cuda.synchronize(device)
        except Exception as err:  # one failing cell never aborts the run
            row["status"] = failed_status(err, 120)
            torch.cuda.empty_cache()
        rows.append(row)
    del inputs, fla_in, ref
    torch.cuda.empty_cache()
    return rows


def _arguments(p) -> None:
    p.add_argument("--entries", nargs="*", default=["auto", "Chunk", "Chunk/tf32x3", "LA", "fla"])
    p.add_argument("--dtypes", nargs="*", default=["float16", "bfloat16", "float32"])
    p.add_argument("--batches", nargs="*", type=int, default=[1, 16])
    p.add_argument("--seqlens", nargs="*", type=int, default=None,
                   help="N values (default: 128 … 100000 at batch 1, … 25600 at batch 16)")
    p.add_argument("--masks", nargs="*", default=["0-1", "decay"])
    p.add_argument("--reps", type=int, default=15)
    p.add_argument("--csv", default="floor.csv")


def main(argv=None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    args, setup = gpu_main("floor", __doc__, argv, _arguments, output="floor.csv", bandwidth=True)
    if setup is None:
        return 2
    import pandas as pd

    device, meta, out, bw = setup
    rows = []
    for dt in map(parse_dtype, args.dtypes):
        fns = entries(dt, args.entries)
        for batch in args.batches:
            for n in args.seqlens or GRID_N.get(batch, GRID_N[16]):
                for mask in args.masks:
                    cell = measure_cell(fns, dt, batch, n, mask == "decay", args.reps, bw, device)
                    rows += cell
                    print(f"{SHORT_NAMES[dt]} b{batch} N={n} {mask:5s} floor {cell[0]['floor_s'] * 1e3:.3f} ms | "
                          + " | ".join(f"{r['method']} " + (f"{r['median_s'] * 1e3:.3f} ms "
                                       f"({r['floor_ratio']:.2f}x)" if r.get("median_s")
                                       else r["status"][:40]) for r in cell), flush=True)
    df = pd.DataFrame(rows)
    df["copy_TBps"] = bw / 1e12
    for k, v in meta.items():
        df[k] = v
    df = with_references(df)
    path = os.path.join(out, args.csv)
    df.to_csv(path, index=False)
    print(f"wrote {path} ({len(df)} rows)")
    return 0


def targets(df):
    """The floor targets checked from ``floor.csv``: one row per (dtype, batch, mask, N, entry).

    * N ≥ 8192: median/floor ≤ 1.3 (``Chunk``; ``Chunk/tf32x3`` is the fp32-contract path,
      reported with its own ratio and no target);
    * N ≤ 2048, batch 1: at most half of flash-linear-attention's time and of the original LA's
      (where the original runs: fp32), and at most 30 µs of host time per eager call.
    """
    import pandas as pd
    ok = df[df.status == "ok"]
    rows = []
    for r in ok[ok.method.str.startswith("Chunk")].itertuples():
        if r.N >= 8192:
            rows.append(dict(dtype=r.dtype, batch=r.batch, decay=r.decay, N=r.N, entry=r.method,
                             target="≤ 1.3× floor", value=round(r.floor_ratio, 2),
                             met="-" if "/" in r.method else ("yes" if r.floor_ratio <= 1.3 else "no")))
        elif r.batch == 1 and "/" not in r.method:
            host = getattr(r, "host_us", None)
            if host is not None and host == host:
                rows.append(dict(dtype=r.dtype, batch=r.batch, decay=r.decay, N=r.N, entry=r.method,
                                 target="host ≤ 30 µs per eager call", value=round(host, 1),
                                 met="yes" if host <= 30 else "no"))
            for ref in ("fla", "original"):
                v = getattr(r, f"vs_{ref}", None)
                if v is not None and v == v:
                    rows.append(dict(dtype=r.dtype, batch=r.batch, decay=r.decay, N=r.N,
                                     entry=r.method, target=f"≤ 0.5× {ref}", value=round(v, 2),
                                     met="yes" if v <= 0.5 else "no"))
    return pd.DataFrame(rows)


if __name__ == "__main__":
    sys.exit(main())
