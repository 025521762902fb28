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
# Operation counts from `leetrepro.complexity`, the recurrence solved symbolically, and measured times of Recur next to a linear method for N = 2^k, each curve fitted by a·N + b, a·N·log N + b and a·N² + b (the fixed cost b included) and the model chosen by AIC.

# %% tags=["parameters"]
device = "cuda"       # "cpu" works too: timings are then labelled CPU
ks = [10, 11, 12, 13, 14, 15, 16, 17]   # the sequence lengths are 2^k
heads = 32
rank = 128
dim = 128
base = 32
linear_method = "LA_torch"
reps = 5
decay = False
gpu = None
from_data = None      # a GPU tag: fit and plot its committed data/<tag>/lemma31.csv instead of timing
out_root = None     # where tables and figures go; None: scratch/ of the checkout (make: RESULTS)

# %%
import os
import numpy as np
import pandas as pd
import sympy as sp
import torch
from IPython.display import Markdown, display
from leetrepro import complexity
from leetrepro.bench import benchmark_method
from leetrepro.bench import gpu_tag, provenance
if torch.device(device).type == "cuda" and not torch.cuda.is_available():
    device = "cpu"
    display(Markdown("**No GPU here: timings below are measured on the CPU.**"))
tag = gpu or from_data or gpu_tag(device)
from leetrepro.reproduce.tables import output_root
out_root = output_root(out_root)
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
if from_data:
    from leetrepro.reproduce.tables import load_measured
    times = load_measured(from_data, "lemma31.csv")
    reps = int(times.reps.iloc[0]) if "reps" in times else reps
    display(Markdown(f"**Re-rendered from the committed `data/{from_data}/lemma31.csv` (commit "
                     f"{times.commit.iloc[0]}, {times.gpu.iloc[0]}): nothing is timed here.**"))
else:
    frames = [benchmark_method(m, device=device, dtype="float32", batch_size=1,
                               is_weight_decay=decay, seqlens=[2 ** kk for kk in ks], heads=heads,
                               rank=rank, dim=dim, reps=reps,
                               options={"base": base} if m == "Recur" else None)
              for m in ("Recur", linear_method)]
    times = pd.concat(frames, ignore_index=True)
    for key, val in provenance(device).items():
        times[key] = val
    times.to_csv(os.path.join(data_dir, "lemma31.csv"), index=False)
from leetrepro.reproduce.claims import AIC_THRESHOLD, GROWTH, aic_gap, best_growth, growth_verdict

# each curve fitted by t = a·f(N) + b for f = N, N log N, N² (fixed cost b included), on relative
# errors; the model with the lowest residual wins, ΔAIC > 2 is a real difference
fits, curves = [], {}
for m, g in times[times.status == "ok"].groupby("method"):
    n, t = g.N.to_numpy(float), g.median_s.to_numpy(float)
    best, res = best_growth(n, t)
    fits.append(dict(method=m, best=best, verdict=growth_verdict(res, len(n)),
                     **{f"rms residual, {k}": v for k, v in res.items()},
                     **{f"ΔAIC of {k}": aic_gap(res, k, len(n)) for k in GROWTH}))
    A = np.stack([GROWTH[best](n), np.ones_like(n)], 1)
    coef, *_ = np.linalg.lstsq(A / t[:, None], np.ones_like(t), rcond=None)
    curves[m] = (best, A @ coef)
fits = pd.DataFrame(fits).set_index("method")
fits.round(3)

# %%
import matplotlib.pyplot as plt
fig, ax = plt.subplots(figsize=(6.5, 4))
for m, g in times[times.status == "ok"].groupby("method"):
    line, = ax.plot(np.log2(g.N), g.median_s / g.N * 1e9, "o", label=f"{m} (median of {reps})")
    best, fitted = curves[m]
    ax.plot(np.log2(g.N), fitted / g.N.to_numpy() * 1e9, "-", color=line.get_color(),
            label=f"{m}: fit a·{best} + b")
ax.set(xlabel="log2 N", ylabel="time / N (ns per token)", title=f"Lemma 3.1 on {times.gpu.iloc[0]}")
ax.legend(fontsize=8); ax.grid(alpha=0.3); fig.tight_layout()
from leetrepro.reproduce.tables import stamp
stamp(fig, times)
for ext in ("png", "svg"):
    fig.savefig(os.path.join(fig_dir, f"lemma31.{ext}"), dpi=120)

# %%
def _verdict(m):
    r = fits.loc[m]
    gap = r["ΔAIC of N"] if r.best != "N" else -r[[f"ΔAIC of {k}" for k in GROWTH if k != "N"]].min()
    close = abs(gap) <= AIC_THRESHOLD
    return (f"**{m}**: {'fitted best' if close else 'best explained'} by a·{r.best} + b"
            + (f" (a·N + b is worse by ΔAIC {r['ΔAIC of N']:.1f}" if r.best != "N" else
               f" (the next model is worse by ΔAIC {-gap:.1f}")
            + (f", within {AIC_THRESHOLD:g}: the two are not told apart)" if close else ")"))


recur = fits.loc["Recur"] if "Recur" in fits.index else None
reason = {"supported": "",
          "inconclusive": f": a·{None if recur is None else recur.best} + b fits best, but "
                          f"a·{'N' if recur is not None and recur.best == 'N log N' else 'N log N'}"
                          f" + b is within ΔAIC {AIC_THRESHOLD:g} of it, so these timings do not "
                          "tell the two apart",
          "not shown": f": the data favour a·{None if recur is None else recur.best} + b (the log "
                       "factor is small against the fixed cost and the constant over this range)"}
display(Markdown("\n".join(f"* {_verdict(m)}." for m in fits.index) + "\n\n" + (
    f"Lemma 3.1 (Recur is Θ(N log N)) is "
    f"{dict(inconclusive='neither shown nor refuted').get(recur.verdict, recur.verdict)} by these timings over "
    f"N = {int(times.N.min()):,} … {int(times.N.max()):,}{reason[recur.verdict]}. The operation "
    "counts above follow the lemma exactly." if recur is not None else "Recur was not measured.")))
