"""Chunk at batch 1: how many segments each lane's N rows should be cut into, measured.

At batch·heads too small to fill the GPU, Chunk cuts N into segments chained through a ring
(:func:`leetrepro.methods._gpu.segment_rows` picks how many). Each segment waits for its
predecessor's state, and the programs run in waves of one per SM, so both the chain and how well
the programs fill their waves set the time. This times Chunk with ``pieces`` segments per lane
(1 = no split) at batch 1, heads 32 (``--heads``: the lanes), r = d = 128, per dtype, mask and N:
the median time per replay of the call captured in a CUDA graph (the GPU's time, without the
eager call's host cost), the candidates interleaved. Writes ``segments.csv`` (one row per
candidate, ``default`` marking the heuristic's choice) and prints the best per cell.

    python -m leetrepro.bench.segments --out data/<gpu> [--seqlens 512 2048 ...]
"""
from __future__ import annotations

import os
import sys

import torch

from .._device import sm_count
from .._inputs import SHORT_NAMES, alibi_gammas, parse_dtype
from ..api import causal_linear_decoder
from ..methods._gpu import cdiv
from ..methods._gpu import rows_for_pieces, segment_rows
from ..methods.chunk import chunk_config
from .harness import capture_graph, gpu_main, median, random_inputs

PIECES = (1, 2, 3, 4, 6, 8, 13, 20, 32)


def measure(dtype, n: int, decay: bool, device, reps: int, heads: int = 32) -> list[dict]:
    B, C, V = random_inputs(1, heads, n, 128, 128, dtype=dtype, device=device)
    g = alibi_gammas(heads).to(device) if decay else None
    block_n = chunk_config(128, 128, dtype, "tf32", decay, device=device)["BLOCK_N"]
    default = segment_rows(n, heads, block_n, sm_count(device))
    segments = sorted({rows_for_pieces(n, p, block_n) for p in PIECES} | {default})
    graphs = {s: capture_graph(lambda s=s: causal_linear_decoder(B, C, V, g, method="Chunk",
                                                                 segment=s), (), device)
              for s in segments}
    times = {s: [] for s in segments}
    for _ in range(reps):  # interleaved: one replay of each candidate per round
        for s, graph in graphs.items():
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            stop.record()
            stop.synchronize()
            times[s].append(start.elapsed_time(stop) * 1e-3)
    graphs = B = C = V = None  # the memory freed before the next shape
    torch.cuda.empty_cache()
    return [dict(dtype=SHORT_NAMES[dtype], decay=decay, batch=1, heads=heads, N=n, block_n=block_n,
                 segment=s, pieces=cdiv(n, s), default=s == default,
                 median_s=median(times[s])) for s in segments]


def _arguments(p) -> None:
    p.add_argument("--dtypes", nargs="*", default=["bfloat16", "float32"])
    p.add_argument("--seqlens", nargs="*", type=int, default=[512, 2048, 8192, 32768, 100000])
    p.add_argument("--heads", nargs="*", type=int, default=[32],
                   help="heads (= lanes at batch 1, r = d = 128) to measure")
    p.add_argument("--reps", type=int, default=25)
    p.add_argument("--csv", default="segments.csv")


def main(argv=None) -> int:
    import pandas as pd

    args, setup = gpu_main("segments", __doc__, argv, _arguments, output="segments.csv")
    if setup is None:
        return 2
    device, meta, out = setup
    rows = []
    for dtype in map(parse_dtype, args.dtypes):
        for heads, n in ((h, n) for h in args.heads for n in args.seqlens):
            for decay in (False, True):
                cell = measure(dtype, n, decay, device, args.reps, heads)
                rows += cell
                best = min(cell, key=lambda r: r["median_s"])
                dflt = next(r for r in cell if r["default"])
                print(f"{SHORT_NAMES[dtype]} H={heads} N={n:6d} {'decay' if decay else '0-1  '} default "
                      f"{dflt['pieces']:2d} pieces {dflt['median_s'] * 1e6:8.1f} us | best "
                      f"{best['pieces']:2d} pieces {best['median_s'] * 1e6:8.1f} us "
                      f"({best['median_s'] / dflt['median_s']:.2f}x)", flush=True)
    df = pd.DataFrame(rows)
    for k, v in meta.items():
        df[k] = v
    df.to_csv(os.path.join(out, args.csv), index=False)
    print(f"wrote {os.path.join(out, args.csv)} ({len(df)} rows)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
