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
# # Sequence parallelism: measured on one host, modelled beyond it
# `causal_linear_decoder_sp` (`leetrepro/distributed.py`) cuts one sequence across the GPUs of a `torch.distributed` group. What one slice passes to the next is a state (heads × r × d, 2 MiB in fp32 at 32 heads, r = d = 128) and a decay λ^L, so the GPUs exchange one state each way (an all-gather in the forward, one in the backward), whatever N is. Each GPU pays one extra pass over its C and V (forward) and over its B and dO (backward): 6 tensor passes per GPU instead of 4 in the forward, 15 instead of 11 with the backward. That is the distributed floor every time below is divided by.
#
# The measurements come from `make bench-sp` (one `torchrun` job: `leetrepro/bench/sp.py`): batch 1, heads 32, r = d = 128, bf16, decay, Chunk on every slice, the single-GPU kernel on the whole sequence in the same job. Each time is the median of 10 steps of the slowest rank. The second half of the notebook models larger scales on paper from these numbers and a stated link bandwidth.

# %% tags=["parameters"]
tag = "h200x2"              # data/<tag>/sp.csv
out_root = None     # where tables and figures go; None: scratch/ of the checkout (make: RESULTS)
nvlink_GBps = 450.0         # per GPU and direction inside a host (NVLink 4: 18 links × 25 GB/s)
inter_host_GBps = 50.0      # per GPU across hosts (one 400 Gb/s InfiniBand NDR port per GPU)
step_latency_us = {"intra": 5.0, "inter": 15.0}  # per ring step of an all-gather (assumed)
gpus_per_host = 8
tokens_per_gpu = 1048576    # weak scaling of the model

# %%
import os
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from IPython.display import Markdown, display

from leetrepro.reproduce.tables import load_measured, output_root, readable_log, stamp
out_root = output_root(out_root)

fig_dir = os.path.join(out_root, "figures", tag)
os.makedirs(fig_dir, exist_ok=True)
fresh = os.path.join(out_root, "data", tag, "sp.csv")  # a run of make bench-sp into out_root
sp = pd.read_csv(fresh) if os.path.exists(fresh) else load_measured(tag, "sp.csv")
meta = sp.iloc[0]
display(Markdown(f"**{meta.gpu}**, {sp.gpus.max()} GPUs, commit `{meta.commit}`, {meta.date}, "
                 f"copy {meta.copy_TBps:.2f} TB/s; correctness check before timing (fp32, tf32x3, "
                 f"N = 65536): O, dB, dC, dV of the {sp.gpus.max()}-GPU run against one GPU, largest relative "
                 f"error **{meta.check_rel_err:.1e}**."))
cols = ["gpus", "N", "n_per_gpu", "pass", "ms", "floor_ms", "floor_ratio", "exchange_ms",
        "bytes_exchanged", "kv_bytes", "single_gpu_ms", "speedup_vs_single"]
sp[cols].round(3)

# %% [markdown]
# ## Time and distance to the floor

# %%
fig, axes = plt.subplots(1, 2, figsize=(11, 4))
main = sp[sp["pass"].isin(["fwd", "fwd_bwd"])]
for (gpus, pas), grp in main.groupby(["gpus", "pass"]):
    grp = grp.sort_values("n_per_gpu")
    style = "-o" if gpus > 1 else "--s"
    axes[0].plot(grp.N / 2 ** 20, grp.ms, style, label=f"{gpus} GPU{'s' * (gpus > 1)}, {pas}")
    axes[0].plot(grp.N / 2 ** 20, grp.floor_ms, ":", color=axes[0].lines[-1].get_color(), alpha=0.6)
    axes[1].plot(grp.N / 2 ** 20, grp.floor_ratio, style, label=f"{gpus} GPU{'s' * (gpus > 1)}, {pas}")
axes[0].set(xlabel="total N (Mi tokens)", ylabel="ms per step (dotted: floor)", xscale="log",
            yscale="log", title="time per step")
axes[1].set(xlabel="total N (Mi tokens)", ylabel="time ÷ floor", xscale="log",
            title="distance to the floor (per GPU)")
axes[1].axhline(1, color="gray", lw=0.8)
readable_log(axes[0], "y")
for ax in axes:
    ax.set_xscale("log")
    ax.set_xticks([1, 2, 4], ["1", "2", "4"])
    ax.xaxis.set_minor_locator(plt.NullLocator())
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
fig.suptitle(f"Sequence parallelism on {meta.gpu} (bf16, batch 1, 32 heads, r = d = 128, decay; medians)")
fig.tight_layout()
stamp(fig, sp)
fig.savefig(os.path.join(fig_dir, "scaling.png"), dpi=120)

