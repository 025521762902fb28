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
out_root = None     # where tables and figures go; None: scratch/ of the checkout (make: RESULTS)

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
out_root = T.output_root(out_root)
fig_dir = os.path.join(out_root, "figures", "cross_gpu")
os.makedirs(fig_dir, exist_ok=True)


REPRODUCED = ("lemma31.csv", "table3.csv", "table4.csv", "table5.csv", "table6.csv", "table9.csv",
              "long_prompts.csv", "table7.csv", "table7_equivalence.csv", "table8.csv",
              "table8_equivalence.csv", "floor.csv", "train.csv", "serve.csv", "generation.csv")


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
    # one `make reproduce` plus floor, training and serving at one commit reads as one commit here
    commits = set()
    for name in REPRODUCED:
        d = T.load_measured(tag, name)
        if d is not None and "commit" in d:
            commits |= {str(c) for c in d.commit.dropna().unique()}
    facts["commits (reproduction, floor, training, serving)"] = " ".join(sorted(commits)) or "-"
    return facts


facts = pd.DataFrame([gpu_facts(g) for g in gpus]).set_index("tag")
display(Markdown(f"GPUs with a committed reproduction: **{', '.join(gpus) or 'none'}** (the paper: "
                 f"one NVIDIA RTX A6000, {paper.A6000_BANDWIDTH / 1e9:.0f} GB/s on its data sheet)."))
facts

# %% [markdown]
# ## Tables 3-6: the paper's A6000 beside each GPU
# Each cell: the paper's mean, then each GPU's (milliseconds, in the order of the header), `–` where a method did not run (out of memory, over the time limit, or not in the paper). The last row is each GPU's memory floor for the cell (B, C, V read and O written once at its measured copy bandwidth; the A6000's at its data-sheet rate): how far every paper method is from what the memory allows.

# %%
from leetrepro._dtypes import parse_dtype
from leetrepro.complexity import memory_floor_seconds

frames = []
for t in (3, 4, 5, 6):
    p = paper.load(t)[["method", "N", "mean_s"]].rename(columns={"mean_s": "A6000 (paper)"})
    shape = None
    for g in gpus:
        d = T.load_measured(g, f"table{t}.csv")
        if d is None:
            continue
        shape = d.iloc[0]
        d = d[d.status == "ok"][["method", "N", "mean_s"]].rename(columns={"mean_s": g})
        p = p.merge(d, on=["method", "N"], how="left")
    p.insert(0, "table", t)
    frames.append(p)
    if shape is None:
        continue
    item = parse_dtype(shape["dtype"]).itemsize
    bws = {"A6000 (paper)": paper.A6000_BANDWIDTH, **{g: facts.loc[g, "copy TB/s"] * 1e12 for g in gpus
                                        if pd.notna(facts.loc[g].get("copy TB/s"))}}
    floor = {c: {n: memory_floor_seconds(int(n), int(shape["rank"]), int(shape["dim"]),
                                         batch=int(shape["batch"]), heads=int(shape["heads"]),
                                         itemsize=item, bandwidth=bw) for n in p.N.unique()}
             for c, bw in bws.items()}
    cols = ["A6000 (paper)", *[g for g in gpus if g in p]]
    fmt = (lambda v: "–" if pd.isna(v) else f"{v * 1e3:.3g}")
    cell = p.assign(cell=[" | ".join(fmt(r[c]) for c in cols) for _, r in p.iterrows()])
    grid = cell.pivot_table(index="method", columns="N", values="cell", aggfunc="first")
    grid.loc["memory floor"] = [" | ".join(fmt(floor[c][n]) if c in floor else "–" for c in cols)
                                for n in grid.columns]
    bs, dec = T.TABLES[t]
    display(Markdown(f"**Table {t}** (batch {bs}, {'decay' if dec else '0-1'} mask, {shape['dtype']}, "
                     f"heads {shape['heads']}, r = d = {shape['rank']}): ms, "
                     + " | ".join(cols)))
    display(grid)
