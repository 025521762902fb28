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
# # The paper's methods under data-dependent decay
# LeetDecoding's operator has one decay γ per head: `M[i, j] = γ^(i−j)`. The models trained today with this low-rank form (Mamba-2's state-space dual, simple gated linear attention) choose the decay per token: `S_t = a_t S_(t−1) + c_tᵀ v_t`, so `M[i, j] = Π_(t=j+1..i) a_t = exp(G_i − G_j)` with `G` the running sum of the log gates `g_t = log a_t ≤ 0` (a γ as well multiplies in: `g_t + log γ`). This notebook asks of each of the paper's methods whether it extends, at what cost, over which numerical range, and what the gates cost the kernels.

# %% tags=["parameters"]
strengths = [0.01, 0.1, 1.0, 3.0, 10.0]   # mean |g| per token of the gates swept
seqlens = [256, 1024, 4096]              # N of the error sweep
heads = 2
rank = 16                                # head size (r and d) of the error sweep, float32, CPU
gpu = None                               # GPU folders of data/ with gates.csv (None: every one)
out_root = None                          # where figures go; None: scratch/ of the checkout

# %%
import os
import pandas as pd
import torch
import matplotlib.pyplot as plt
from IPython.display import Markdown, display
from leetrepro import causal_linear_decoder, reference, rel_error
from leetrepro.registry import methods
from leetrepro.ops import NO_GATES
from leetrepro._paths import data as committed
from leetrepro.reproduce.tables import output_root
out_root = output_root(out_root)
fig_dir = os.path.join(out_root, "figures", "gates")
os.makedirs(fig_dir, exist_ok=True)

# %% [markdown]
# ## Which methods extend, and at what cost
# Each method needs the mask only through three pieces: within a block, `exp(G_i − G_j)`; onto the state entering a block, `exp(G_i − G_s)` (s the block's start); into the state leaving it, `exp(G_e − G_j)`, and the state's own decay `exp(G_e − G_s)`. With γ these are powers `γ^k`; with gates they are exponentials of differences of running sums, each taken *within its block*, the later row first, so no exponent is positive:
#
# * **Vanilla** builds the N × N mask from the running sums (in float64): O(N²) as before.
# * **Bb** (Algorithm 2) and **LA_torch** take the block's own running sums; the state between blocks decays by the block's total. Same cost, plus O(N) for the sums.
# * **Recur** (Algorithms 3-4): the off-diagonal block between halves factorises as `exp(G_i − G_m) · exp(G_m − G_j)`, `G_m` the first half's last row, so right multiplication still works, at the same O(N log N).
# * **Chunk** (this project's kernel, both the portable and the Hopper one) loads a chunk's gates beside its rows; the backward reads them shifted by one row in reverse time, and the gates' gradient comes from the same sweeps (`dG_i = b_i·db_i − c_i·dc_i`, then a reverse running sum).
# * **FA** (FleetAttention) factorises the mask per head as `γ^i · γ^−j`: with gates, `exp(G_i) · exp(−G_j)`, and `exp(−G_j)` overflows float32 once `G_j < −88`. **Cdotp**'s kernel has no decay at all, and the **LA** kernel takes one γ per head (Chunk is its gated twin). These refuse gates, saying why.

# %%
rows = []
for m in methods():
    rows.append(dict(method=m.abbr, language=m.language, gates=m.gates, complexity=m.complexity,
                     why_not="" if m.gates else NO_GATES.get(m.abbr, "no per-token decay rule")[:90]))
display(pd.DataFrame(rows).set_index("method"))

# %% [markdown]
# ### Where FleetAttention's factorisation breaks
# `exp(−G_j)` in float32 overflows at `G_j < −88.7`. With gates of mean magnitude |g| that is after about 88.7 / |g| tokens: a few hundred for the gates models learn, and at once after a hard reset (a gate of −1e4).

# %%
fa = pd.DataFrame([dict(mean_abs_gate=s, tokens_until_overflow=int(88.7 / s) + 1) for s in strengths])
display(fa.set_index("mean_abs_gate"))

# %% [markdown]
# ## The numerical range: error against float64 as gates strengthen and N grows
# Gates `−|g|·u` with `u` uniform in (0, 2), float32 inputs, every gated method against the float64 oracle (`reference(..., g=g)`). Beside them, the textbook way of forming the mask from *one* running sum over the whole sequence in float32 (`exp(G_i − G_j)` with G the global cumulative sum): its running sum grows to −|g|·N and the difference of two large float32 numbers loses the small gaps between rows.

# %%
def naive_global(B, C, V, g):
    G = g.float().cumsum(-1)
    diff = G[..., :, None] - G[..., None, :]
    lower = torch.ones(g.shape[-1], g.shape[-1], dtype=torch.bool).tril()
    M = torch.exp(torch.where(lower, diff, torch.tensor(-float("inf"))))
    return ((B @ C.transpose(-1, -2)) * M) @ V

