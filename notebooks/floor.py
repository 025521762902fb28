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
# # Distance to the memory floor
# Our kernels next to flash-linear-attention, timed in one process by `make floor` (`leetrepro.bench.floor`): median / floor, where the floor is (|B|+|C|+|V|+|O|)·bytes over the copy bandwidth measured in the same run; then `method="auto"` from `make tune` (`data/<gpu>/dispatch.csv`) and its regret against the best method per cell.

# %% tags=["parameters"]
gpu = None
device = "cuda"
measure = False     # True on a GPU: run the benchmark now (minutes) instead of reading floor.csv
out_root = None     # where tables and figures go; None: scratch/ of the checkout (make: RESULTS)

# %%
import os
from IPython.display import Markdown, display
from leetrepro.reproduce import tables as T
live, gpu, data_dir, fig_dir = T.notebook_setup(device, gpu, out_root)
import pandas as pd
import matplotlib.pyplot as plt
from leetrepro.bench import floor as F
path = os.path.join(data_dir, "floor.csv")
if live and measure:
    F.main(["--out", data_dir])
df = pd.read_csv(path) if os.path.exists(path) else T.load_measured(gpu, "floor.csv")
assert df is not None, f"no floor.csv for {gpu}: run `make floor` on that GPU"
p = df.iloc[0]
display(Markdown(f"GPU {p.gpu}, commit {p.commit}, {p.date}; copy bandwidth {p.copy_TBps:.2f} TB/s"))
ok = df[df.status == "ok"]
colors = {m: f"C{i}" for i, m in enumerate(sorted(ok.method.unique()))}  # one colour per entry
cells = [(dt, b, dec) for dt in ok.dtype.unique() for b in sorted(ok.batch.unique()) for dec in (False, True)]
fig, axes = plt.subplots(len(ok.dtype.unique()), 4, figsize=(16, 3.4 * len(ok.dtype.unique())), squeeze=False)
for ax, (dt, b, dec) in zip(axes.flat, cells):
    for m, g in ok[(ok.dtype == dt) & (ok.batch == b) & (ok.decay == dec)].groupby("method"):
        ax.plot(g.N, g.floor_ratio, marker="o", label=m, color=colors[m])
    ax.axhline(1.3, color="k", ls="--", lw=0.8, label="1.3× floor (target)")
    ax.set_ylim(bottom=1.0)  # the floor itself at the bottom, so the target line is always in view
    ax.set(xscale="log", yscale="log", xlabel="N", ylabel="time / floor (median)",
           title=f"{dt}, batch {b}, {'decay' if dec else '0-1 mask'}")
    ax.grid(alpha=0.3)
for row in axes:
    row[0].legend(fontsize=8)
fig.suptitle(f"Time over the memory floor on the {p.gpu} (copy {p.copy_TBps:.2f} TB/s), "
             f"commit {p.commit}")
fig.tight_layout()
for ext in ("png", "svg"):
    fig.savefig(os.path.join(fig_dir, f"floor.{ext}"), dpi=110)

# %%
t = F.targets(df)
display(Markdown(f"**Targets met: {(t.met == 'yes').sum()} of {(t.met != '-').sum()}** "
                 "(`-`: the fp32-contract path, reported without a target)"))
t

# %%
cols = ["dtype", "batch", "decay", "N", "method", "median_s", "floor_ratio", "vs_fla",
        "vs_original", "host_us", "graph_us", "first_call_s", "rel_error", "workspace_MB"]
ok[[c for c in cols if c in ok]].round(4)

# %% [markdown]
# The first call of a new shape: each entry's wall time for its first call in a cell (kernel
# compilation for a configuration new to the process, or flash-linear-attention's autotuning).

# %%
# (a floor.csv from before first_call_s was measured: the first-call run of its own, if any)
first_calls = ok if "first_call_s" in ok else T.load_measured(gpu, "floor_first_call.csv")
if first_calls is None:
    display(Markdown("No first-call times for this GPU: `make floor` measures them."))
else:
    q = first_calls.iloc[0]
    display(Markdown(f"First calls measured on the {q.gpu}, commit {q.commit}, {q.date}, each "
                     f"entry's first call in each cell of that run:"))
    display(first_calls.pivot_table(index="method", columns=["dtype", "batch", "N"],
                                    values="first_call_s").round(3))

# %%
disp = T.load_measured(gpu, "dispatch.csv")
if disp is None:
    display(Markdown(f"No `data/{gpu}/dispatch.csv`: run `make tune` on that GPU."))
else:
    display(Markdown(f"`method=auto`: regret against the best method per cell, max "
                     f"{disp.regret.max() * 100:.1f}%, median {disp.regret.median() * 100:.1f}% "
                     f"over {len(disp)} cells"))
    display(disp[["dtype", "batch", "decay", "N", "best", "best_s", "auto", "auto_s", "regret"]].round(5))

# %% [markdown]
# ## Conclusions (written from the data above)

# %%
lines = []
for target, g in t[t.met != "-"].groupby("target", sort=False):
    miss = g[g.met == "no"]
    lines.append(f"* **{target}**: met in {(g.met == 'yes').sum()} of {len(g)} cells"
                 + ("; missed: " + ", ".join(f"{r.dtype} b{r.batch} N={r.N} {'decay' if r.decay else '0-1'}"
                                              f" {r.value}" for r in miss.head(8).itertuples())
                    + (" …" if len(miss) > 8 else "") if len(miss) else "."))
short = ok[(ok.N <= F.GRAPH_N) & (ok.batch == 1)]
for m, g in short.groupby("method"):
    if "host_us" in g and g.host_us.notna().any():
        graph = g.graph_us.dropna() if "graph_us" in g else g.host_us.iloc[:0]
        lines.append(f"* {m}, batch 1, N ≤ {F.GRAPH_N}: eager host time {g.host_us.min():.0f}-"
                     f"{g.host_us.max():.0f} µs per call" + (
                         f"; a CUDA-graph replay of the same call takes {graph.min():.0f}-{graph.max():.0f} µs"
                         if len(graph) else "") + ".")
display(Markdown("\n".join(lines)))

