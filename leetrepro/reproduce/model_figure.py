"""The model benchmark's figure: ``python -m leetrepro.reproduce.model_figure`` draws
``figures/<gpu>/model.{png,svg}`` from each ``data/<gpu>/model.csv`` (``make bench-model``).

One panel per model size: tokens/s of a training step with each mixer in each mode the file
holds (eager, ``torch.compile``, CUDA graphs), each bar labelled with the operator's share of the step's GPU time.
"""
from __future__ import annotations

import argparse
import os
import sys

from .. import _paths
from .results import gpu_folders
from .tables import stamp


def figure(df, title: str):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = df[df.status == "ok"]
    modes = [m for m in ("eager", "compile", "graphs") if (ok["mode"] == m).any()]
    height = 0.8 / max(len(modes), 1)
    sizes = list(dict.fromkeys(ok["size"]))
    fig, axes = plt.subplots(1, len(sizes), figsize=(6.2 * len(sizes), 4.2), squeeze=False)
    for ax, size in zip(axes[0], sizes):
        cell = ok[ok["size"] == size]
        mixers = list(dict.fromkeys(cell.mixer))[::-1]  # (the first mixer on top)
        for j, mode in enumerate(modes):  # (the first mode on top of each mixer's bars)
            part = cell[cell["mode"] == mode].set_index("mixer")
            ys = [i + height * ((len(modes) - 1) / 2 - j) for i in range(len(mixers))]
            vals = [part.tokens_per_s.get(m, float("nan")) / 1e3 for m in mixers]
            ax.barh(ys, vals, height=height * 0.95, color=f"C{j}", label=mode)
            for y, m, v in zip(ys, mixers, vals):
                share = part.op_share.get(m) if "op_share" in part else None
                if v == v and share is not None and share == share:
                    ax.text(v, y, f" {share:.0%}", va="center", fontsize=7)
        ax.set_yticks(range(len(mixers)), mixers, fontsize=8)
        first = cell.iloc[0]
        ax.set(xlabel="tokens/s (thousands)",
               title=f"{size}: {first['layers']} × {first['dim']}, {first['heads']} heads, "
                     f"batch {first['batch']} × {first['seq']}")
        ax.grid(True, axis="x", alpha=0.3)
    axes[0][0].legend(fontsize=8, loc="lower right")
    fig.suptitle(f"{title}: a training step (bf16, fused AdamW) with each token mixer; "
                 "label: the operator's share of the step's GPU time", fontsize=9)
    fig.tight_layout()
    stamp(fig, df)
    return fig


def main(argv=None) -> int:
    import pandas as pd

    from .tables import gpu_name
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--root", default=_paths.ROOT)
    args = p.parse_args(argv)
    drawn = 0
    for tag in gpu_folders(os.path.join(args.root, "data")):
        path = os.path.join(args.root, "data", tag, "model.csv")
        if not os.path.exists(path):
            continue
        fig = figure(pd.read_csv(path), gpu_name(tag))
        stem = os.path.join(args.root, "figures", tag, "model")
        os.makedirs(os.path.dirname(stem), exist_ok=True)
        for ext in ("png", "svg"):
            fig.savefig(f"{stem}.{ext}", dpi=110, metadata={"Date": None} if ext == "svg" else {})
        print(f"wrote {stem}.png, .svg")
        drawn += 1
    if not drawn:
        print("no data/<gpu>/model.csv: run `make bench-model` on a GPU first", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