# %%
two = main[main.gpus > 1]
P = int(two.gpus.max())
one_m = two[two.n_per_gpu == 2 ** 20].set_index("pass")
strong = two[two.N == 2 ** 20].set_index("pass")
single = main[main.gpus == 1].set_index(["N", "pass"]).floor_ratio
display(Markdown(
    f"* Exchange: **{one_m.loc['fwd', 'exchange_ms']:.3f} ms** per all-gather (each GPU receives {P - 1} state{'s' * (P > 2)} of 2 MiB), "
    f"{100 * one_m.loc['fwd_bwd', 'exchange_ms'] / one_m.loc['fwd_bwd', 'ms']:.2f} % of a forward + "
    f"backward step at 1 Mi tokens per GPU. Bytes a GPU receives per step do not grow with N "
    f"({two.bytes_exchanged.min() / 2**20:.1f}-{two.bytes_exchanged.max() / 2**20:.1f} MiB at every N), "
    f"where gathering K and V would move {two.kv_bytes.min() / 2**30:.0f}-{two.kv_bytes.max() / 2**30:.0f} GiB.\n"
    f"* Strong scaling at N = 1 Mi on {P} GPUs: forward **{strong.loc['fwd', 'speedup_vs_single']:.2f}×** "
    f"(the design's ceiling from passes, 4 on one GPU against 6 on each of P: 4·P/6 = {4 * P / 6:.2f}×), "
    f"forward + backward **{strong.loc['fwd_bwd', 'speedup_vs_single']:.2f}×** ({strong.loc['fwd_bwd', 'single_gpu_ms']:.1f} ms "
    f"on one GPU, {strong.loc['fwd_bwd', 'ms']:.1f} ms on {P}; ceiling 11·P/15 = {11 * P / 15:.2f}×). "
    f"A ratio above its ceiling means the single-GPU kernel is further from its floor than the slices are "
    f"(its backward makes 14 passes, not 11); a better single-GPU kernel lowers the ratio.\n"
    f"* Distance to the distributed floor at 1 Mi tokens per GPU: forward "
    f"**{one_m.loc['fwd', 'floor_ratio']:.2f}×**, forward + backward **{one_m.loc['fwd_bwd', 'floor_ratio']:.2f}×**. "
    f"The single-GPU kernel at N = 1 Mi on the same GPU is as far from its own floor "
    f"({single.get((2 ** 20, 'fwd'), np.nan):.2f}× forward, {single.get((2 ** 20, 'fwd_bwd'), np.nan):.2f}× with the backward): "
    f"what separates the distributed run from its floor is the batch-1 kernel, not the exchange."))
longest = sp[sp["pass"] == "fwd_bwd_longest"]
if len(longest):
    L = longest.iloc[0]
    display(Markdown(f"* Longest sequence trained (forward + backward) on the {L.gpus} GPUs: "
                     f"**N = {L.N:,}** ({L.N / 2**20:.2f} Mi tokens), {L.ms:.0f} ms per step, "
                     f"peak {L.peak_GiB:.0f} GiB per GPU (the eight tensors B, C, V, O, dO, dB, dC, dV "
                     f"of a {L.n_per_gpu / 2**20:.3g} Mi-token slice); the longest the memory estimate "
                     f"allowed among 3 Mi down to 1/2 Mi tokens per GPU in steps of 1/8 Mi."))

# %% [markdown]
# ## Larger scales, on paper
# Weak scaling at a fixed number of tokens per GPU: each GPU's local work is what it is on two GPUs (measured above, less its exchanges), and the two all-gathers grow with the number of GPUs P. A ring all-gather of P states of s bytes takes (P − 1)·(s / link bandwidth + one step's latency); across hosts the slowest link sets the pace. Bandwidths and per-step latencies are the parameters above (assumptions, not measurements); the two-GPU all-gather measured here is dominated by its fixed cost, which the model keeps as a floor.
#
# The states combine linearly, which keys and values do not: a host can first reduce its eight states to one (the decayed sum the next host needs), so across hosts only one state per host has to travel (hierarchical exchange, the third column).

# %%
state = 32 * 128 * 128 * 4
local_ms = np.interp(tokens_per_gpu, two[two["pass"] == "fwd_bwd"].n_per_gpu,
                     two[two["pass"] == "fwd_bwd"].ms - two[two["pass"] == "fwd_bwd"].exchange_ms)
