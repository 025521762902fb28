"""Chunk at batch 1: how many segments each lane's N rows should be cut into, measured.

At batch·heads too small to fill the GPU, Chunk cuts N into segments chained through a ring
(:func:`leetrepro.methods._gpu.segment_rows` picks how many). Each segment waits for its
predecessor's state, and the programs run in waves of one per SM, so both the chain and how well
the programs fill their waves set the time. This times Chunk with ``pieces`` segments per lane
(1 = no split) at batch 1, heads 32 (``--heads``: the lanes), r = d = 128, per dtype, mask and N:
the median time per replay of the call captured in a CUDA graph (the GPU's time, without the
eager call's host cost), the candidates interleaved. Writes ``segments.csv`` (one row per
candidate, ``default`` marking the heuristic's choice) and prints the best per cell.
``--kernel hopper --dc 128 64 32`` tries the Hopper kernel with each value-column width a
program too (``config``'s DC: fewer columns, more programs sharing each lane's B and C).

    python -m leetrepro.probes.segments --out data/<gpu> [--seqlens 512 2048 ...]
    python -m leetrepro.probes.segments --kernel hopper --dc 128 64 32 --csv segments_hopper.csv
"""
from __future__ import annotations

import os
import sys

import torch

from .._device import sm_count
from .._dtypes import SHORT_NAMES, parse_dtype
from ..api import causal_linear_decoder
from ..bench.harness import capture_graph, gpu_main, median, random_inputs
from ..decay.per_head import alibi_gammas
from ..methods._gpu import cdiv, rows_for_pieces, segment_rows
from ..methods.chunk import chunk_config

PIECES = (1, 2, 3, 4, 6, 8, 13, 20, 32)


def candidates(n: int, heads: int, dtype, decay: bool, device, kernel: str,
               dcs=(None,)) -> tuple[list, tuple]:
    """``([(segment, DC), ...], default)``: every segment length of :data:`PIECES` pieces (and the
    heuristic's), for the Hopper kernel at each value-column width of ``dcs`` (None: the widest);
    ``default``: the heuristic's (segment, DC) for ``kernel``."""
    if kernel == "hopper":
        from ..methods.chunk import hopper_split
        from ..tuning import HOPPER
        block_n = HOPPER["BLOCK_N"]
        dc, segment = hopper_split(r=128, d=128, dtype=dtype, dual=False, lanes=heads, n=n,
                                   slots=sm_count(device))
        default = (segment, dc)
        widths = [default[1] if width is None else width for width in dcs]
    else:
        block_n = chunk_config(128, 128, dtype, "tf32", decay, device=device)["BLOCK_N"]
        default = (segment_rows(n, heads, block_n, sm_count(device)), None)
        widths = [None]
    segments = sorted({rows_for_pieces(n, p, block_n) for p in PIECES} | {default[0]})
    return [(s, dc) for dc in dict.fromkeys(widths) for s in segments], default


def measure(dtype, n: int, decay: bool, device, reps: int, heads: int = 32, kernel: str = "auto",
            dcs=(None,)) -> list[dict]:
    B, C, V = random_inputs(1, heads, n, 128, 128, dtype=dtype, device=device)
    g = alibi_gammas(heads).to(device) if decay else None
    cands, default = candidates(n, heads, dtype, decay, device, kernel, dcs)
    graphs = {c: capture_graph(lambda c=c: causal_linear_decoder(
        B, C, V, g, method="Chunk", segment=c[0], kernel=kernel,
        config=None if c[1] is None else {"DC": c[1]}), (), device) for c in cands}
    times = {c: [] for c in cands}
    for _ in range(reps):  # interleaved: one replay of each candidate per round
        for c, graph in graphs.items():
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            stop.record()
            stop.synchronize()
            times[c].append(start.elapsed_time(stop) * 1e-3)
    graphs = B = C = V = None  # the memory freed before the next shape
    torch.cuda.empty_cache()
    return [dict(dtype=SHORT_NAMES[dtype], decay=decay, batch=1, heads=heads, N=n, kernel=kernel,
                 dc=c[1] or "", segment=c[0], pieces=cdiv(n, c[0]), default=c == default,
                 median_s=median(times[c])) for c in cands]


def _arguments(p) -> None:
    p.add_argument("--dtypes", nargs="*", default=["bfloat16", "float32"])
    p.add_argument("--seqlens", nargs="*", type=int, default=[512, 2048, 8192, 32768, 100000])
    p.add_argument("--heads", nargs="*", type=int, default=[32],
                   help="heads (= lanes at batch 1, r = d = 128) to measure")
    p.add_argument("--kernel", choices=("auto", "portable", "hopper"), default="auto",
                   help="Chunk's kernel option (auto: as it ships)")
    p.add_argument("--dc", nargs="*", type=int, default=None,
                   help="with --kernel hopper: value columns a program to try (32, 64, 128; "
                        "default the widest)")
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
                cell = measure(dtype, n, decay, device, args.reps, heads, args.kernel,
                               tuple(args.dc or (None,)))
                rows += cell
                best = min(cell, key=lambda r: r["median_s"])
                dflt = next(r for r in cell if r["default"])
                width = f" DC {best['dc']}" if best["dc"] else ""
                print(f"{SHORT_NAMES[dtype]} H={heads} N={n:6d} {'decay' if decay else '0-1  '} default "
                      f"{dflt['pieces']:2d} pieces {dflt['median_s'] * 1e6:8.1f} us | best "
                      f"{best['pieces']:2d} pieces{width} {best['median_s'] * 1e6:8.1f} us "
                      f"({best['median_s'] / dflt['median_s']:.2f}x)", flush=True)
    df = pd.DataFrame(rows)
    for k, v in meta.items():
        df[k] = v
    df.to_csv(os.path.join(out, args.csv), index=False)
    print(f"wrote {os.path.join(out, args.csv)} ({len(df)} rows)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
