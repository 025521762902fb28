"""Latency of the GPU kernels and their PyTorch twins at the paper's shapes (heads 32, r = d = 128,
batch 1 and 16, N = 128 … 100000, both masks, fp32 and fp16), with the distance to the memory
floor. ``make bench-kernels`` (or ``python -m leetrepro.bench.kernels --out data/<gpu>``) writes
``kernels.csv``: median, min, max, mean, std, peak memory, floor and median/floor per cell, and
the device-to-device copy bandwidth measured in the same run (the floor uses it).
"""
from __future__ import annotations

import os
import sys


from ..complexity import io_bytes
from .harness import PAPER_SEQLENS, benchmark_method, gpu_main

KERNELS = ("Chunk", "LA", "FA", "FA_modify", "Cdotp")
TWINS = ("LA_torch", "FA_torch", "Cdotp_torch")


def _arguments(p) -> None:
    p.add_argument("--methods", nargs="*", default=list(KERNELS + TWINS))
    p.add_argument("--dtypes", nargs="*", default=["float32", "float16"])
    p.add_argument("--batches", nargs="*", type=int, default=[1, 16])
    p.add_argument("--seqlens", nargs="*", type=int, default=list(PAPER_SEQLENS))
    p.add_argument("--twin-seqlens", nargs="*", type=int, default=[128, 2048, 8192, 25600],
                   help="N for the PyTorch twins (they take seconds per call at long N)")
    p.add_argument("--reps", type=int, default=15)
    p.add_argument("--time-limit", type=float, default=2.0,
                   help="seconds one call may take before the cell reads >limit")
    p.add_argument("--cell-seconds", type=float, default=4.0,
                   help="fewer reps (≥ 3) for cells slower than this in total")


def main(argv=None) -> int:
    args, setup = gpu_main("kernel_bench", __doc__, argv, _arguments, output="kernels.csv", bandwidth=True)
    if setup is None:
        return 2
    device, meta, out, bw = setup
    frames = []
    for dtype in args.dtypes:
        for batch in args.batches:
            for decay in (False, True):
                for method in args.methods:
                    df = benchmark_method(method, device="cuda", dtype=dtype, batch_size=batch,
                                          is_weight_decay=decay,
                                          seqlens=args.twin_seqlens if method in TWINS else args.seqlens,
                                          reps=args.reps, time_limit=args.time_limit,
                                          max_cell_seconds=args.cell_seconds, progress=False)
                    frames.append(df)
                    finish(frames, bw, meta, out)  # rewritten after every sweep: a cut run keeps its data
                    cells = " ".join(f"{c:>9s}" if s != "ok" else f"{m * 1e3:9.3f}"
                                     for c, s, m in zip(df.cell, df.status, df.median_s))
                    print(f"{dtype:8s} b{batch:<2d} decay={decay!s:5s} {method:11s} ms: {cells}",
                          flush=True)
    print(f"-> {out}/kernels.csv ({sum(len(f) for f in frames)} cells)")
    return 0


def finish(frames, bw: float, meta: dict, out: str):
    """Add floor, ratio and provenance columns and write ``out/kernels.csv``."""
    import pandas as pd

    df = pd.concat(frames, ignore_index=True)
    itemsize = df.dtype.map({"float32": 4, "float16": 2, "bfloat16": 2})
    df["floor_s"] = [io_bytes(n, r, d, batch=b, heads=h, itemsize=i) / bw
                     for n, r, d, b, h, i in zip(df.N, df["rank"], df.dim, df.batch, df.heads, itemsize)]
    df["ratio_to_floor"] = df.median_s / df.floor_s
    df["copy_TBps"] = bw / 1e12
    for k, v in meta.items():
        df[k] = v
    df.to_csv(os.path.join(out, "kernels.csv"), index=False)
    return df


if __name__ == "__main__":
    sys.exit(main())
