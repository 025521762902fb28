"""Latency tables (the paper's Tables 3-6 and 9): measure, or reload a committed measurement, put
the paper's A6000 numbers beside ours, mark the fastest method per N, and plot latency against N.

A measured table is a ``benchmark_method`` DataFrame per method, concatenated, with provenance
columns (gpu, commit, date, library versions); it is saved as ``data/<gpu>/table<k>.csv``.
"""
from __future__ import annotations

import os

from .. import _paths
from ..bench.harness import PAPER_SEQLENS, benchmark_method, provenance

PAPER_METHODS = ("Vanilla", "Bb", "Cdotp", "Cdotp_torch", "FA", "FA_torch", "LA", "LA_torch", "Recur")
#: table -> (batch size, exponential decay)
TABLES = {3: (1, False), 4: (1, True), 5: (16, False), 6: (16, True)}


def data_path(gpu: str, name: str) -> str:
    return _paths.data(gpu, name)


def measure(methods=PAPER_METHODS, *, batch_size=1, decay=False, dtype="float32",
            seqlens=PAPER_SEQLENS, reps=15, device="cuda", heads=32, rank=128, dim=128,
            time_limit=60.0, progress=True):
    """Run ``benchmark_method`` for every method; one failing cell never stops the table."""
    import pandas as pd

    frames = []
    for m in methods:
        df = benchmark_method(m, device=device, dtype=dtype, batch_size=batch_size,
                              is_weight_decay=decay, seqlens=seqlens, heads=heads, rank=rank,
                              dim=dim, reps=reps, time_limit=time_limit, progress=progress)
        frames.append(df)
    out = pd.concat(frames, ignore_index=True)
    for k, v in provenance(device).items():
        out[k] = v
    return out


def load_measured(gpu: str, name: str):
    """A committed measurement (``data/<gpu>/<name>``) or None."""
    import pandas as pd
    path = data_path(gpu, name)
    # (commit hashes as text: "7e07502" would read as a float)
    return pd.read_csv(path, dtype={"commit": str}) if os.path.exists(path) else None


def from_kernel_bench(gpu: str, batch: int, decay: bool, dtype: str = "float32"):
    """The cells of ``data/<gpu>/kernels.csv`` (``make bench-kernels``) for one table's setting:
    what can be re-rendered where the full table was not measured."""
    k = load_measured(gpu, "kernels.csv")
    if k is None:
        return None
    return k[(k.batch == batch) & (k.decay == decay) & (k.dtype == dtype)].copy()


def side_by_side(measured, paper_table):
    """One row per (method, N): the paper's mean, ours (mean, std, status), ours/paper."""
    import pandas as pd

    p = paper_table[["method", "N", "mean_s", "cell"]].rename(
        columns={"mean_s": "paper_s", "cell": "paper_cell"})
    m = measured[["method", "N", "mean_s", "std_s", "median_s", "status", "cell"]].rename(
        columns={"mean_s": "ours_s", "std_s": "ours_std_s", "cell": "ours_cell"})
    both = pd.merge(p, m, on=["method", "N"], how="outer")
    both["ours_cell"] = both.ours_cell.fillna("not measured")
    both["paper_cell"] = both.paper_cell.fillna("not in paper")
    both["ratio"] = both.ours_s / both.paper_s
    return both.sort_values(["method", "N"]).reset_index(drop=True)


def wide(both, value: str = "ours_cell"):
    """Methods × N table of one column of :func:`side_by_side` (the paper's layout)."""
    return both.pivot(index="method", columns="N", values=value)


def fastest(both, column: str = "ours_s"):
    """{N: method} with the smallest ``column`` per N (NaN cells never win)."""
    best = both.dropna(subset=[column]).sort_values(column).groupby("N").first()
    return best.method.to_dict()


def styled(both, column: str = "ours_s", label: str = "ours_cell"):
    """pandas Styler of :func:`wide` with the fastest method per N in bold, as the paper prints."""
    table = wide(both, label)
    win = fastest(both, column)

    def bold(col):
        return ["font-weight: bold" if win.get(col.name) == idx else "" for idx in col.index]

    return table.style.apply(bold, axis=0)


def triple(both):
    """paper / ours / ratio per cell as one string per (method, N): what the notebooks print."""
    def cell(r):
        ratio = f"{r.ratio:.2f}×" if r.ratio == r.ratio else "–"
        return f"{r.paper_cell} | {r.ours_cell} | {ratio}"
    both = both.copy()
    both["paper | ours | ours/paper"] = both.apply(cell, axis=1)
    return wide(both, "paper | ours | ours/paper")


