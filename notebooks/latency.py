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
# # Tables 3-6: latency of one attention layer
# Each method at heads 32, r = d = 128 over N = 128 … 100000 (Section 5.1): mean ± std of the timed calls after a warm-up (the count is printed from the data), `OOM` and `>limit` cells kept. The figure shows each method's speed-up over block-based (Bb) beside the paper's. Every cell shows the paper's A6000 number, ours and ours/paper; the fastest method per N is in bold.

# %% tags=["parameters"]
table = 3           # the paper's table to reproduce (3-6): sets batch size and mask
batch_size = None   # override the table's batch size
decay = None        # override the table's mask (True: exponential decay)
dtype = "float32"
seqlens = [128, 512, 2048, 8192, 12800, 25600, 100000]
methods = ["Vanilla", "Bb", "Cdotp", "Cdotp_torch", "FA", "FA_torch", "LA", "LA_torch", "Recur"]
reps = 15
device = "cuda"
gpu = None          # folder tag under data/ and figures/ (default: this GPU's, or h100 to re-render)
time_limit = 60.0   # seconds one call may take before the cell reads >limit
heads = 32
rank = 128
dim = 128
out_root = None     # where tables and figures go; None: scratch/ of the checkout (make: RESULTS)

# %%
import os
from IPython.display import Markdown, display
from leetrepro.reproduce import tables as T, paper
live, gpu, data_dir, fig_dir = T.notebook_setup(device, gpu, out_root)
bs, dec = T.TABLES[table]
batch_size = bs if batch_size is None else batch_size
decay = dec if decay is None else decay
name = f"table{table}"
if live:
    measured = T.measure(methods, batch_size=batch_size, decay=decay, dtype=dtype, seqlens=seqlens,
                         reps=reps, device=device, heads=heads, rank=rank, dim=dim, time_limit=time_limit)
    measured.to_csv(os.path.join(data_dir, f"{name}.csv"), index=False)
    source = f"measured now on {measured.gpu.iloc[0]}"
else:
    measured = T.load_measured(gpu, f"{name}.csv")
    source = f"data/{gpu}/{name}.csv"
    if measured is None:
        measured = T.from_kernel_bench(gpu, batch_size, decay, dtype)
        source = f"data/{gpu}/kernels.csv (the kernel benchmark: only the methods it covers)"
assert measured is not None, f"no measurement of {name} for {gpu}: run `make {name}` on that GPU"
measured = measured[measured.method.isin(methods)]
prov = measured.iloc[0]
display(Markdown(f"Source: {source}; GPU {prov.gpu}, dtype {prov['dtype']}, batch {batch_size}, "
                 f"{'decay' if decay else '0-1 mask'}, commit {prov.commit}, {prov.date}; "
                 f"mean ± std of {int(prov.reps)} timed calls per cell."))

# %%
both = T.side_by_side(measured, paper.load(table))
display(Markdown(f"**{T.gpu_words(gpu, live).capitalize()}** (mean ± std, s; fastest per N in bold)"))
display(T.styled(both))
display(Markdown(f"**Paper (A6000) | {T.gpu_name(gpu)} | ours/paper**"))
display(T.triple(both))

# %%
fig = T.plot_latency(measured, f"Table {table}: batch {batch_size}, {'decay' if decay else '0-1 mask'}, {prov['dtype']} ({prov.gpu})",
                     os.path.join(fig_dir, name), paper.load(table), gpu_label=T.gpu_name(gpu))

# %% [markdown]
# ## Conclusions (written from the data above)

# %%
ours_best, paper_best = T.fastest(both, "ours_s"), T.fastest(both, "paper_s")
same = [n for n in ours_best if paper_best.get(n) == ours_best[n]]
ratios = both.dropna(subset=["ratio"]).groupby("method").ratio.median().sort_values()
lines = ["* Fastest method per N here: " + ", ".join(f"N={n}: **{m}**" for n, m in sorted(ours_best.items()))
         + f"; the paper's fastest agrees at {len(same)} of {len(ours_best)} N.",
         "* Time relative to the paper's A6000 (median over N, per method): "
         + ", ".join(f"{m} {r:.2g}×" for m, r in ratios.items()) + ".",
         "* Cells that did not run here: "
         + (", ".join(f"{r.method} N={r.N} ({r.status})" for r in both[both.status.notna() & (both.status != "ok")].itertuples())
            or "none") + "."]
display(Markdown("\n".join(lines)))
