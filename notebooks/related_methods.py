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
# # Other papers' attention through the operator
# LeetDecoding's Section 2 says that `O = (B Cᵀ ⊙ M) V` is the common core of the linear-time attentions. Here that is made concrete for the methods of two more papers: the **linear-attention GPU-kernel paper** (arXiv 2510.21956: normalised causal linear attention with `f(x) = 1 + x`, 3.3× faster and 3.6× less memory than Gated Linear Attention on an A6000) and **the blog's fast-attention survey** (Performer / Linear Transformer, RWKV, AFT, Linformer, memory-efficient and flash attention). Each method that reduces is computed through the operator (`leetrepro.related`) and checked against its own direct form, written from its equations; the ones that do not reduce say why. Then the kernel paper's two claims, judged on this project's GPUs.

# %% tags=["parameters"]
reps = 3
layer_cell = [1, 4, 64, 1024]   # batch, heads, head dim, N of the layer timed on this CPU
blog_shapes = [[1, 4, 1024, 32], [256, 64]]   # the attentions (batch, heads, N, head dim); WKV, AFT (T, channels)
gpus = None         # GPU folders under data/ to show (None: every one with related_methods.csv)
measure_gpu = True  # a GPU on this machine: measure it now (bench.related) instead of reading data/
out_root = None     # where tables and figures go; None: scratch/ of the checkout (make: RESULTS)

# %%
import os
import pandas as pd
import torch
import matplotlib.pyplot as plt
from IPython.display import Markdown, display
from leetrepro import related
from leetrepro.bench import related as R
from leetrepro.reproduce import other_papers as O
from leetrepro.reproduce.tables import stamp
pd.set_option("display.max_colwidth", 300)
out_root, fig_dir, cpu_dir, live_gpu, gpus = O.notebook_machines(
    "related_methods", "related_methods.csv", gpus, measure_gpu, out_root)

# %% [markdown]
# ## Which methods are the operator
# `B`, `C`: `(batch, heads, N, r)`; `V`: `(batch, heads, N, d)`; `M[i, j] = γ^(i−j)`, `i ≥ j`.

# %%
reductions = pd.DataFrame([
    ("normalised linear attention, f(x) = 1 + x", "kernel paper", "yes",
     "numerator op(q, k, v) + cumsum(v), denominator q·cumsum(k) + (i+1); in one call B = [1, q], C = [1, k], V = [v, 1], γ = 1",
     "related.normalized_linear_attention"),
    ("Linear Transformer / Performer (causal, normalised)", "blog", "yes",
     "B = φ(q), C = φ(k), V = [v, 1], γ = 1 (φ: elu + 1, or Performer's random features)",
     "related.linear_transformer"),
    ("RWKV's WKV (decay w, bonus u)", "blog", "yes",
     "one head per channel, r = 1: B = 1, C = e^k, V = [v, 1], γ = exp(−e^w); the current token's bonus e^(u+k) v is elementwise, α and β shifted by one row",
     "related.wkv"),
    ("AFT-simple", "blog", "yes, degenerately",
     "one head per channel, r = d = 1 (with the denominator column, d = 2), γ = 1: a running sum, which is all the operator computes here",
     "related.aft_simple"),
    ("AFT-full", "blog", "no",
     "its learned pairwise bias w[t, t'] is any T × T matrix, neither low-rank nor γ^(t−t'); only w[t, t'] = (t − t')·log γ reduces, and that is RWKV", "-"),
    ("AFT-local / AFT-conv", "blog", "no",
     "a learned bias inside a window: not γ^(i−j) (a window of constant weight alone would be two calls, γ = 1, one shifted by the window)", "-"),
    ("Linformer", "blog", "no",
     "projects keys and values along the sequence (N → k): not causal, and the projection mixes future tokens into every row", "-"),
    ("memory-efficient attention, FlashAttention", "blog", "no",
     "softmax attention: exp(q·k) has no finite low-rank factorisation B Cᵀ; these are IO schedules of the quadratic form", "-"),
    ("rotary embeddings (RoPE)", "blog", "composes",
     "not an attention: rotated q and k can be B and C of the 0-1 mask (a rotation per position keeps B Cᵀ low-rank)", "-"),
], columns=["method", "from", "reduces", "how (B, C, V, γ, extra terms) or why not", "here"])
display(reductions)

# %% [markdown]
# ## Each reduction against its direct form: error and time
# fp32 inputs; error ‖out − ref‖/‖ref‖ against the direct form run in float64; time of the forward through the operator (`method="auto"`) and of the direct form, medians of interleaved rounds. On the CPU at small sizes, on the GPUs at b2 × 8 heads × 2048 tokens × 64 (the attentions) and b2 × 1024 tokens × 256 channels (WKV, AFT).

# %%
blog = {"cpu": R.frame(R.measure_blog(torch.device("cpu"), reps=reps, shapes=blog_shapes), "cpu")}
blog["cpu"].to_csv(os.path.join(cpu_dir, "related_methods.csv"), index=False)
layer, lm = {}, {}
for g in gpus:
    blog[g], layer[g], lm[g] = O.gpu_tables(
        g, g == live_gpu, out_root, ["blog", "kernel"],
        ["related_methods.csv", "kernel_paper_layer.csv", "kernel_paper_lm.csv"])
table = pd.concat([b.assign(machine=m) for m, b in blog.items()])
table = table.pivot_table(index=["method", "form" if "form" in table else "entry", "machine"],
                          values=["rel_error", "median_s"], aggfunc="first")