def plot_latency(measured, title: str, path_stem: str | None = None, paper_table=None,
                 baseline: str = "Bb", gpu_label: str = "measured"):
    """One small panel per method: its speed-up over ``baseline`` (block-based, plain PyTorch,
    runs at every N) against N, the measured GPU (``gpu_label``) solid, the paper's A6000 dashed (each over its own
    baseline), from means as the tables report them. Without the baseline, latency. Saves PNG
    and SVG."""
    import matplotlib.pyplot as plt

    ok = measured[measured.status == "ok"]
    theirs_all = None if paper_table is None else paper_table.dropna(subset=["mean_s"])
    speedup = baseline in set(ok.method)
    methods = sorted(m for m in ok.method.unique() if not (speedup and m == baseline))
    cols = 3
    rows = -(-len(methods) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 2.8 * rows), squeeze=False,
                             sharex=True)

    def curve(df, method):
        t = df[df.method == method].set_index("N").mean_s
        if not speedup:
            return t
        base = df[df.method == baseline].set_index("N").mean_s
        both = t.index.intersection(base.index)
        return (base.loc[both] / t.loc[both]).sort_index()

    for ax, method in zip(axes.flat, methods):
        ours = curve(ok, method)
        ax.plot(ours.index, ours.values, "o-", color="C0", label=gpu_label)
        if theirs_all is not None and method in set(theirs_all.method) and \
                (not speedup or baseline in set(theirs_all.method)):
            theirs = curve(theirs_all, method)
            ax.plot(theirs.index, theirs.values, "s--", color="C1", label="paper (A6000)")
        if speedup:
            ax.axhline(1, color="gray", lw=0.8)
        ax.set(xscale="log", yscale="log", title=method)
        readable_log(ax, "y")  # (a panel spanning under a decade showed one label, or none)
        ax.grid(True, which="both", alpha=0.3)
    for ax in axes.flat[len(methods):]:
        ax.axis("off")
    for ax in axes[:, 0]:
        ax.set_ylabel(f"speed-up over {baseline}" if speedup else "latency (s)")
    for ax in axes[-1]:
        ax.set_xlabel("sequence length N")
    axes.flat[0].legend(fontsize=8)
    reps = f"mean of {int(ok.reps.iloc[0])} timed calls" if "reps" in ok and len(ok) else "means"
    fig.suptitle(f"{title} — {reps}" + (f"; above 1: faster than {baseline}" if speedup else ""))
    fig.tight_layout()
    stamp(fig, ok)
    if path_stem:
        os.makedirs(os.path.dirname(path_stem), exist_ok=True)
        for ext in ("png", "svg"):
            fig.savefig(f"{path_stem}.{ext}", dpi=110)
    return fig


def readable_log(ax, axis: str = "y") -> None:
    """A log axis labelled in plain numbers at 1-2-5 steps: matplotlib labels only powers of ten,
    so an axis spanning less than a decade shows one labelled tick or none."""
    import math

    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter
    ax.autoscale_view()  # (the limits are otherwise computed lazily, at the first draw)
    for a in ((ax.yaxis,) if axis == "y" else (ax.xaxis,) if axis == "x" else (ax.xaxis, ax.yaxis)):
        lo, hi = sorted(a.get_view_interval())
        # under about a decade in view (the data plotted first): every integer step, so that
        # such a panel still shows three or more labels
        narrow = lo > 0 and math.log10(hi / lo) < 1.2
        a.set_major_locator(LogLocator(base=10, subs=(1, 1.5, 2, 3, 4, 5, 6, 7, 8, 9) if narrow
                                       else (1.0, 2.0, 5.0)))
        a.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        a.set_minor_formatter(NullFormatter())


def stamp(fig, rows) -> None:
    """The GPU(s), commit(s) and date(s) of ``rows`` (a DataFrame with provenance columns) in
    small print at the figure's foot: a figure copied out of its page still says where its
    numbers come from."""
    def values(col):
        return ", ".join(sorted({str(v) for v in rows[col].dropna()})) if col in rows else "?"
    fig.text(0.995, 0.002, f"{values('gpu')}; commit {values('commit')}; {values('date')}",
             ha="right", va="bottom", fontsize=6.5, color="0.35")


def gpu_name(gpu: str) -> str:
    """A GPU folder tag as people write the GPU: ``h100`` → ``H100``, ``h200x2`` → ``2×H200``."""
    base, _, count = gpu.partition("x")
    return f"{count}×{base.upper()}" if count.isdigit() else gpu.upper()


def gpu_words(gpu: str, live: bool) -> str:
    """How a notebook's text names the GPU whose numbers it shows: measured here, or re-rendered
    from the committed data on a machine without it (never "this GPU" there)."""
    return f"this GPU ({gpu_name(gpu)})" if live else \
        f"the {gpu_name(gpu)} (re-rendered from data/{gpu}/)"


def output_root(out_root: str | None) -> str:
    """Where a notebook writes its tables and figures: ``out_root`` as given (``make`` passes its
    ``RESULTS``: ``.`` on a GPU, to regenerate the committed files), or by default the checkout's
    ``scratch/`` (ignored by git; outside a checkout ``./leetrepro-out``), so that a notebook run
    by hand, in JupyterLab or through papermill, from any folder, never rewrites ``data/`` or
    ``figures/``."""
    if out_root is not None:
        return out_root
    from .._paths import ROOT
    checkout = os.path.exists(os.path.join(ROOT, "pyproject.toml")) and \
        os.path.isdir(os.path.join(ROOT, "notebooks"))
    return os.path.join(ROOT, "scratch") if checkout else os.path.abspath("leetrepro-out")


def notebook_setup(device: str, gpu: str | None, out_root: str | None, *,
                   default: str = "h100"):
    """What every reproduction notebook starts with: ``(live, gpu, data_dir, fig_dir)``. ``live``:
    the device can measure (a CPU always can; "cuda" needs a GPU); ``gpu``: the folder tag (this
    GPU's, or ``default`` to re-render committed data); both folders under ``out_root``
    (:func:`output_root`: None is the scratch folder) are made. Without a GPU, says so in the
    notebook."""
    import torch

    from .._device import gpu_tag

    out_root = output_root(out_root)
    live = torch.device(device).type != "cuda" or torch.cuda.is_available()
    gpu = gpu or (gpu_tag(device) if live else default)
    data_dir = os.path.join(out_root, "data", gpu)
    fig_dir = os.path.join(out_root, "figures", gpu)
    os.makedirs(data_dir, exist_ok=True)
    os.makedirs(fig_dir, exist_ok=True)
    if not live:
        from IPython.display import Markdown, display
        display(Markdown(f"**No GPU on this machine: nothing is measured here. The tables below are "
                         f"re-rendered from the committed measurements in `data/{gpu}/`.**"))
    return live, gpu, data_dir, fig_dir
