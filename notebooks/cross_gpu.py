# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # The paper's tables across GPUs
# Per table, the paper's A6000 number beside every GPU that has a committed reproduction under `data/<gpu>/` (`make reproduce` on that GPU), each GPU's memory floor, and which of the paper's claims hold on which GPU. Nothing is timed here: the notebook reads the committed data. A GPU without a table is left out of that table; where GPUs disagree on a claim, the last section puts the reason beside the numbers (bandwidth, SM count, memory).

# %% tags=["parameters"]
gpus = None          # tags to compare (default: every data/<tag>/ with Tables 3-6)
out_root = "."

# %%
import os
import matplotlib.pyplot as plt
import pandas as pd
from IPython.display import Markdown, display
from leetrepro import _paths
from leetrepro.reproduce import paper
from leetrepro.reproduce import tables as T
from leetrepro.reproduce.claims import check_claims, paper_tables_as_measured

root = _paths.resource("data")
if gpus is None:
    gpus = sorted(t for t in os.listdir(root) if t != "paper"  # data/paper: the paper's own numbers
                  and os.path.exists(os.path.join(root, t, "table3.csv")))
fig_dir = os.path.join(out_root, "figures", "cross_gpu")
os.makedirs(fig_dir, exist_ok=True)


def gpu_facts(tag):
    """Name, measured copy bandwidth (floor.csv or serve.csv of the same GPU) and commits."""
    facts = dict(tag=tag)
    for name in ("floor.csv", "serve.csv", "train.csv"):
        d = T.load_measured(tag, name)
        if d is not None and "gpu" in d:
            facts["gpu"] = d.gpu.iloc[0]
            if "copy_TBps" in d:
                facts["copy TB/s"] = round(float(d.copy_TBps.iloc[0]), 2)
                break
    t3 = T.load_measured(tag, "table3.csv")
    if t3 is not None:
        facts.setdefault("gpu", t3.gpu.iloc[0])
        facts["tables' commits"] = " ".join(sorted({str(c) for c in t3.commit.dropna().unique()}))
    return facts


facts = pd.DataFrame([gpu_facts(g) for g in gpus]).set_index("tag")
display(Markdown(f"GPUs with a committed reproduction: **{', '.join(gpus) or 'none'}** (the paper: "
                 f"one NVIDIA RTX A6000, 768 GB/s)."))
facts

# %% [markdown]
# ## Tables 3-6: the paper's A6000 beside each GPU (mean seconds; ratio to the paper)

# %%
frames = []
for t in (3, 4, 5, 6):
    p = paper.load(t)[["method", "N", "mean_s"]].rename(columns={"mean_s": "A6000 (paper)"})
    for g in gpus:
        d = T.load_measured(g, f"table{t}.csv")
        if d is None:
            continue
        d = d[d.status == "ok"][["method", "N", "mean_s"]].rename(columns={"mean_s": g})
        p = p.merge(d, on=["method", "N"], how="left")
    p.insert(0, "table", t)
    frames.append(p)
side = pd.concat(frames, ignore_index=True)
for g in gpus:
    side[f"{g} / paper"] = side[g] / side["A6000 (paper)"]
side.round(5)

# %%
fig, axes = plt.subplots(1, 4, figsize=(17, 3.8), sharey=True)
for ax, t in zip(axes, (3, 4, 5, 6)):
    d = side[side.table == t]
    for g in gpus:
        r = d.groupby("method")[f"{g} / paper"].median()
        ax.plot(r.index, r.values, "o", label=g)
    ax.axhline(1, color="gray", lw=0.8)
    ax.set(yscale="log", title=f"Table {t}: median over N of time / paper's")
    ax.tick_params(axis="x", rotation=60, labelsize=7)
    ax.grid(alpha=0.3)
axes[0].set_ylabel("time on this GPU ÷ paper's A6000 time")
axes[0].legend(fontsize=8)
fig.tight_layout()
fig.savefig(os.path.join(fig_dir, "cross_gpu.png"), dpi=110)

# %% [markdown]
# ## Which claims hold on which GPU