side = pd.concat(frames, ignore_index=True)
for g in gpus:
    side[f"{g} / paper"] = side[g] / side["A6000 (paper)"]

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
axes[0].set_ylabel("time on each GPU ÷ paper's A6000 time")
axes[0].legend(fontsize=8)
fig.tight_layout()
fig.savefig(os.path.join(fig_dir, "cross_gpu.png"), dpi=110)

# %% [markdown]
# ## Where the GPUs differ, method by method
# Per method, each GPU's time over the first GPU's, median over the cells of Tables 3-6 that ran on both (with the range). A method bound by memory bandwidth follows the ratio of copy bandwidths; one bound by compute, launches or the host keeps its time where the GPUs share a chip (the H100 and the H200 are the same GH100 die and differ in memory); a ratio above 1 is not explained by either.

# %%
if len(gpus) > 1:
    ref = gpus[0]
    for g in gpus[1:]:
        rows = []
        bw_ratio = facts.loc[ref, "copy TB/s"] / facts.loc[g, "copy TB/s"]
        both = side.dropna(subset=[ref, g])
        for m, d in both.groupby("method"):
            r = d[g] / d[ref]
            med = r.median()
            kind = ("follows the bandwidth" if abs(med - bw_ratio) < 0.1 else
                    "same time (not memory-bound)" if abs(med - 1) < 0.1 else
                    "in between" if bw_ratio < med < 1 else
                    "faster than the bandwidth alone explains" if med < bw_ratio else
                    "SLOWER on " + g)
            rows.append(dict(method=m, gpus=f"{g} / {ref}", median=round(med, 2),
                             low=round(r.min(), 2), high=round(r.max(), 2), cells=len(r),
                             reading=kind))
        # cells that ran on one GPU only: what the other could not hold or finish
        only = side[side[g].notna() & side[ref].isna()]
        if len(only):
            display(Markdown(f"Ran on {g} and not on {ref} (out of memory or over the time limit "
                             f"there): " + ", ".join(f"T{r.table} {r.method} N={r.N:,}"
                                                     for r in only.itertuples()) + "."))
        by_method = pd.DataFrame(rows)
        display(Markdown(f"Copy bandwidth ratio {ref}/{g}: {bw_ratio:.2f} (a memory-bound method's "
                         f"expected time ratio)."))
        display(by_method)
        slower = by_method[by_method.reading.str.startswith("SLOWER")]
        display(Markdown(f"Slower on {g} than on {ref}, explained neither by bandwidth nor by compute: "
                         + (", ".join(f"{r.method} ({r.median}×, {r.low}-{r.high}× over {r.cells} cells)"
                                      for r in slower.itertuples()) or "none") + "."))

# %% [markdown]
# ## Table 9: FA_modify's time over FA's, the paper beside each GPU
# The companion method's claim is "about half the time of FA". Each cell: the ratio FA_modify / FA (means), the paper's first.

# %%
p9 = paper.load(9)
t9 = {"A6000 (paper)": p9, **{g: d[d.status == "ok"] for g in gpus
                              if (d := T.load_measured(g, "table9.csv")) is not None}}
ratios = {}
for who, d in t9.items():
    w = d.pivot_table(index=["batch", "decay", "N"], columns="method", values="mean_s")
    if {"FA", "FA_modify"} <= set(w.columns):
        ratios[who] = (w.FA_modify / w.FA).round(2)
r9 = pd.DataFrame(ratios)
if len(r9):
    display(r9.reset_index().pivot_table(index=["batch", "decay"], columns="N",
                                         values=list(ratios), aggfunc="first")
            .stack(0, future_stack=True).rename_axis(["batch", "decay", "source"]))
else:
    display(Markdown("No Table 9 measured yet."))

# %% [markdown]
# ## Tables 7-8: the methods inside two models' layers, the paper beside each GPU
# Seconds per prompt (the paper's total over its 100 prompts / 100; a GPU's mean total over the prompts it ran / their count, `make table7 table8`), and Section 5.2's claims judged on each GPU's own run.

