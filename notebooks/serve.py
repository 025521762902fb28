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
# # Serving: packed prompts, the decode step, and generation in the paper's models
# `make bench-serve` (`leetrepro/bench/serve.py`) measures, in one process beside flash-linear-attention:
# * **packed prefill**: the 100 seeded prompts of Tables 7-8 (716,176 tokens) packed with `cu_seqlens`, heads 32, r = d = 128, per-head decays: our call (`causal_linear_decoder(..., cu_seqlens=cu)`), our drop-in `chunk_simple_gla` in fla's time-major layout, fla's `chunk_simple_gla`, and the same prompts right-padded into batches of 16;
# * **the decode step**: one token per sequence, fp32 states in a pool, `decode_step` eager and captured in a CUDA graph (one step a replay, and eight steps over eight layers' pools a replay, as an engine captures a model's whole decode step), fla's `fused_recurrent_simple_gla` the same ways;
# * **generation**: each model's first two layers, prompts prefilled packed (10 at a time), then 128 greedy tokens each through `decode_step`, against each model's own PyTorch attention and recurrent step.
#
# The floor: prefill reads B, C, V and writes O; a decode step reads and writes the states. Medians of CUDA-event timings.

# %% tags=["parameters"]
gpu = "h100"
out_root = None     # where tables and figures go; None: scratch/ of the checkout (make: RESULTS)

# %%
import os
import matplotlib.pyplot as plt
from IPython.display import Markdown, display
from leetrepro.reproduce.tables import load_measured, output_root, readable_log, stamp
out_root = output_root(out_root)

fig_dir = os.path.join(out_root, "figures", gpu)
os.makedirs(fig_dir, exist_ok=True)
serve = load_measured(gpu, "serve.csv")
gen = load_measured(gpu, "generation.csv")
meta = serve.iloc[0]
display(Markdown(f"**{meta.gpu}**, commit `{meta.commit}`, {meta.date}"))
serve[["case", "method", "dtype", "batch", "tokens", "ms", "floor_ms", "floor_ratio", "host_us"]].round(4)

# %%
fig, axes = plt.subplots(1, 2, figsize=(12, 4))
pre = serve[serve.case == "prefill_varlen"]
order = [m for m in ("auto", "Chunk", "Chunk_padded", "chunk_simple_gla", "fla") if m in set(pre.method)]
for i, (dtype, grp) in enumerate(pre.groupby("dtype")):
    grp = grp.set_index("method").reindex(order)
    xs = [j + 0.4 * i for j in range(len(grp))]
    bars = axes[0].bar(xs, grp.ms, width=0.38, label=dtype)
    axes[0].bar_label(bars, labels=[f"{r:.2f}×" for r in grp.floor_ratio], fontsize=7)
axes[0].axhline(pre.floor_ms.iloc[0], color="k", ls=":", lw=1, label="floor")
axes[0].set_xticks([j + 0.2 for j in range(len(order))], order, fontsize=8)
axes[0].set(ylabel="ms", title="packed prefill, 100 prompts (716,176 tokens); label: × floor")
axes[0].legend(fontsize=8)
dec = serve[serve.case == "decode"]
for method, grp in dec.groupby("method"):
    axes[1].plot(grp.batch, grp.ms * 1e3, "-o", label=method)
axes[1].plot(dec.groupby("batch").floor_ms.first() * 1e3, "k:", label="floor (states read + written)")
axes[1].set(xscale="log", yscale="log", xlabel="sequences per step", ylabel="µs per step (GPU)",
            title="decode step, bf16 inputs, fp32 states")
axes[1].legend(fontsize=8)
readable_log(axes[1], "both")
for ax in axes:
    ax.grid(alpha=0.3)
fig.suptitle(f"Serving on {meta.gpu}")
fig.tight_layout()
stamp(fig, serve)
fig.savefig(os.path.join(fig_dir, "serve.png"), dpi=120)