opts = {"Bb": dict(block_size=64), "LA_torch": dict(block_size=64), "Recur": dict(base=32)}
err_rows = []
for n in seqlens:
    gen = torch.Generator().manual_seed(n)
    B, C, V = (torch.randn(1, heads, n, rank, generator=gen) / rank ** 0.5 for _ in range(3))
    u = torch.rand(1, heads, n, generator=gen) * 2
    for s in strengths:
        g = -s * u
        ref = reference(B, C, V, g=g)
        for m in ["Vanilla", "Bb", "Recur", "LA_torch"]:
            out = causal_linear_decoder(B, C, V, g=g, method=m, **opts.get(m, {}))
            err_rows.append(dict(method=m, N=n, strength=s, rel_err=rel_error(out, ref)))
        err_rows.append(dict(method="one global running sum (fp32)", N=n, strength=s,
                             rel_err=rel_error(naive_global(B, C, V, g), ref)))
errs = pd.DataFrame(err_rows)
display(errs.pivot_table(index=["N", "strength"], columns="method", values="rel_err")
        .style.format("{:.1e}"))
fig, axes = plt.subplots(1, len(seqlens), figsize=(4 * len(seqlens), 3.2), sharey=True)
for ax, n in zip(axes if len(seqlens) > 1 else [axes], seqlens):
    for m, grp in errs[errs.N == n].groupby("method"):
        ax.loglog(grp.strength, grp.rel_err.clip(lower=1e-9), "o-", label=m)
    ax.axhline(1e-5, color="k", lw=0.8, ls="--")
    ax.set_title(f"N = {n}")
    ax.set_xlabel("mean |g| per token")
axes[0].set_ylabel("‖out − ref‖ / ‖ref‖ (fp32)") if len(seqlens) > 1 else axes.set_ylabel("rel. error")
(axes[0] if len(seqlens) > 1 else axes).legend(fontsize=7)
fig.tight_layout()
fig.savefig(os.path.join(fig_dir, "gates_error.png"), dpi=120)
worst = errs[errs.method != "one global running sum (fp32)"].rel_err.max()
display(Markdown(f"Every gated method stays within **{worst:.1e}** of float64 over the sweep (the fp32 contract is 1e-5); "
                 f"the global running sum reaches **{errs[errs.method.str.startswith('one')].rel_err.max():.1e}**."))

# %% [markdown]
# ## What the gates cost the kernels
# `make bench-gates` (`leetrepro/bench/gates.py`): bf16, in the layout a model hands the operator (`model`: time-major slices of one projection taken in each step, the gates time-major) and in three separate time-major tensors (`separate`: the operator's own cost, without the pass both entries pay to concatenate the slices' gradients), simple GLA's shape (batch 8 × 32 heads × N 8192, K = V = 128), Mamba-2-like ones (batch 2 × 64 heads, K = 128 or 64, V = 64), one GPU's training micro-batch (batch 4 × 16 heads × N 4096, 128/128: fewer lanes than SMs) and a long prompt (1 × 16 heads × N 32768); the gated call against the same call with one γ per head (`vs_gamma`) and against flash-linear-attention's `chunk_simple_gla(g=…)` (`vs_fla`), eager and in CUDA graphs, each against its memory floor. flash-linear-attention's gated backward refuses Triton 3.4-3.7.0 on Hopper: its rows say so.

# %%
tags = gpu if gpu is not None else sorted(t for t in os.listdir(committed())
                                          if os.path.exists(committed(t, "gates.csv")))
tags = [tags] if isinstance(tags, str) else tags
frames = [pd.read_csv(committed(t, "gates.csv")).assign(tag=t) for t in tags]
timing = pd.concat(frames) if frames else pd.DataFrame()
if len(timing) and "layout" not in timing:  # (rows from before the layouts were two)
    timing = timing.assign(layout="model")
if len(timing):
    for t, df in timing.groupby("tag"):
        meta = df.iloc[0]
        display(Markdown(f"**{meta.gpu}** ({t}), source {meta.source}, {meta.date}"))
        show = df[["shape", "layout", "pass", "mode", "entry", "median_ms", "floor_ms", "vs_floor",
                   "vs_gamma", "vs_fla", "status"]].copy()
        show["status"] = show.status.astype(str).str[:60]
        display(show.set_index(["shape", "layout", "pass", "mode", "entry"]).style.format(
            {"median_ms": "{:.3f}", "floor_ms": "{:.3f}", "vs_floor": "{:.2f}", "vs_gamma": "{:.2f}",
             "vs_fla": "{:.2f}"}, na_rep="—"))
    ok = timing[(timing.entry == "gates") & timing.vs_gamma.notna()]
    fig, ax = plt.subplots(figsize=(7, 3.2))
    labels = [f"{r.tag} {r.shape} {r.layout}\n{r['pass']} {r['mode']}" for _, r in ok.iterrows()]
    ax.bar(range(len(ok)), ok.vs_gamma, color=["C0" if m == "graph" else "C1" for m in ok["mode"]])
    ax.axhline(1.10, color="k", ls="--", lw=0.8, label="forward target 1.10×")
    ax.axhline(1.20, color="gray", ls=":", lw=0.8, label="forward + backward target 1.20×")
    ax.set_xticks(range(len(ok)))
    ax.set_xticklabels(labels, fontsize=6, rotation=30, ha="right")
    ax.set_ylabel("gated time / γ time")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(fig_dir, "gates_cost.png"), dpi=120)
else:
    display(Markdown("No `gates.csv` under `data/`: run `make bench-gates` on a GPU."))
