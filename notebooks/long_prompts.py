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
# # Long prompts: the companion paper's Figure 2
# Speed-up over torch's scaled-dot-product attention (softmax, flash kernels: it runs at every N) for N = 1k … 512k (batch 1, heads 32, d = r = 128), medians, and peak memory per method.

# %% tags=["parameters"]
seqlens = [1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144, 524288]
methods = ["Vanilla", "Bb", "Cdotp", "Cdotp_torch", "FA", "LA", "Recur"]
dtype = "float16"
reps = 8
device = "cuda"
gpu = None
time_limit = 30.0
heads = 32
rank = 128
dim = 128
out_root = None     # where tables and figures go; None: scratch/ of the checkout (make: RESULTS)

# %%
import os
import torch
from IPython.display import Markdown, display
from leetrepro.reproduce import tables as T
live, gpu, data_dir, fig_dir = T.notebook_setup(device, gpu, out_root)
import pandas as pd
from leetrepro.bench import benchmark_method


def softmax(B, C, V, g):  # the baseline: causal softmax attention (PyTorch SDPA); it has no decay
    return torch.nn.functional.scaled_dot_product_attention(B, C, V, is_causal=True)


softmax.__name__ = "SDPA (softmax)"  # its name in the progress bars and the table
if live:
    measured = T.measure(methods, batch_size=1, decay=False, dtype=dtype, seqlens=seqlens, reps=reps,
                         device=device, heads=heads, rank=rank, dim=dim, time_limit=time_limit)
    sdpa = benchmark_method(softmax, device=device, dtype=dtype, seqlens=seqlens, heads=heads, rank=rank, dim=dim,
                            reps=reps, time_limit=time_limit)
    from leetrepro.bench import provenance
    sdpa = sdpa.assign(**provenance(device))  # the same run's GPU, commit and date
    measured = pd.concat([measured, sdpa], ignore_index=True)
    measured.to_csv(os.path.join(data_dir, "long_prompts.csv"), index=False)
else:
    measured = T.load_measured(gpu, "long_prompts.csv")
    if measured is None:
        display(Markdown(f"**No `data/{gpu}/long_prompts.csv` yet: run `make long-prompts` on that GPU. "
                         f"Nothing to show.**"))
ok = None if measured is None else measured[measured.status == "ok"]
if ok is not None:
    t = ok.pivot_table(index="N", columns="method", values="median_s")
    display(measured.pivot_table(index="method", columns="N", values="cell", aggfunc="first"))
    if "Vanilla" in t:
        display(Markdown("Speed-up over Vanilla:"))
        display(t.rdiv(t["Vanilla"], axis=0))

# %%
import matplotlib.pyplot as plt
fig, axes = plt.subplots(1, 2, figsize=(11, 4))
base = "SDPA (softmax)"
colors = {} if ok is None else {m: f"C{i}" for i, m in enumerate(sorted(ok.method.unique()))}
if ok is not None and base in set(ok.method):
    # the claim is about speed-up: each method against softmax attention (flash), which runs at every N
    ref = ok[ok.method == base].set_index("N").median_s
    for m, g in ok[ok.method != base].groupby("method"):
        g = g[g.N.isin(ref.index)]
        axes[0].plot(g.N, ref.loc[g.N].to_numpy() / g.median_s.to_numpy(), marker="o", label=m,
                     color=colors[m])
    axes[0].axhline(1, color="k", lw=0.8, ls=":", label="as fast as softmax (SDPA)")
    axes[0].set(ylabel="speed-up over softmax attention (SDPA), medians")
else:
    for m, g in ([] if ok is None else ok.groupby("method")):
        axes[0].plot(g.N, g.median_s, marker="o", label=m, color=colors[m])
    axes[0].set(ylabel="latency (s), medians")
for m, g in ([] if ok is None else ok.groupby("method")):
    axes[1].plot(g.N, g.peak_mem_GB, marker="o", label=m, color=colors[m])
axes[0].set(xscale="log", yscale="log", xlabel="N", title=f"batch 1, heads {heads}, {dtype}")
mem_known = ok is not None and ok.peak_mem_GB.notna().any()   # peak memory is measured on CUDA only
axes[1].set(xscale="log", yscale="log" if mem_known else "linear", xlabel="N", title="peak memory",
            ylabel="peak memory (GB)" if mem_known else "peak memory (CUDA only: not measured here)")
for a in axes:
    a.grid(alpha=0.3)
    a.legend(fontsize=7)
fig.tight_layout()
if measured is not None:
    T.stamp(fig, measured)
for ext in ("png", "svg"):
    fig.savefig(os.path.join(fig_dir, f"long_prompts.{ext}"), dpi=120)

# %% [markdown]
# ## Conclusions (written from the data above)

# %%
if ok is not None and base in set(ok.method):
    ref = ok[ok.method == base].set_index("N").median_s
    lines = []
    for m, g in ok[ok.method != base].groupby("method"):
        g = g[g.N.isin(ref.index)]  # where softmax ran too
        s = ref.loc[g.N].to_numpy() / g.median_s.to_numpy()
        faster = g.N[s > 1]
        lines.append(f"* **{m}**: {s.min():.2g}× to {s.max():.2g}× softmax's speed over N = "
                     f"{g.N.min():,} … {g.N.max():,}; "
                     + (f"faster than softmax from N = {faster.min():,}" if len(faster) else
                        "never faster than softmax here") + ".")
    longest = ok.groupby("method").N.max()
    lines.append("* Longest N that ran: " + ", ".join(f"{m} {n:,}" for m, n in longest.items()) + ".")
    display(Markdown("\n".join(lines)))
