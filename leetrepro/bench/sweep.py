"""Chunk's launch table for this GPU: rows per block (BLOCK_N) and pipeline stages per operand kind
(fp16/bf16 "half", fp32 with tf32 products) and mask, chosen by timing every candidate at the two
shapes that bound the design (batch 1, N = 100000: segments chained; batch 16, N = 25600: one pass
per lane), heads 32, r = d = 128. The best by geometric mean of the two medians is written to
``data/<gpu>/chunk_config.csv``, which :func:`leetrepro.methods.chunk.chunk_config` reads on that
GPU (``make tune``). Candidates that do not fit the GPU's shared memory are skipped.

    python -m leetrepro.bench.sweep --out data/h200
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys

import torch

from .._inputs import alibi_gammas
from ..api import causal_linear_decoder
from .harness import gpu_script_setup, median, random_inputs, time_calls

KINDS = {"half": torch.float16, "tf32": torch.float32}
BLOCK_N = (32, 64, 128)
STAGES = (1, 2, 3, 4)
SHAPES = ((1, 100000), (16, 25600))


def main(argv=None) -> int:
    import pandas as pd

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=None, help="folder for chunk_config.csv (default data/<gpu>)")
    p.add_argument("--reps", type=int, default=7)
    args = p.parse_args(argv)
    setup = gpu_script_setup("sweep", args.out)
    if setup is None:
        return 2
    device, meta, out = setup
    rows = []
    for kind, dtype in KINDS.items():
        for batch, n in SHAPES:
            B, C, V = random_inputs(batch, 32, n, 128, 128, dtype=dtype, device=device)
            for decay in (False, True):
                g = alibi_gammas(32).to(device) if decay else None
                for block_n in BLOCK_N:
                    for stages in STAGES:
                        cfg = json.dumps({"BLOCK_N": block_n, "num_stages": stages})
                        os.environ["LEETREPRO_CHUNK_CONFIG"] = cfg
                        row = dict(meta, kind=kind, decay=decay, batch=batch, N=n, block_n=block_n,
                                   stages=stages)
                        try:
                            call = lambda: causal_linear_decoder(B, C, V, g, method="Chunk")  # noqa: E731
                            call()
                            row["ms"] = median(time_calls(call, [()], args.reps, device)) * 1e3
                        except Exception as exc:  # too much shared memory for this GPU, say
                            row["ms"] = math.nan
                            row["error"] = f"{type(exc).__name__}: {str(exc)[:80]}"
                            torch.cuda.empty_cache()
                        rows.append(row)
                        print(f"{kind} b{batch} N={n} decay={decay!s:5s} BLOCK_N={block_n:3d} "
                              f"stages={stages} {row['ms']:8.3f} ms", flush=True)
            del B, C, V
            torch.cuda.empty_cache()
    os.environ.pop("LEETREPRO_CHUNK_CONFIG", None)
    df = pd.DataFrame(rows)
    df.to_csv(os.path.join(out, "chunk_sweep.csv"), index=False)
    ok = df.dropna(subset=["ms"])
    score = (ok.assign(log_ms=ok.ms.map(math.log))
             .groupby(["kind", "decay", "block_n", "stages"]).agg(log_ms=("log_ms", "mean"),
                                                                  shapes=("ms", "size")))
    score = score[score.shapes == len(SHAPES)].reset_index()
    best = score.loc[score.groupby(["kind", "decay"]).log_ms.idxmin()]
    table = best.assign(geomean_ms=best.log_ms.map(math.exp))[
        ["kind", "decay", "block_n", "stages", "geomean_ms"]]
    for k, v in meta.items():
        table[k] = v
    table.to_csv(os.path.join(out, "chunk_config.csv"), index=False)
    print(table.to_string(index=False))
    print(f"-> {out}/chunk_config.csv", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