# %%
verdicts = {}
for g in gpus:
    tables = {t: T.load_measured(g, f"table{t}.csv") for t in (3, 4, 5, 6, 9)}
    tables["long"] = T.load_measured(g, "long_prompts.csv")
    c = check_claims(tables)
    verdicts[g] = c.set_index("claim").holds
verdicts["paper's own numbers"] = check_claims(paper_tables_as_measured()).set_index("claim").holds
claims = pd.DataFrame(verdicts)
claims

# %%
lines = []
for claim, row in claims.iterrows():
    held = [g for g in gpus if row[g] == "yes"]
    failed = [g for g in gpus if row[g] == "no"]
    if held and failed:
        lines.append(f"* **{claim}**: holds on {', '.join(held)}, not on {', '.join(failed)}.")
    elif gpus:
        state = "holds on every GPU" if held else ("holds on no GPU" if failed else
                                                  "is not measured on any GPU")
        own = row["paper's own numbers"]
        lines.append(f"* **{claim}**: {state} here ({', '.join(gpus)}); on the paper's own "
                     f"numbers: {own}.")
bw = facts["copy TB/s"].dropna() if "copy TB/s" in facts else pd.Series(dtype=float)
display(Markdown("\n".join(lines) + ("\n\nMeasured copy bandwidth: " + ", ".join(
    f"{g} {v} TB/s" for g, v in bw.items()) + ": a memory-bound method's time scales with the "
    "inverse of it, a launch- or latency-bound one's does not (the short-N cells)." if len(bw) else "")))

# %% [markdown]
# ## Distance to the memory floor on each GPU
# `make floor` on every GPU that has it (`data/<gpu>/floor.csv`): this project's kernel (Chunk) and flash-linear-attention at the cells of the floor targets, median milliseconds and time / floor. Between two GPUs, a memory-bound kernel's time falls with the copy bandwidth; one limited by its own latency or instruction issue keeps its time, so its ratio to the (lower) floor grows.

# %%
CELLS = [("fp16", 16, 25600, False), ("fp16", 16, 25600, True), ("fp16", 1, 100000, False),
         ("fp16", 1, 100000, True), ("fp32", 16, 25600, False), ("fp32", 1, 100000, False)]
floor_gpus = sorted(t for t in os.listdir(root) if os.path.exists(os.path.join(root, t, "floor.csv")))
rows = []
for g in floor_gpus:
    f = T.load_measured(g, "floor.csv")
    f = f[(f.status == "ok") & f.method.isin(["Chunk", "fla"])]
    for dt, b, n, dec in CELLS:
        for r in f[(f.dtype == dt) & (f.batch == b) & (f.N == n) & (f.decay == dec)].itertuples():
            rows.append(dict(cell=f"{dt} b{b} N={n} {'decay' if dec else '0-1'}", method=r.method,
                             gpu=g, ms=r.median_s * 1e3, floor_ratio=r.floor_ratio,
                             copy_TBps=r.copy_TBps, commit=r.commit))
fl = pd.DataFrame(rows)
if len(fl):
    wide = fl.pivot_table(index=["cell", "method"], columns="gpu", values=["ms", "floor_ratio"], sort=False)
    display(wide.round(3))
else:
    display(Markdown("No `floor.csv` under `data/`: run `make floor` on a GPU."))

# %%
lines = []
if len(floor_gpus) >= 2 and len(fl):
    a, b = floor_gpus[0], floor_gpus[-1]
    bw = fl.groupby("gpu").copy_TBps.first()
    lines.append(f"* Copy bandwidth {a} {bw[a]:.2f} TB/s, {b} {bw[b]:.2f} TB/s: a memory-bound kernel "
                 f"would take {bw[a] / bw[b]:.2f}× the time on {b}.")
    for (cell, method), g in fl.groupby(["cell", "method"], sort=False):
        g = g.set_index("gpu")
        if a in g.index and b in g.index:
            lines.append(f"* {method}, {cell}: {b} takes {g.ms[b] / g.ms[a]:.2f}× the time of {a} "
                         f"({g.floor_ratio[a]:.2f}× → {g.floor_ratio[b]:.2f}× its floor).")
display(Markdown("\n".join(lines) if lines else "One GPU with `floor.csv`: nothing to compare yet."))