display(table.style.format({"rel_error": "{:.1e}", "median_s": "{:.3e}"}))
worst = pd.concat(blog.values()).rel_error.max()
display(Markdown(f"Largest error of any reduction on any machine: **{worst:.1e}** (fp32; the accuracy contract is 1e-5 for exact fp32 arithmetic and 5e-3 where a kernel uses tf32 products, as the GPU's Chunk does by default)."))

# %% [markdown]
# ## The kernel paper's layer
# Memory first, on this CPU: what the layer keeps for its backward (PyTorch's saved-tensor hooks count it) is the inputs, the output and one denominator per row and head, nothing of size N × N or N × r × d.

# %%
b, h, dh, n = layer_cell
q, k = (torch.nn.functional.normalize(torch.randn(b, h, n, dh), dim=-1).requires_grad_() for _ in range(2))
v = torch.randn(b, h, n, dh).requires_grad_()
saved = []
with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
    out = related.normalized_linear_attention(q, k, v)
io = q.numel() + k.numel() + v.numel() + out.numel()
display(Markdown(f"b{b} h{h} N = {n} d = {dh}: saved {sum(saved):,} elements: the inputs and the output, "
                 f"{io:,}, and {sum(saved) - io:,} more = N × heads × batch = {n * h * b:,} (the denominators)."))
cpu_layer = R.frame(R.measure_layer(torch.device("cpu"), cells=(tuple(layer_cell),), reps=reps,
                                     dtype=torch.float32), "cpu")
cpu_layer.to_csv(os.path.join(cpu_dir, "kernel_paper_layer.csv"), index=False)
layer["cpu"] = cpu_layer

# %% [markdown]
# On the GPUs (bf16, b2 × 16 heads × 128, time-major as a model's projection hands it), forward + backward: time and peak memory above the inputs, this project's layer beside flash-linear-attention's GLA (`chunk_gla`, the paper's baseline) and its normalised linear attention (`chunk_linear_attn`), and softmax attention (SDPA).

# %%
gpu_layers = {g: d for g, d in layer.items() if g != "cpu" and d is not None}
if gpu_layers:
    fig, axes = plt.subplots(2, len(gpu_layers), figsize=(5.5 * len(gpu_layers), 7), squeeze=False)
    for col, (g, d) in enumerate(gpu_layers.items()):
        d = d[(d.status == "ok") & (d["mode"] == "fwd+bwd")]
        for i, (entry, e) in enumerate(d.groupby("entry", sort=False)):
            axes[0, col].plot(e.N, e.median_s * 1e3, "o-", label=entry, color=f"C{i}")
            axes[1, col].plot(e.N, e.peak_bytes / 2 ** 30, "o-", label=entry, color=f"C{i}")
        axes[0, col].set(xscale="log", yscale="log", ylabel="forward + backward, ms", title=d.gpu.iloc[0])
        axes[1, col].set(xscale="log", xlabel="N", ylabel="peak above the inputs, GiB")
        for ax in axes[:, col]:
            ax.grid(alpha=0.3); ax.legend(fontsize=7)
    fig.tight_layout()
    stamp(fig, pd.concat(gpu_layers.values()))
    for ext in ("png", "svg"):
        fig.savefig(os.path.join(fig_dir, f"kernel_paper_layer.{ext}"), dpi=120)
    both = pd.concat([d.assign(machine=g) for g, d in layer.items() if d is not None])
    display(both[both.status == "ok"].pivot_table(index=["machine", "mode", "N"], columns="entry", values="median_s")
            .mul(1e3).round(3))
lms = [d.assign(machine=g) for g, d in lm.items() if d is not None]
if lms:
    lm_all = pd.concat(lms)
    display(Markdown(f"A training step of a {lm_all.params.max() / 1e9:.2f}B-parameter decoder ({int(lm_all.layers.iloc[0])} layers, d_model {int(lm_all.dim.iloc[0])}, "
                     f"{int(lm_all.heads.iloc[0])} heads, batch {int(lm_all.batch.iloc[0])} × {int(lm_all.seq.iloc[0])} tokens, bf16, fused AdamW), one model per mixer:"))
    display(lm_all.assign(ms=lm_all.median_s * 1e3, peak_GiB=lm_all.peak_bytes / 2 ** 30)
            [["machine", "entry", "params", "ms", "peak_GiB", "status"]].round(2))

# %% [markdown]
# ## The kernel paper's claims, per GPU
# The paper measured an NVIDIA A6000 against flash-linear-attention's GLA of its day; here its layer runs on this project's operator against today's `chunk_gla`, on each GPU; each verdict's evidence says what computed the passes around the operator (Triton kernels, or PyTorch's composition in rows measured before them). `supported` where every cell reaches the factor (within 1 %), `not shown` where none does, else `inconclusive`.

# %%
verdicts = []
for g in [m for m in layer if m != "cpu"]:
    c = O.kernel_paper_claims(layer.get(g), lm.get(g))
    where = os.path.join(out_root, "data", g)
    os.makedirs(where, exist_ok=True)
    c.to_csv(os.path.join(where, "kernel_paper_claims.csv"), index=False)
    verdicts.append(c.assign(machine=g))
if verdicts:
    display(pd.concat(verdicts, ignore_index=True)[["machine", "claim", "holds", "evidence"]])
else:
    display(Markdown("No GPU data here: the claims are judged where GPU rows exist."))