measured_ag = one_m.loc["fwd", "exchange_ms"]


def allgather_ms(p, per_host=gpus_per_host, hierarchical=False):
    if p <= 1:
        return 0.0
    intra = min(p, per_host) - 1
    t = intra * (state / (nvlink_GBps * 1e9) * 1e3 + step_latency_us["intra"] / 1e3)
    hosts = -(-p // per_host)
    inter = hosts - 1 if hierarchical else (p - min(p, per_host))
    t += inter * (state / (inter_host_GBps * 1e9) * 1e3 + step_latency_us["inter"] / 1e3)
    return max(t, measured_ag)


def share(p, hierarchical=False):
    """The model's exchange (two all-gathers) as a fraction of a forward + backward step."""
    x = 2 * allgather_ms(p, hierarchical=hierarchical)
    return x / (local_ms + x)


def finish_share_plot(fig, ax, title, name, rows=None):
    ax.set(xscale="log", yscale="log", xlabel="GPUs", ylabel="exchange, % of a step", title=title)
    readable_log(ax, "both")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    stamp(fig, sp if rows is None else rows)
    fig.savefig(os.path.join(fig_dir, name), dpi=120)


rows = []
for p in [2, 8, 64, 512]:
    flat, hier = 2 * allgather_ms(p), 2 * allgather_ms(p, hierarchical=True)
    rows.append(dict(GPUs=p, hosts=-(-p // gpus_per_host), N_total=f"{p * tokens_per_gpu / 2**20:.0f} Mi",
                     local_ms=local_ms, exchange_ms=flat, exchange_share=flat / (local_ms + flat),
                     hierarchical_exchange_ms=hier, hierarchical_share=hier / (local_ms + hier),
                     gathered_states_MiB=p * state / 2**20))
model = pd.DataFrame(rows)
display(model.round(3))
free_until = next((p for p in range(2, 4097) if share(p) > 0.05), None)
display(Markdown(
    f"At {tokens_per_gpu / 2**20:.0f} Mi tokens per GPU ({local_ms:.0f} ms of local forward + backward), "
    f"the flat all-gather of states stays under 5 % of a step up to about **{free_until} GPUs** "
    f"with {inter_host_GBps:.0f} GB/s between hosts; at 512 GPUs it is "
    f"{100 * model.exchange_share.iloc[-1]:.0f} % of the step, and every GPU holds {model.gathered_states_MiB.iloc[-1]:.0f} MiB of "
    f"gathered states. Reducing inside each host first keeps it at "
    f"{100 * model.hierarchical_share.iloc[-1]:.1f} % at 512 GPUs. Measured host sizes are in the next "
    f"section; the rest is this model."))

fig, ax = plt.subplots(figsize=(6, 3.6))
ps = np.unique(np.geomspace(2, 1024, 40).astype(int))
ax.plot(ps, [100 * share(p) for p in ps], label="flat all-gather")
ax.plot(ps, [100 * share(p, hierarchical=True) for p in ps], label="reduced inside each host first")
ax.axhline(5, color="gray", ls=":", lw=1, label="5 % of a step")
ax.scatter([P], [100 * 2 * measured_ag / (local_ms + 2 * measured_ag)], color="k", zorder=3,
           label=f"measured ({P} GPUs)")
finish_share_plot(fig, ax, f"Model: {tokens_per_gpu / 2**20:.0f} Mi tokens per GPU, fwd + bwd",
                  "scaling_model.png")

# %% [markdown]
# ## Every measured host size beside the model
# All runs of `make bench-sp` on one GPU model (`data/<gpu>x<P>/sp.csv`, one per host size P): per size, the forward + backward step at 1 Mi tokens per GPU, its exchange and the exchange's share of the step (measured), next to the flat all-gather model above.

# %%
import glob
from leetrepro import _paths

base = tag.rsplit("x", 1)[0]
runs = {}
for path in sorted(glob.glob(os.path.join(_paths.resource("data"), f"{base}x*", "sp.csv"))):
    runs[os.path.basename(os.path.dirname(path))] = pd.read_csv(path)
runs[tag] = sp  # this tag as read above (a fresh run into out_root, else the committed one)


def cell(d, pas, **where):
    """The row of a run's multi-GPU ``pas`` step where ``where`` holds, or None."""
    x = d[(d["pass"] == pas) & (d.gpus > 1)]
    for k, v in where.items():
        x = x[x[k] == v]
    return x.iloc[0] if len(x) else None


rows = []
for t, d in sorted(runs.items(), key=lambda kv: kv[1].gpus.max()):
    r = cell(d, "fwd_bwd", n_per_gpu=2 ** 20)
    if r is not None:
        rows.append(dict(tag=t, GPUs=int(r.gpus), commit=r.commit, ms=r.ms, exchange_ms=r.exchange_ms,
                         exchange_share=r.exchange_ms / r.ms, floor_ratio=r.floor_ratio,
                         model_share=share(int(r.gpus))))
sizes = pd.DataFrame(rows)
display(sizes.round(4))
fig, ax = plt.subplots(figsize=(6, 3.6))
ax.plot(ps, [100 * share(p) for p in ps], label="model: flat all-gather")
ax.scatter(sizes.GPUs, 100 * sizes.exchange_share, color="k", zorder=3, label="measured")
finish_share_plot(fig, ax, f"{meta.gpu}: measured host sizes ({', '.join(sizes.tag)})", "scaling_sizes.png",
                  pd.concat(runs.values(), ignore_index=True))
display(Markdown(f"Measured host sizes: {', '.join(f'{g} GPUs' for g in sizes.GPUs)}"
                 + ("; the larger sizes need their own runs (`make bench-sp` on a host with more GPUs)."
                    if sizes.GPUs.max() < gpus_per_host else ".")))


# %% [markdown]
# ## Weak and strong scaling across host sizes
# **Weak scaling**: the step at the same tokens per GPU (512 Ki and 1 Mi) on P GPUs against two; the exchange is a few MiB per GPU whatever N is, so the step should grow by at most 5 % from 2 to P GPUs. The flat all-gather model above predicts the growth from its exchange alone. **Strong scaling**: the same N on P GPUs against the single-GPU kernel on the whole sequence (N = 1 Mi), beside the design's ceiling from its passes (forward 4 on one GPU against 6 on each of P: 4·P/6; forward + backward 11 against 15: 11·P/15); and at N = 4 Mi, which one GPU cannot hold, P GPUs against two (ideal P/2). Every sentence below is computed from the runs present; a host size not run says so.

# %%
WEAK_TARGET = 0.05      # largest growth of a step from 2 GPUs at the same tokens per GPU
CEILING = {"fwd": lambda p: 4 * p / 6, "fwd_bwd": lambda p: 11 * p / 15}


def model_growth(p):
    """The model's growth of a forward + backward step from 2 to p GPUs at the same tokens per GPU."""
    return (local_ms + 2 * allgather_ms(p)) / (local_ms + 2 * allgather_ms(2)) - 1


def ms_of(p, pas, **where):
    d = runs_by_p.get(p)
    c = cell(d, pas, **where) if d is not None else None
    return c.ms if c is not None else np.nan


runs_by_p = {int(d.gpus.max()): d for _, d in sorted(runs.items(), key=lambda kv: kv[1].gpus.max())}
rows = []
for p, d in runs_by_p.items():
    row = dict(GPUs=p, tag=next(t for t, x in runs.items() if x is d), commit=d.commit.iloc[0])
    for per in (2 ** 19, 2 ** 20):
        for pas in ("fwd", "fwd_bwd"):
            c = cell(d, pas, n_per_gpu=per)
            row[f"{pas} ms, {per // 1024} Ki/GPU"] = c.ms if c is not None else np.nan
            row[f"{pas} ÷ floor, {per // 1024} Ki/GPU"] = c.floor_ratio if c is not None else np.nan
    for pas in ("fwd", "fwd_bwd"):
        s_ = cell(d, pas, N=2 ** 20)
        row[f"{pas} speed-up at N = 1 Mi"] = s_.speedup_vs_single if s_ is not None else np.nan
        row[f"{pas} ceiling"] = CEILING[pas](p)
    row["fwd speed-up over 2 GPUs at N = 4 Mi"] = ms_of(2, "fwd", N=2 ** 22) / ms_of(p, "fwd", N=2 ** 22)
    lo = cell(d, "fwd_bwd_longest")
    row["longest N trained"] = int(lo.N) if lo is not None else np.nan
    row["its ms"] = lo.ms if lo is not None else np.nan
    rows.append(row)
scaling = pd.DataFrame(rows).set_index("GPUs")
for per in ("512 Ki", "1024 Ki"):
    for pas in ("fwd", "fwd_bwd"):
        col = f"{pas} ms, {per}/GPU"
        scaling[f"{pas} growth from 2 GPUs, {per}/GPU"] = scaling[col] / scaling[col].get(2, np.nan) - 1
scaling["model growth"] = [model_growth(p) for p in scaling.index]
display(scaling.round(3).T)

lines = []
for p in (4, 8):
    if p not in scaling.index:
        lines.append(f"* **{p} GPUs**: not run (`make bench-sp GPUS={p}` on a host with {p} GPUs); "
                     f"weak scaling (≤ {100 * WEAK_TARGET:.0f} % growth from two GPUs) is not judged.")
        continue
    r = scaling.loc[p]
    growths = [r[f"{pas} growth from 2 GPUs, {per}/GPU"] for per in ("512 Ki", "1024 Ki") for pas in ("fwd", "fwd_bwd")]
    worst = np.nanmax(growths) if not np.all(np.isnan(growths)) else np.nan
    lines.append(
        f"* **{p} GPUs**: weak scaling, the step grows by at most **{100 * worst:+.1f} %** from two GPUs at "
        f"512 Ki and 1 Mi tokens per GPU (forward and forward + backward; target ≤ {100 * WEAK_TARGET:.0f} %: "
        f"{'met' if worst <= WEAK_TARGET else 'missed'}; the model predicts {100 * r['model growth']:+.1f} % "
        f"for forward + backward). Strong scaling at N = 1 Mi: forward **{r['fwd speed-up at N = 1 Mi']:.2f}×** "
        f"(ceiling {r['fwd ceiling']:.2f}×), forward + backward **{r['fwd_bwd speed-up at N = 1 Mi']:.2f}×** "
        f"(ceiling {r['fwd_bwd ceiling']:.2f}×); at N = 4 Mi the forward on {p} GPUs is "
        f"**{r['fwd speed-up over 2 GPUs at N = 4 Mi']:.2f}×** the two-GPU run (ideal {p / 2:.0f}×). "
        f"Distance to the floor at 1 Mi tokens per GPU: forward {r['fwd ÷ floor, 1024 Ki/GPU']:.2f}×, "
        f"forward + backward {r['fwd_bwd ÷ floor, 1024 Ki/GPU']:.2f}×"
        + (f"; longest sequence trained N = {r['longest N trained']:,.0f} ({r['longest N trained'] / 2**20:.2f} Mi) "
           f"in {r['its ms']:.0f} ms" if not np.isnan(r["longest N trained"]) else "") + ".")
display(Markdown("\n".join(lines)))

fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
two_ms = scaling["fwd_bwd ms, 1024 Ki/GPU"].get(2, np.nan)
for pas, mark in (("fwd_bwd", "-o"), ("fwd", "-s")):
    for per in ("512 Ki", "1024 Ki"):
        axes[0].plot(scaling.index, scaling[f"{pas} ms, {per}/GPU"], mark, label=f"{pas}, {per} per GPU")
if not np.isnan(two_ms):
    model_ps = [2, 4, 8]
    axes[0].plot(model_ps, [two_ms * (1 + model_growth(p)) for p in model_ps], ":", color="k",
                 label="model (fwd + bwd, 1 Mi)")
    axes[0].plot(model_ps[1:], [two_ms * (1 + WEAK_TARGET)] * 2, "v", color="gray",
                 label="target: the most it may take (1 Mi)")
axes[0].set(xlabel="GPUs", ylabel="ms per step", title="weak scaling: same tokens per GPU", ylim=(0, None))
ps_s = np.array([2, 4, 8])
for pas, color in (("fwd", "C0"), ("fwd_bwd", "C1")):
    axes[1].plot(ps_s, CEILING[pas](ps_s), ":", color=color, label=f"ceiling, {pas}")
    axes[1].plot(scaling.index, scaling[f"{pas} speed-up at N = 1 Mi"], "-o", color=color,
                 label=f"measured, {pas}")
axes[1].set(xlabel="GPUs", ylabel="speed-up over one GPU", title="strong scaling: N = 1 Mi")
for ax in axes:
    ax.set_xticks([2, 4, 8])
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
fig.suptitle(f"{meta.gpu}, bf16, batch 1, 32 heads, r = d = 128, decay (medians of the slowest rank)")
fig.tight_layout()
stamp(fig, pd.concat(runs.values(), ignore_index=True))
fig.savefig(os.path.join(fig_dir, "scaling_sizes_weak_strong.png"), dpi=120)
