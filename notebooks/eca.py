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
# # Exact Causal Attention: 10 % fewer multiplications, and what they buy
# Rybin et al. compute the two triangular products of causal attention, `S = Mask(Q Kᵀ)` and `O = P V`, with Strassen-style identities: 24 full and 10 half block products of `L/4 × d/4` blocks where the standard algorithm needs 32 (its lower triangle), so `29/64·L²d` multiplications against `L²d/2` (−9.4 %), and `4/9·L²d` (−11.1 %) when the half products recurse. In this project they are the method `ECA` (`leetrepro/methods/eca.py`, written from Algorithms 1-2): the operator's `S = Mask(B Cᵀ)` by Algorithm 1, the decay applied between the stages, `O = P V` by Algorithm 2, and a backward of five such products.
#
# Here: the identities checked in exact integer arithmetic; the multiplications counted by running the algorithms, against the paper's formulas; the rounding error against float64 per dtype; the time against the standard products on this machine's CPU (where the paper expects the fewer multiplications to pay) and on the GPUs (where it expects no gain: the block products are materialised); the paper's claims judged per machine.

# %% tags=["parameters"]
seqlens = [1024, 2048, 4096, 8192, 16384]   # the CPU sweep over N (one head, r and d 64, fp32)
reps = 3
count_seqlens = [1024, 4096, 16384]
count_depths = [0, 1, 2]
exact_sizes = [[16, 8, 0], [64, 16, 0], [256, 64, 0], [64, 16, 1], [256, 64, 2]]   # (n, k, depth)
stages = True       # each stage alone at large d on the CPU (STAGE_SHAPES: tens of seconds)
error_shape = [1024, 4]   # N and heads of the error comparison (r and d 64)
gpus = None         # GPU folders under data/ to show (None: every one with eca.csv)
measure_gpu = True  # a GPU on this machine: measure it now (bench.related) instead of reading data/
out_root = None     # where tables and figures go; None: scratch/ of the checkout (make: RESULTS)

# %%
import os
import numpy as np
import pandas as pd
import torch
import matplotlib.pyplot as plt
from IPython.display import Markdown, display
from leetrepro.methods import eca
from leetrepro.bench import related as R
from leetrepro.bench.harness import provenance
from leetrepro.reproduce import other_papers as O
from leetrepro.reproduce.tables import stamp
from leetrepro._paths import data as committed
out_root, fig_dir, cpu_dir, live_gpu, gpus = O.notebook_machines("eca", "eca.csv", gpus, measure_gpu, out_root)

# %% [markdown]
# ## The identities, in exact arithmetic
# int64 inputs have no rounding: equal outputs mean the identities hold. Stage I against `tril(X Yᵀ)`, Stage II against `P W` with P lower-triangular, the backward's upper-triangular products (`Pᵀ dO`, `dSᵀ B`: Algorithm 2 on reversed rows and columns) against `Pᵀ W`.

# %%
rows = []
for n, k, depth in exact_sizes:
    g = torch.Generator().manual_seed(n + k + depth)
    x, y, w = (torch.randint(-9, 10, (2, n, k), generator=g) for _ in range(3))
    p = torch.tril(torch.randint(-9, 10, (2, n, n), generator=g))
    rows.append(dict(n=n, k=k, depth=depth,
                     stage_I=torch.equal(eca.stage1(x, y, depth), torch.tril(x @ y.transpose(-1, -2))),
                     stage_II=torch.equal(eca.stage2(p, w, depth), p @ w),
                     upper=torch.equal(eca.upper_times(p.transpose(-1, -2), w, depth), p.transpose(-1, -2) @ w)))
exact_df = pd.DataFrame(rows)
exact = bool(exact_df[["stage_I", "stage_II", "upper"]].all().all())
display(exact_df)
display(Markdown(f"**Exact: {exact}** ({len(exact_df)} sizes, both stages and the transposed form)."))

