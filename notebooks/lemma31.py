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
# # Lemma 3.1: recursion is O(N log N)
# Operation counts from `leetrepro.complexity`, the recurrence solved symbolically, and measured times of Recur next to a linear method for N = 2^k, fitted to a·N·log N + b·N.

# %% tags=["parameters"]
device = "cuda"       # "cpu" works too: timings are then labelled CPU
ks = list(range(10, 18))   # N = 2^k
heads, rank, dim = 32, 128, 128
base = 32
linear_method = "LA_torch"
reps = 5
decay = False
gpu = None
out_root = "."

# %%
import os, numpy as np, pandas as pd, sympy as sp, torch
from IPython.display import Markdown, display
from leetrepro import complexity
from leetrepro.bench import benchmark_method
from leetrepro.bench import gpu_tag, provenance
if torch.device(device).type == "cuda" and not torch.cuda.is_available():
    device = "cpu"
    display(Markdown("**No GPU here: timings below are measured on the CPU.**"))
tag = gpu or gpu_tag(device)
data_dir, fig_dir = os.path.join(out_root, "data", tag), os.path.join(out_root, "figures", tag)
os.makedirs(data_dir, exist_ok=True); os.makedirs(fig_dir, exist_ok=True)
k, C1 = sp.symbols("k C1"); T = sp.Function("T")
sol = sp.rsolve(T(k) - 2 * T(k - 1) - 2 ** k, T(k))   # T(N) = 2T(N/2) + N with N = 2^k
display(Markdown(f"T(2^k) = 2T(2^(k-1)) + 2^k  ⇒  T = ${sp.latex(sp.simplify(sol))}$, i.e. N·log₂N + C·N = Θ(N log N)."))

# %%
counts = pd.DataFrame([dict(N=2 ** kk, recursion=complexity.flops("Recur", 2 ** kk, rank, dim, base=base),
                             linear=complexity.flops("LA", 2 ** kk, rank, dim)) for kk in ks])
counts["recursion / (N log2 N)"] = counts.recursion / (counts.N * np.log2(counts.N))
counts["linear / N"] = counts.linear / counts.N
counts

# %%
frames = [benchmark_method(m, device=device, dtype="float32", batch_size=1, is_weight_decay=decay,
                           seqlens=[2 ** kk for kk in ks], heads=heads, rank=rank, dim=dim, reps=reps,
                           options={"base": base} if m == "Recur" else None)
          for m in ("Recur", linear_method)]
times = pd.concat(frames, ignore_index=True)
for key, val in provenance(device).items():
    times[key] = val
times.to_csv(os.path.join(data_dir, "lemma31.csv"), index=False)
fits = {}
for m, g in times[times.status == "ok"].groupby("method"):
    X = np.stack([g.N * np.log2(g.N), g.N], axis=1)
    (a, b), *_ = np.linalg.lstsq(X, g.median_s.to_numpy(), rcond=None)
    fits[m] = dict(a=a, b=b, share_NlogN_at_max=a * X[-1, 0] / (a * X[-1, 0] + b * X[-1, 1]))
pd.DataFrame(fits).T

# %%
import matplotlib.pyplot as plt
fig, ax = plt.subplots(figsize=(6, 4))
for m, g in times[times.status == "ok"].groupby("method"):
    ax.plot(np.log2(g.N), g.median_s / g.N * 1e9, marker="o", label=m)
ax.set(xlabel="log2 N", ylabel="time / N (ns per token)", title=f"Lemma 3.1 on {times.gpu.iloc[0]}")
ax.legend(); ax.grid(alpha=0.3); fig.tight_layout()
for ext in ("png", "svg"):
    fig.savefig(os.path.join(fig_dir, f"lemma31.{ext}"), dpi=120)