# %%
from leetrepro.bench import llm as L

for t in (7, 8):
    p = paper.load(t)[["method", "batch", "mean_s"]].assign(mean_s=lambda x: x.mean_s / 100)
    p = p.rename(columns={"mean_s": "A6000 (paper)"})
    verdicts78 = {"paper's own numbers": L.check_claims(L.paper_as_measured(paper.load(t)), t)
                  .set_index("claim").holds}
    ran = []
    for g in gpus:
        d = T.load_measured(g, f"table{t}.csv")
        if d is None:
            continue
        ran.append(f"{g}: {int(d.prompts.iloc[0])} prompts"
                   + (", slow methods on the first prompts (`extrapolated`)"
                      if "extrapolated" in d and d.extrapolated.fillna(False).astype(bool).any() else ""))
        ok = d[d.status == "ok"][["method", "batch", "per_prompt_s"]].rename(columns={"per_prompt_s": g})
        p = p.merge(ok, on=["method", "batch"], how="outer")
        verdicts78[g] = L.check_claims(d, t).set_index("claim").holds
    display(Markdown(f"**Table {t}** ({'TransNormerLLM-7B' if t == 7 else 'toy-retnet-1.3B'}, "
                     f"first two layers; s per prompt). Runs: " + ("; ".join(ran) or "none yet")))
    display(p.pivot_table(index="method", columns="batch", values=[c for c in p.columns
                                                                  if c not in ("method", "batch")])
            .round(4))
    display(pd.DataFrame(verdicts78))

# %% [markdown]
# ## Long prompts (companion paper, Figure 2): each GPU's sweep
# Median ms at a few lengths, and the longest N each method ran (`make long-prompts`): where the GPUs differ in memory, the quadratic method's reach differs.

# %%
long = {g: d for g in gpus if (d := T.load_measured(g, "long_prompts.csv")) is not None}
if long:
    show = [8192, 65536, 524288]
    rows = []
    for g, d in long.items():
        ok = d[d.status == "ok"]
        for m, x in ok.groupby("method"):
            row = dict(method=m, gpu=g, longest_N=int(x.N.max()))
            row.update({f"N={n:,} ms": round(float(x[x.N == n].median_s.iloc[0]) * 1e3, 3)
                        if (x.N == n).any() else None for n in show})
            rows.append(row)
    display(pd.DataFrame(rows).set_index(["method", "gpu"]).sort_index())
    missing = [g for g in gpus if g not in long]
    if missing:
        display(Markdown("No long-prompt sweep yet on: " + ", ".join(missing) + "."))
else:
    display(Markdown("No long-prompt sweep measured yet."))

# %% [markdown]
# ## Which claims hold on which GPU

# %%
verdicts, evidence = {}, {}
for g in gpus:
    tables = {t: T.load_measured(g, f"table{t}.csv") for t in (3, 4, 5, 6, 9)}
    tables["long"] = T.load_measured(g, "long_prompts.csv")
    c = check_claims(tables).set_index("claim")
    verdicts[g], evidence[g] = c.holds, c.evidence
verdicts["paper's own numbers"] = check_claims(paper_tables_as_measured()).set_index("claim").holds
claims = pd.DataFrame(verdicts)
claims

# %%
lines = []
for claim, row in claims.iterrows():
    held = [g for g in gpus if row[g] == "yes"]
    failed = [g for g in gpus if row[g] == "no"]
    missing = [g for g in gpus if row[g] == "not measured"]
    if (held and failed) or (missing and len(missing) < len(gpus)):
        # where the GPUs disagree, each one's evidence says why (memory, bandwidth, what ran)
        why = "; ".join(f"{g}: {evidence[g][claim] or 'no data'}" for g in gpus)
        state = (f"holds on {', '.join(held) or 'none'}, not on {', '.join(failed) or 'none'}"
                 + (f", not measured on {', '.join(missing)}" if missing else ""))
        lines.append(f"* **{claim}**: {state}. Evidence: {why}.")
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