# %% [markdown]
# ## The multiplications, counted
# `eca.operation_count` runs the same code on tensors without data (PyTorch's `meta` device) and tallies each block product where it is made: `counted` counts a half product as half a full one (the paper's convention), `exact_with_diagonals` counts the entries a half product needs, diagonal included, against the standard algorithm's `N(N+1)/2 · r`; `performed` is what the matrix multiplications ran (a half product's leaves of 64 rows are computed whole).

# %%
counts = O.eca_counts(count_seqlens, r=128, depths=count_depths)
display(counts[["stage", "N", "depth", "full_products", "half_products", "counted_over_N2r",
                "paper_over_N2r", "equal", "exact_vs_standard", "performed_vs_standard"]]
        .style.format({"counted_over_N2r": "{:.6f}", "paper_over_N2r": "{:.6f}",
                       "exact_vs_standard": "{:.4f}", "performed_vs_standard": "{:.4f}"}))
fig, ax = plt.subplots(figsize=(6, 3.2))
depth_axis = np.arange(0, 6)
ax.plot(depth_axis, [float(eca.paper_fraction(d)) for d in depth_axis], "o-", label="paper: 24/64 + 10/64·c per level")
ax.plot(counts.depth, counts.counted_over_N2r, "x", ms=10, color="C3", label="counted (this code, every N, both stages)")
ax.axhline(0.5, color="k", lw=0.8, ls="--", label="standard: L²d/2")
ax.axhline(4 / 9, color="C2", lw=0.8, ls=":", label="4/9 (the limit)")
ax.set(xlabel="recursion depth", ylabel="multiplications / (N² r)", title="ECA's multiplication count")
ax.legend(fontsize=7); ax.grid(alpha=0.3); fig.tight_layout()
for ext in ("png", "svg"):
    fig.savefig(os.path.join(fig_dir, f"eca_counts.{ext}"), dpi=120)

# %% [markdown]
# ## Rounding error against float64, per dtype
# N = 1024, 4 heads, r = d = 64 (`error_shape`). `accumulate`: the method as it ships (half-precision inputs upcast to float32 for the block sums and products, as every PyTorch method of the project does): within the accuracy contract. `in-dtype`: every block sum and product rounded to the dtype, the paper's Tables 3-4 setting (their L = 4096, d = 128 numbers beside).

# %%
errors_cpu = R.frame(R.measure_eca_errors(torch.device("cpu"), n=error_shape[0], heads=error_shape[1]), "cpu")
errors_cpu.to_csv(os.path.join(cpu_dir, "eca_errors.csv"), index=False)
show = errors_cpu[errors_cpu.status == "ok"].pivot_table(index=["arithmetic", "dtype"], columns="entry",
                                                         values=["rel_error", "max_abs_error"])
display(show.style.format("{:.2e}"))
paper_err = pd.read_csv(committed("paper", O.PAPER_ERRORS))
display(Markdown("The paper's Tables 3 (Stage I) and 4 (the whole product), max |error| (mean |error|):"))
display(paper_err.assign(cell=lambda d: d.max_abs_error.map("{:.1e}".format) + " (" + d.mean_abs_error.map("{:.1e}".format) + ")")
        .pivot_table(index=["table", "dtype"], columns="entry", values="cell", aggfunc="first"))

# %% [markdown]
# ## Time: this CPU, and the GPUs
# Forward, 0-1 mask, fp32, one head, r = d = 64 (the operator's head shapes), medians of interleaved rounds: `ECA` (depth 0 and 1), `standard` (the lower-triangular products computed directly, halving down to 64-row leaves: the paper's `L²d/2`), `Vanilla` (the full products, the upper triangle masked: what `torch.matmul(...).tril_()` does). Then each stage alone at large d, where the block products are compute-bound (the paper's Tables 1-2 shapes on a GPU; smaller on the CPU).