# %% [markdown]
# ## Generation in Tables 7-8's models
# `ttft_ms`: time to first token (the prefill of one packed group of 10 prompts, batched; one prompt, batch 1); `step_ms`: one generated token for every sequence (`batch1_graph`: each step one replay of a CUDA graph of the whole step); `host_us_per_layer`: a step's host time per layer, the GPU idle; `agree`: the share of generated tokens equal to those of the Chunk path (greedy decoding with random weights amplifies last-bit differences: one flipped token changes everything after it).

# %%
if gen is None:  # `make bench-serve`'s generation part was not run on this GPU
    display(Markdown(f"No `generation.csv` under `data/{gpu}/`: generation was not measured here."))
else:
    cols = [c for c in ("model", "method", "mode", "prompts", "ttft_ms", "step_ms", "tokens_per_s",
                        "host_us_per_layer", "agree") if c in gen.columns]
    display(gen[cols].round(3))
    if "timed" in gen.columns:  # what each mode's times are
        display(Markdown("\n".join(f"* `{m}`: {t}" for m, t in
                                    gen.drop_duplicates("mode").set_index("mode").timed.items())))

# %% [markdown]
# ## Conclusions (written from the data above)

# %%
def cell(case, method, dtype=None, batch=None):
    d = serve[(serve.case == case) & (serve.method == method)]
    d = d if dtype is None else d[d.dtype == dtype]
    d = d if batch is None else d[d.batch == batch]
    return d.iloc[0] if len(d) else None


lines = []
for dt in sorted(set(pre.dtype)):
    ours, fla = cell("prefill_varlen", "Chunk", dt), cell("prefill_varlen", "fla", dt)
    if ours is not None:
        lines.append(f"* Packed prefill, {dt}: **{ours.ms:.2f} ms, {ours.floor_ratio:.2f}× the floor**"
                     + (f"; fla {fla.ms:.2f} ms ({fla.floor_ratio:.2f}×), {fla.ms / ours.ms:.1f}× slower"
                        if fla is not None else "") + ".")


def versus(ours, theirs):
    return (f"{ours.ms * 1e3:.1f} µs ({ours.floor_ratio:.2f}× the floor)"
            + (f" against fla's {theirs.ms * 1e3:.1f} µs ({theirs.floor_ratio:.2f}×)"
               if theirs is not None else ""))


for b in sorted(set(dec.batch)):
    g, e, f, fg, g8, f8 = (cell("decode", m, batch=b)
                           for m in ("decode_step_graph", "decode_step", "fla", "fla_graph",
                                     "decode_step_graph8", "fla_graph8"))
    if g is not None:
        # like with like: graph replay against graph replay, eager call against eager call
        lines.append(f"* Decode step, batch {b}: in a CUDA graph, one step a replay {versus(g, fg)}"
                     + (f"; eight steps (eight layers' pools) a replay, per step {versus(g8, f8)}"
                        if g8 is not None else "")
                     + f"; eager {e.ms * 1e3:.1f} µs (host {e.host_us:.0f} µs per step)"
                     + (f" against fla's {f.ms * 1e3:.1f} µs (host {f.host_us:.0f} µs)"
                        if f is not None else "") + ".")
for (model, mode), g in ([] if gen is None else gen.groupby(["model", "mode"])):
    t = g.set_index("method")
    if {"Chunk", "original"} <= set(t.index):
        lines.append(f"* Generation, {model}, {mode}: {t.loc['Chunk', 'tokens_per_s']:,.0f} tokens/s "
                     f"with Chunk + decode_step against {t.loc['original', 'tokens_per_s']:,.0f} "
                     f"with the model's own path; time to first token {t.loc['Chunk', 'ttft_ms']:.1f} "
                     f"against {t.loc['original', 'ttft_ms']:.1f} ms"
                     + (f"; host {t.loc['Chunk', 'host_us_per_layer']:.0f} µs per layer a step"
                        if "host_us_per_layer" in t.columns  # (rows from before it was measured)
                        and t.loc['Chunk', 'host_us_per_layer'] == t.loc['Chunk', 'host_us_per_layer']
                        else "") + ".")
display(Markdown("\n".join(lines)))
