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
# # Table 9: FleetAttention vs FA_modify (Appendix D)
# FA_modify sums the ranks without synchronisation; the paper reports it at about half FA's time. Here also its error against the float64 oracle (it is wrong by design).

# %% tags=["parameters"]
batch_sizes = [1, 16]
decays = [False, True]
dtype = "float32"
seqlens = [128, 512, 2048, 8192, 12800, 25600, 100000]
reps = 15
device = "cuda"
gpu = None
time_limit = 60.0
heads = 32
rank = 128
dim = 128
error_shape = [1, 32, 4097, 128, 128]   # (batch, heads, N, r, d) of the accuracy check
out_root = None     # where tables and figures go; None: scratch/ of the checkout (make: RESULTS)

# %%
import os
import torch
from IPython.display import Markdown, display
from leetrepro.reproduce import tables as T, paper
live, gpu, data_dir, fig_dir = T.notebook_setup(device, gpu, out_root)
import pandas as pd
if live:
    frames = [T.measure(["FA", "FA_modify"], batch_size=b, decay=dec, dtype=dtype, seqlens=seqlens,
                        reps=reps, device=device, heads=heads, rank=rank, dim=dim, time_limit=time_limit)
              for b in batch_sizes for dec in decays]
    measured = pd.concat(frames, ignore_index=True)
    measured.to_csv(os.path.join(data_dir, "table9.csv"), index=False)
else:
    measured = T.load_measured(gpu, "table9.csv")
    if measured is None:
        k = T.load_measured(gpu, "kernels.csv")
        measured = k[k.method.isin(["FA", "FA_modify"]) & (k.dtype == dtype)].copy()
        display(Markdown(f"Source: `data/{gpu}/kernels.csv` (FA and FA_modify cells)."))
measured.groupby(["batch", "decay"]).size()

# %%
p = paper.load(9)
rows = []
for (b, dec), g in measured.groupby(["batch", "decay"]):
    s = T.side_by_side(g, p[(p.batch == b) & (p.decay == dec)])
    s.insert(0, "setting", f"bz {b}, {'decay' if dec else '0-1'}")
    rows.append(s)
both = pd.concat(rows)
display(both.pivot_table(index=["setting", "method"], columns="N", values="ours_cell", aggfunc="first"))
ratio = measured[measured.status == "ok"].pivot_table(index=["batch", "decay", "N"], columns="method", values="mean_s")
ratio["FA_modify / FA"] = ratio["FA_modify"] / ratio["FA"]
pratio = p.pivot_table(index=["batch", "decay", "N"], columns="method", values="mean_s")
ratio["paper: FA_modify / FA"] = pratio["FA_modify"] / pratio["FA"]
ratio

# %%
from leetrepro import causal_linear_decoder, reference, rel_error
if live:
    b, h, n, r, d = error_shape
    B, C, V = (torch.randn(b, h, n, k, device=device) / (r ** 0.5 if k == r else 1) for k in (r, r, d))
    ref = reference(B, C, V)
    errs = {m: rel_error(causal_linear_decoder(B, C, V, method=m), ref) for m in ("FA", "FA_modify")}
    display(Markdown(f"Relative error at {tuple(error_shape)}: " + ", ".join(f"{m} {e:.2e}" for m, e in errs.items())))
else:
    c = T.load_measured(gpu, "correctness.csv")
    if c is not None:
        display(c[c.abbr.isin(["FA", "FA_modify"])].groupby(["abbr", "batch", "N"]).rel_err.max().unstack("abbr"))

# %%
import matplotlib.pyplot as plt
fig, ax = plt.subplots(figsize=(7, 4))
for i, ((b, dec), g) in enumerate(ratio.reset_index().groupby(["batch", "decay"])):
    label = f"bz {b}, {'decay' if dec else '0-1'}"
    ax.plot(g.N, g["FA_modify / FA"], "o-", color=f"C{i}", label=f"{label} ({T.gpu_name(gpu)})")
    ax.plot(g.N, g["paper: FA_modify / FA"], "s--", mfc="none", color=f"C{i}",
            label=f"{label} (paper)")
ax.axhspan(0.35, 0.65, color="gray", alpha=0.15, label="'about half' (0.35-0.65)")
ax.set(xscale="log", xlabel="N", ylabel="FA_modify time / FA time (means)",
       title=f"Table 9 on {gpu}, beside the paper's ratios")
ax.legend(fontsize=6, ncol=2); fig.tight_layout()
T.stamp(fig, measured)
for ext in ("png", "svg"):
    fig.savefig(os.path.join(fig_dir, f"table9.{ext}"), dpi=120)

# %% [markdown]
# ## Conclusions (written from the data above)

# %%
r = ratio.reset_index()
lines = []
for (b, dec), g in r.groupby(["batch", "decay"]):
    inside = ((g["FA_modify / FA"] >= 0.35) & (g["FA_modify / FA"] <= 0.65)).sum()
    lines.append(f"* batch {b}, {'decay' if dec else '0-1 mask'}: FA_modify / FA from "
                 f"{g['FA_modify / FA'].min():.2f} to {g['FA_modify / FA'].max():.2f} here "
                 f"({inside} of {len(g)} N within 'about half', 0.35-0.65); the paper: "
                 f"{g['paper: FA_modify / FA'].min():.2f}-{g['paper: FA_modify / FA'].max():.2f}.")
display(Markdown("\n".join(lines) + "\n* FA_modify is wrong by design (its error is shown above): "
                 "its speed is bought with unsynchronised writes."))