# %%
times = {"cpu": R.frame(R.measure_eca(torch.device("cpu"), seqlens, reps=reps), "cpu")}
times["cpu"].to_csv(os.path.join(cpu_dir, "eca.csv"), index=False)
stage_times = {}
if stages:
    stage_times["cpu"] = R.frame(R.measure_eca_stages(torch.device("cpu"), reps=reps), "cpu")
    stage_times["cpu"].to_csv(os.path.join(cpu_dir, "eca_stages.csv"), index=False)
error_tables = {"cpu": errors_cpu}
for g in gpus:
    times[g], stage_times[g], error_tables[g] = O.gpu_tables(
        g, g == live_gpu, out_root, ["eca"], ["eca.csv", "eca_stages.csv", "eca_errors.csv"])

machines = list(times)
fig, axes = plt.subplots(1, len(machines), figsize=(4.6 * len(machines), 3.6), squeeze=False)
for ax, m in zip(axes[0], machines):
    t = times[m][times[m].status == "ok"]
    for i, (entry, g) in enumerate(t.groupby("entry", sort=False)):
        ax.plot(g.N, g.median_s * 1e3, "o-", label=entry, color=f"C{i}")
    ax.set(xscale="log", yscale="log", xlabel="N", ylabel="ms (median)",
           title=f"{t.gpu.iloc[0]}" + (f", {int(t.threads.iloc[0])} threads" if "threads" in t else ""))
    # (upper left: the curves rise to the right, where the slowest entries' points are)
    ax.grid(alpha=0.3); ax.legend(fontsize=7, loc="upper left")
fig.suptitle("ECA against the standard products (forward, r = d = 64, fp32)")
fig.tight_layout()
stamp(fig, pd.concat(times.values()))
for ext in ("png", "svg"):
    fig.savefig(os.path.join(fig_dir, f"eca_time.{ext}"), dpi=120)

# %%
wide = pd.concat([t.assign(machine=m) for m, t in times.items()])
wide = wide[wide.status == "ok"].pivot_table(index=["machine", "N"], columns="entry", values="median_s")
wide["ECA ÷ standard"] = wide["ECA"] / wide["standard"]
wide["ECA ÷ Vanilla"] = wide["ECA"] / wide["Vanilla"]
display(wide.style.format({c: "{:.2f}" for c in ("ECA ÷ standard", "ECA ÷ Vanilla")} |
                          {c: "{:.3e}" for c in wide.columns if "÷" not in c}))
if stage_times:
    st = pd.concat([t.assign(machine=m) for m, t in stage_times.items() if t is not None])
    st = st[st.status == "ok"].pivot_table(index=["machine", "stage", "L", "d"], columns="entry", values="median_s") * 1e3
    paper_t = pd.read_csv(committed("paper", O.PAPER_TIMES)).pivot_table(index=["stage", "L", "d"], columns="entry", values="mean_ms")
    display(Markdown("Each stage alone, ms (the paper's RTX 4090, fp32, mean of 400 runs, below):"))
    display(st.round(2)); display(paper_t)

# %% [markdown]
# ## The paper's claims, per machine
# `supported`: the data show it; `inconclusive`: they straddle it or the difference is within the noise (1 %); `not shown`: they go against it. A claim of speed is judged against the faster of the two standard forms at each N.

# %%
pd.set_option("display.max_colwidth", 400)
verdicts = []
for m in machines:
    c = O.eca_claims(counts, exact, error_tables.get(m), times[m], stage_times.get(m), machine=m,
                     run=provenance("cpu"))
    where = cpu_dir if m == "cpu" else os.path.join(out_root, "data", m)
    os.makedirs(where, exist_ok=True)
    c.to_csv(os.path.join(where, "eca_claims.csv"), index=False)
    verdicts.append(c.assign(machine=m))
verdicts = pd.concat(verdicts, ignore_index=True)
display(verdicts[["machine", "claim", "source", "holds", "evidence"]])
