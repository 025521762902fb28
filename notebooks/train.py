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
# # Training a byte-level language model with every method
# A small causal language model made of the TransNormerLLM decoder layers of Table 7 (LRPE on the first layer, per-head decays), trained on the source files of Python's standard library (bytes as tokens; nothing is downloaded), once per attention method from the same seeded weights over the same seeded batches. Gradients flow through `causal_linear_decoder` (the custom op and its backward, `leetrepro.ops`); `original` is the model's own PyTorch block loop (plain autograd); `fla` is flash-linear-attention's `chunk_simple_gla` with its own backward, where installed. The loss curves should lie on each other; the table gives each method's throughput. `mamba2` is another model on the same data and batches: Mamba-2 mixers (per-token gates, `leetrepro.models.Mamba2Block`) in place of the TransNormer layers, its curve its own; `mamba3` likewise with Mamba-3 mixers (`leetrepro.models.Mamba3Block`).

# %% tags=["parameters"]
methods = ["Chunk", "LA", "Cdotp", "LA_torch", "Bb", "original", "fla", "mamba2", "mamba3"]
steps = 300
batch = 16
seq_len = 1024
dim = 512
layers = 4
heads = 8
lr = 2e-3
device = "cuda"
gpu = None           # folder tag under data/ and figures/ (default: this GPU's)
corpus_bytes = 33554432
log_every = 10
out_root = None     # where tables and figures go; None: scratch/ of the checkout (make: RESULTS)

# %%
import os
import matplotlib.pyplot as plt
import pandas as pd
from IPython.display import Markdown, display
from leetrepro.bench.lm import fla_attention, train
from leetrepro.reproduce.tables import load_measured, notebook_setup, stamp
from leetrepro.models.lm import corpus

live, gpu, data_dir, fig_dir = notebook_setup(device, gpu, out_root)
csv = os.path.join(data_dir, "train_lm.csv")

# %%
if live:
    data = corpus(corpus_bytes)
    print(f"corpus: {len(data) / 2**20:.1f} MiB of standard-library source")
    frames = []
    for m in methods:
        fn = m
        if m == "fla":
            fn = fla_attention()
            if fn is None:
                print("fla: not installed, skipped")
                continue
        df = train(fn, data, steps=steps, batch=batch, seq_len=seq_len, dim=dim, layers=layers,
                   heads=heads, lr=lr, device=device, log_every=log_every, label=m)
        frames.append(df)
        print(f"{m:10s} final loss {df.loss.iloc[-1]:.3f}  {df.tokens_per_s.iloc[1:].median():,.0f} tokens/s")
    runs = pd.concat(frames, ignore_index=True)
    runs.to_csv(csv, index=False)
else:  # re-rendered from the committed run of this GPU (data/<gpu>/, not out_root)
    runs = load_measured(gpu, "train_lm.csv")
    assert runs is not None, f"no data/{gpu}/train_lm.csv to re-render: run `make train` on that GPU"

# %%
fig, ax = plt.subplots(figsize=(7, 4))
for m, g in runs.groupby("method", sort=False):
    ax.plot(g.step, g.loss, label=m, lw=1.2)
ax.set(xlabel="step", ylabel=f"training loss (mean over {log_every} steps, nats/byte)",
       title=f"byte-level LM, {runs.layers.iloc[0]} layers × {runs.dim.iloc[0]}, "
             f"batch {runs.batch.iloc[0]} × {runs.seq_len.iloc[0]} bytes\n{runs.gpu.iloc[0]}")
ax.grid(alpha=0.3)
ax.legend(fontsize=8)
fig.tight_layout()
stamp(fig, runs)
for ext in ("png", "svg"):
    fig.savefig(os.path.join(fig_dir, f"train_lm.{ext}"), dpi=120)

# %%
first = runs.groupby("method", sort=False).loss.first()
last = runs.groupby("method", sort=False).loss.last()
speed = runs[runs.step > runs.step.min()].groupby("method", sort=False).tokens_per_s.median()
summary = pd.DataFrame({"first loss": first, "final loss": last,
                        "final − best final": last - last.min(),
                        "tokens/s (median, after the first log)": speed.round(0)})
display(summary)
assert (last < first).all(), "the loss must fall for every method"
spread = last.max() - last.min()
fastest = speed.idxmax()
display(Markdown(
    f"Every method's loss fell (from {first.mean():.2f} to {last.min():.2f}–{last.max():.2f} nats/byte); "
    f"the final losses of the methods lie within {spread:.3f} nats/byte of each other. "
    f"Fastest: **{fastest}** at {speed.max():,.0f} tokens/s"
    + (f" ({speed.max() / speed.drop(fastest).max():.2f}× the next, {speed.drop(fastest).idxmax()})."
       if len(speed) > 1 else ".")))
