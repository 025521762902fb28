"""Writes the reproduction notebooks (``python notebooks/build_notebooks.py``). Each has a cell
tagged ``parameters`` for papermill; the work lives in ``leetrepro.reproduce`` so the notebooks stay
short. Edit here, not in the .ipynb files."""
import os

import nbformat as nbf

HERE = os.path.dirname(os.path.abspath(__file__))

COMMON = '''import os
import torch
from IPython.display import Markdown, display
from leetrepro.reproduce import tables as T, paper
from leetrepro.bench import gpu_tag
live = torch.device(device).type != "cuda" or torch.cuda.is_available()
gpu = gpu or (gpu_tag(device) if live else "h100")
data_dir = os.path.join(out_root, "data", gpu)
fig_dir = os.path.join(out_root, "figures", gpu)
os.makedirs(data_dir, exist_ok=True); os.makedirs(fig_dir, exist_ok=True)
if not live:
    display(Markdown(f"**No GPU on this machine: nothing is measured here. The tables below are "
                     f"re-rendered from the committed measurements in `data/{gpu}/`.**"))
'''

NOTEBOOKS = {
    "latency": ("# Tables 3-6: latency of one attention layer\n"
                "Each method at heads 32, r = d = 128 over N = 128 … 100000 (Section 5.1): mean ± std of "
                "15 timed calls after a warm-up, `OOM` and `>limit` cells kept. Every cell shows the "
                "paper's A6000 number, ours and ours/paper; the fastest method per N is in bold.", [
        '''table = 3           # the paper's table to reproduce (3-6): sets batch size and mask
batch_size = None   # override the table's batch size
decay = None        # override the table's mask (True: exponential decay)
dtype = "float32"
seqlens = [128, 512, 2048, 8192, 12800, 25600, 100000]
methods = ["Vanilla", "Bb", "Cdotp", "Cdotp_torch", "FA", "FA_torch", "LA", "LA_torch", "Recur"]
reps = 15
device = "cuda"
gpu = None          # folder tag under data/ and figures/ (default: this GPU's, or h100 to re-render)
time_limit = 60.0   # seconds one call may take before the cell reads >limit
heads, rank, dim = 32, 128, 128
out_root = "."''',
        COMMON + '''bs, dec = T.TABLES[table]
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
display(Markdown(f"Source: {source}; GPU {prov.gpu}, dtype {dtype}, batch {batch_size}, "
                 f"{'decay' if decay else '0-1 mask'}, commit {prov.commit}, {prov.date}."))''',
        '''both = T.side_by_side(measured, paper.load(table))
display(Markdown("**This GPU** (mean ± std, s; fastest per N in bold)"))
display(T.styled(both))
display(Markdown("**Paper (A6000) | this GPU | ours/paper**"))
display(T.triple(both))''',
        '''fig = T.plot_latency(measured, f"Table {table}: batch {batch_size}, {'decay' if decay else '0-1 mask'}, {dtype} ({prov.gpu})",
                     os.path.join(fig_dir, name), paper.load(table))''',
    ]),
    "table9": ("# Table 9: FleetAttention vs FA_modify (Appendix D)\n"
               "FA_modify sums the ranks without synchronisation; the paper reports it at about half "
               "FA's time. Here also its error against the float64 oracle (it is wrong by design).", [
        '''batch_sizes = [1, 16]
decays = [False, True]
dtype = "float32"
seqlens = [128, 512, 2048, 8192, 12800, 25600, 100000]
reps = 15
device = "cuda"
gpu = None
time_limit = 60.0
heads, rank, dim = 32, 128, 128
error_shape = [1, 32, 4097, 128, 128]   # (batch, heads, N, r, d) of the accuracy check
out_root = "."''',
        COMMON + '''import pandas as pd
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
measured.groupby(["batch", "decay"]).size()''',
        '''p = paper.load(9)
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
ratio''',
        '''from leetrepro import causal_linear_decoder, reference, rel_error
if live:
    b, h, n, r, d = error_shape
    B, C, V = (torch.randn(b, h, n, k, device=device) / (r ** 0.5 if k == r else 1) for k in (r, r, d))
    ref = reference(B, C, V)
    errs = {m: rel_error(causal_linear_decoder(B, C, V, method=m), ref) for m in ("FA", "FA_modify")}
    display(Markdown(f"Relative error at {tuple(error_shape)}: " + ", ".join(f"{m} {e:.2e}" for m, e in errs.items())))
else:
    c = T.load_measured(gpu, "correctness.csv")
    if c is not None:
        display(c[c.abbr.isin(["FA", "FA_modify"])].groupby(["abbr", "batch", "N"]).rel_err.max().unstack("abbr"))''',
        '''import matplotlib.pyplot as plt
fig, ax = plt.subplots(figsize=(6, 3.5))
for (b, dec), g in ratio.reset_index().groupby(["batch", "decay"]):
    ax.plot(g.N, g["FA_modify / FA"], marker="o", label=f"bz {b}, {'decay' if dec else '0-1'}")
ax.axhline(0.5, color="gray", ls="--", lw=1, label="paper: ~0.5")
ax.set(xscale="log", xlabel="N", ylabel="FA_modify time / FA time", title=f"Table 9 on {gpu}")
ax.legend(fontsize=8); fig.tight_layout()
for ext in ("png", "svg"):
    fig.savefig(os.path.join(fig_dir, f"table9.{ext}"), dpi=120)''',
    ]),
    "lemma31": ("# Lemma 3.1: recursion is O(N log N)\n"
                "Operation counts from `leetrepro.complexity`, the recurrence solved symbolically, and "
                "measured times of Recur next to a linear method for N = 2^k, fitted to a·N·log N + b·N.", [
        '''device = "cuda"       # "cpu" works too: timings are then labelled CPU
ks = list(range(10, 18))   # N = 2^k
heads, rank, dim = 32, 128, 128
base = 32
linear_method = "LA_torch"
reps = 5
decay = False
gpu = None
out_root = "."''',
        '''import os, numpy as np, pandas as pd, sympy as sp, torch
from IPython.display import Markdown, display
from leetrepro import complexity, benchmark_method
from leetrepro.bench import gpu_tag, provenance
if torch.device(device).type == "cuda" and not torch.cuda.is_available():
    device = "cpu"
    display(Markdown("**No GPU here: timings below are measured on the CPU.**"))
tag = gpu or gpu_tag(device)
data_dir, fig_dir = os.path.join(out_root, "data", tag), os.path.join(out_root, "figures", tag)
os.makedirs(data_dir, exist_ok=True); os.makedirs(fig_dir, exist_ok=True)
k, C1 = sp.symbols("k C1"); T = sp.Function("T")
sol = sp.rsolve(T(k) - 2 * T(k - 1) - 2 ** k, T(k))   # T(N) = 2T(N/2) + N with N = 2^k
display(Markdown(f"T(2^k) = 2T(2^(k-1)) + 2^k  ⇒  T = ${sp.latex(sp.simplify(sol))}$, i.e. N·log₂N + C·N = Θ(N log N)."))''',
        '''counts = pd.DataFrame([dict(N=2 ** kk, recursion=complexity.flops("Recur", 2 ** kk, rank, dim, base=base),
                             linear=complexity.flops("LA", 2 ** kk, rank, dim)) for kk in ks])
counts["recursion / (N log2 N)"] = counts.recursion / (counts.N * np.log2(counts.N))
counts["linear / N"] = counts.linear / counts.N
counts''',
        '''frames = [benchmark_method(m, device=device, dtype="float32", batch_size=1, is_weight_decay=decay,
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
pd.DataFrame(fits).T''',
        '''import matplotlib.pyplot as plt
fig, ax = plt.subplots(figsize=(6, 4))
for m, g in times[times.status == "ok"].groupby("method"):
    ax.plot(np.log2(g.N), g.median_s / g.N * 1e9, marker="o", label=m)
ax.set(xlabel="log2 N", ylabel="time / N (ns per token)", title=f"Lemma 3.1 on {times.gpu.iloc[0]}")
ax.legend(); ax.grid(alpha=0.3); fig.tight_layout()
for ext in ("png", "svg"):
    fig.savefig(os.path.join(fig_dir, f"lemma31.{ext}"), dpi=120)''',
    ]),
    "derivations": ("# Derivations, checked numerically\n"
                    "FleetAttention's identity and Eq. (5), the λ-cumsum of Appendix C.1, the complexity "
                    "table, and the companion paper's Theorem 4.1.", [
        '''n, r, d = 96, 8, 16
gamma = 0.9
table_N = 8192
sizes = [16, 32, 64, 128, 256, 512, 1024]   # for the triangular-truncation norm
seed = 0
out_root = "."''',
        '''import os, numpy as np, pandas as pd, torch
from IPython.display import Markdown, display
from leetrepro import reference, complexity
from leetrepro._decay import causal_mask, discounted_cumsum
torch.manual_seed(seed)
fig_dir = os.path.join(out_root, "figures", "derivations"); os.makedirs(fig_dir, exist_ok=True)
B, C, V = torch.randn(n, r, dtype=torch.float64), torch.randn(n, r, dtype=torch.float64), torch.randn(n, d, dtype=torch.float64)
lg = torch.log(torch.tensor([gamma], dtype=torch.float64)).view(1, 1, 1)
M = causal_mask(n, lg, dtype=torch.float64, device="cpu")[0]
checks = {}
b, c = B[:, 0], C[:, 0]
checks["(b cᵀ ⊙ M) V = diag(b) M diag(c) V"] = ((torch.outer(b, c) * M) @ V - torch.diag(b) @ M @ torch.diag(c) @ V).abs().max().item()
eq5 = sum(B[:, i:i + 1] * torch.cumsum(C[:, i:i + 1] * V, 0) for i in range(r))
M01 = torch.tril(torch.ones(n, n, dtype=torch.float64))
checks["Eq. (5): Σ diag(b_i) cumsum(diag(c_i) V) = (B Cᵀ ⊙ M₀₁) V"] = (eq5 - (B @ C.T * M01) @ V).abs().max().item()
checks["λ-cumsum(X) = M_λ X  (O_i = X_i + λ O_{i-1})"] = (discounted_cumsum(V[None, None], lg)[0, 0] - M @ V).abs().max().item()
eq5d = sum(B[:, i:i + 1] * discounted_cumsum((C[:, i:i + 1] * V)[None, None], lg)[0, 0] for i in range(r))
checks["App. C.1: Σ diag(b_i) λ-cumsum(diag(c_i) V) = (B Cᵀ ⊙ M_λ) V"] = (eq5d - reference(B[None, None], C[None, None], V[None, None], gamma)[0, 0]).abs().max().item()
pd.Series(checks, name="max |difference|").to_frame()''',
        '''display(Markdown(f"Complexity at N = {table_N}, r = d = 128 (flops per head):"))
complexity.table(table_N)''',
        '''# Theorem 4.1 (FleetAttention paper): masking cannot enlarge an approximation error in Frobenius
# norm, and in operator norm by at most L_n = O(log n) (triangular truncation, Bhatia 2000).
rows = []
for m in sizes:
    A = torch.randn(m, m, dtype=torch.float64)
    U, S, Vh = torch.linalg.svd(A)
    At = U[:, :m // 4] @ torch.diag(S[:m // 4]) @ Vh[:m // 4]          # rank-m/4 approximation
    Mm = torch.tril(torch.ones(m, m, dtype=torch.float64))
    E = A - At
    idx = torch.arange(m, dtype=torch.float64)
    H = 1.0 / (idx[:, None] - idx[None, :] + 0.5)                        # a matrix near the worst case
    rows.append(dict(n=m, frob_masked=(Mm * E).norm().item(), frob_full=E.norm().item(),
                     op_ratio_random=torch.linalg.matrix_norm(Mm * E, 2).item() / torch.linalg.matrix_norm(E, 2).item(),
                     op_ratio_hilbert=torch.linalg.matrix_norm(Mm * H, 2).item() / torch.linalg.matrix_norm(H, 2).item()))
thm = pd.DataFrame(rows)
thm["frobenius bound holds"] = thm.frob_masked <= thm.frob_full
assert thm["frobenius bound holds"].all()
slope = np.polyfit(np.log(thm.n), thm.op_ratio_hilbert, 1)[0]
display(Markdown(f"Operator-norm ratio on the Hilbert-type matrix grows like {slope:.3f}·ln n (Bhatia: ~ (1/π) ln n = {1/np.pi:.3f}·ln n)."))
thm''',
        '''import matplotlib.pyplot as plt
fig, ax = plt.subplots(figsize=(6, 3.5))
ax.plot(thm.n, thm.op_ratio_hilbert, marker="o", label="‖M⊙H‖₂ / ‖H‖₂ (Hilbert-type)")
ax.plot(thm.n, thm.op_ratio_random, marker="s", label="‖M⊙E‖₂ / ‖E‖₂ (random error)")
ax.set(xscale="log", xlabel="n", ylabel="norm ratio", title="Theorem 4.1: triangular truncation grows like log n")
ax.legend(fontsize=8); ax.grid(alpha=0.3); fig.tight_layout()
for ext in ("png", "svg"):
    fig.savefig(os.path.join(fig_dir, f"theorem41.{ext}"), dpi=120)''',
    ]),
    "long_prompts": ("# Long prompts: the companion paper's Figure 2\n"
                     "Speed-up over Vanilla for N = 1k … 512k (batch 1, heads 32, d = r = 128), with torch's "
                     "scaled-dot-product attention (softmax) as the reference, and peak memory per method.", [
        '''seqlens = [2 ** k for k in range(10, 20)]
methods = ["Vanilla", "Bb", "Cdotp", "Cdotp_torch", "FA", "LA", "Recur"]
dtype = "float16"
reps = 8
device = "cuda"
gpu = None
time_limit = 30.0
heads, rank, dim = 32, 128, 128
out_root = "."''',
        COMMON + '''import pandas as pd
from leetrepro import benchmark_method
if live:
    measured = T.measure(methods, batch_size=1, decay=False, dtype=dtype, seqlens=seqlens, reps=reps,
                         device=device, heads=heads, rank=rank, dim=dim, time_limit=time_limit)
    sdpa = benchmark_method(lambda B, C, V, g: torch.nn.functional.scaled_dot_product_attention(B, C, V, is_causal=True),
                            device=device, dtype=dtype, seqlens=seqlens, heads=heads, rank=rank, dim=dim,
                            reps=reps, time_limit=time_limit)
    sdpa["method"] = "SDPA (softmax)"
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
        display(t.rdiv(t["Vanilla"], axis=0))''',
        '''import matplotlib.pyplot as plt
fig, axes = plt.subplots(1, 2, figsize=(11, 4))
for m, g in ([] if ok is None else ok.groupby("method")):
    axes[0].plot(g.N, g.median_s, marker="o", label=m)
    axes[1].plot(g.N, g.peak_mem_GB, marker="o", label=m)
axes[0].set(xscale="log", yscale="log", xlabel="N", ylabel="latency (s)", title=f"batch 1, heads {heads}, {dtype}")
mem_known = ok is not None and ok.peak_mem_GB.notna().any()   # peak memory is measured on CUDA only
axes[1].set(xscale="log", yscale="log" if mem_known else "linear", xlabel="N",
            ylabel="peak memory (GB)" if mem_known else "peak memory (CUDA only: not measured here)")
for a in axes: a.grid(alpha=0.3)
axes[0].legend(fontsize=8); fig.tight_layout()
for ext in ("png", "svg"):
    fig.savefig(os.path.join(fig_dir, f"long_prompts.{ext}"), dpi=120)''',
    ]),
    "claims": ("# The paper's claims, checked from the data\n"
               "Each qualitative claim of Section 5.1 and Appendix D, computed from this GPU's tables "
               "(and, as a check of the checks, from the paper's own numbers).", [
        '''gpu = None
device = "cuda"
out_root = "."''',
        COMMON + '''import pandas as pd
from leetrepro.reproduce.claims import check_claims, paper_tables_as_measured
pd.set_option("display.max_colwidth", 200)
tables, sources = {}, {}
for t in (3, 4, 5, 6, 9):
    path = os.path.join(data_dir, f"table{t}.csv")
    df = pd.read_csv(path) if os.path.exists(path) else T.load_measured(gpu, f"table{t}.csv")
    if df is None and t != 9:
        bs, dec = T.TABLES[t]
        df = T.from_kernel_bench(gpu, bs, dec)
        sources[t] = "kernels.csv (partial)" if df is not None else "missing"
    elif df is None:
        k = T.load_measured(gpu, "kernels.csv")
        df = None if k is None else k[k.method.isin(["FA", "FA_modify"]) & (k.dtype == "float32")]
        sources[t] = "kernels.csv" if df is not None else "missing"
    else:
        sources[t] = f"table{t}.csv"
    tables[t] = df
display(Markdown("Sources: " + ", ".join(f"Table {t}: {s}" for t, s in sources.items())))
claims = check_claims(tables)
claims.insert(2, "on the paper's numbers", check_claims(paper_tables_as_measured()).holds)
claims.to_csv(os.path.join(data_dir, "claims.csv"), index=False)
claims''',
    ]),
    "llm": ("# Tables 7-8: the methods inside a linear-attention LLM\n"
            "The first two layers of TransNormerLLM-7B (Table 7) or toy-retnet-1.3B (Table 8) with "
            "**seeded random weights of the published shapes** (wall time does not depend on the "
            "values; `leetrepro.models.configs` cites the shapes), each attention method swapped in, "
            "over the stored prompt set (`data/prompts/lengths.csv`: 100 lengths in 6000-8192, "
            "seeded token ids). Protocol of Appendix A.1: 7 runs over the set, fastest and slowest "
            "dropped, mean ± sample std. The paper's totals are over 100 prompts; the comparison is "
            "per prompt. Then the equivalence table: each method's final hidden states against the "
            "float64 reference path.", [
        '''table = 7           # 7: TransNormerLLM-7B, 8: toy-retnet-1.3B
methods = ["Original", "Bb", "Cdotp", "Cdotp_torch", "FA", "FA_torch", "LA", "LA_torch", "Vanilla", "Recur", "Chunk"]
batch_sizes = [1, 2]
n_prompts = 100     # the paper's set size; fewer for a quicker look (the comparison is per prompt)
runs = 7
dtype = "float32"   # the paper's (toy-retnet-1.3B runs only in fp32)
device = "cuda"
tiny = False        # True: toy shapes for a CPU (CI)
max_len = None      # cut every prompt to this length (tiny runs)
time_limit = 120.0  # a method whose first run exceeds this is not run again
equiv_prompts = 2
gpu = None
out_root = "."''',
        COMMON + '''import pandas as pd
import matplotlib.pyplot as plt
from leetrepro.models import bench as L
model = {7: "transnormer", 8: "retnet"}[table]
name = f"table{table}"
if live:
    measured = L.measure(model, methods, batch_sizes, n_prompts=n_prompts, runs=runs, device=device,
                         dtype=dtype, tiny=tiny, max_len=max_len, time_limit=time_limit)
    measured.to_csv(os.path.join(data_dir, f"{name}.csv"), index=False)
    equiv = L.equivalence(model, methods, n_prompts=equiv_prompts, device=device, dtype=dtype,
                          tiny=tiny, max_len=max_len)
    equiv.to_csv(os.path.join(data_dir, f"{name}_equivalence.csv"), index=False)
else:
    measured, equiv = T.load_measured(gpu, f"{name}.csv"), T.load_measured(gpu, f"{name}_equivalence.csv")
assert measured is not None, f"no {name}.csv for {gpu}: run `make {name}` on that GPU"
p = measured.iloc[0]
display(Markdown(f"**{p.model}**, {p.gpu}, {p.dtype}, {p.prompts} prompts ({p.tokens} tokens), "
                 f"weights: {p.weights}; commit {p.commit}, {p.date}"))
both = L.side_by_side(measured, paper.load(table))
both.round(4)''',
        '''ok = measured[measured.status == "ok"]
fig, axes = plt.subplots(1, 2, figsize=(12, 4))
for ax, col, label in ((axes[0], "per_prompt_s", "seconds per prompt"), (axes[1], "peak_mem_GB", "peak memory (GB)")):
    if col in ok and ok[col].notna().any():
        ok.pivot(index="method", columns="batch", values=col).plot.bar(ax=ax, logy=True)
    ax.set(ylabel=label, title=f"Table {table}: {p.model}"); ax.grid(alpha=0.3, axis="y")
fig.tight_layout()
for ext in ("png", "svg"):
    fig.savefig(os.path.join(fig_dir, f"{name}.{ext}"), dpi=110)''',
        '''display(Markdown("**Claims of Section 5.2, from these data**"))
claims = L.check_claims(measured, table)
claims.to_csv(os.path.join(data_dir, f"{name}_claims.csv"), index=False)
claims''',
        '''display(Markdown("**Equivalence** (in place of the MMLU tables, which need the real weights): "
                 "final hidden states against the float64 reference path"))
equiv''',
    ]),
    "floor": ("# Distance to the memory floor (issue 5)\n"
              "Our kernels next to flash-linear-attention, timed in one process by `make floor` "
              "(`leetrepro.floor`): median / floor, where the floor is (|B|+|C|+|V|+|O|)·bytes over "
              "the copy bandwidth measured in the same run; then `method=\"auto\"` from `make tune` "
              "(`data/<gpu>/dispatch.csv`) and its regret against the best method per cell.", [
        '''gpu = None
device = "cuda"
measure = False     # True on a GPU: run the benchmark now (minutes) instead of reading floor.csv
out_root = "."''',
        COMMON + '''import pandas as pd
import matplotlib.pyplot as plt
from leetrepro import floor as F
path = os.path.join(data_dir, "floor.csv")
if live and measure:
    F.main(["--out", data_dir])
df = pd.read_csv(path) if os.path.exists(path) else T.load_measured(gpu, "floor.csv")
assert df is not None, f"no floor.csv for {gpu}: run `make floor` on that GPU"
p = df.iloc[0]
display(Markdown(f"GPU {p.gpu}, commit {p.commit}, {p.date}; copy bandwidth {p.copy_TBps:.2f} TB/s"))
ok = df[df.status == "ok"]
colors = {m: f"C{i}" for i, m in enumerate(sorted(ok.method.unique()))}  # one colour per entry
cells = [(dt, b, dec) for dt in ok.dtype.unique() for b in sorted(ok.batch.unique()) for dec in (False, True)]
fig, axes = plt.subplots(len(ok.dtype.unique()), 4, figsize=(16, 3.4 * len(ok.dtype.unique())), squeeze=False)
for ax, (dt, b, dec) in zip(axes.flat, cells):
    for m, g in ok[(ok.dtype == dt) & (ok.batch == b) & (ok.decay == dec)].groupby("method"):
        ax.plot(g.N, g.floor_ratio, marker="o", label=m, color=colors[m])
    ax.axhline(1.3, color="k", ls="--", lw=0.8)
    ax.set(xscale="log", yscale="log", xlabel="N", ylabel="time / floor",
           title=f"{dt}, batch {b}, {'decay' if dec else '0-1 mask'}")
    ax.grid(alpha=0.3)
for row in axes:
    row[0].legend(fontsize=8)
fig.tight_layout()
for ext in ("png", "svg"):
    fig.savefig(os.path.join(fig_dir, f"floor.{ext}"), dpi=110)''',
        '''t = F.targets(df)
display(Markdown(f"**Targets met: {(t.met == 'yes').sum()} of {(t.met != '-').sum()}** "
                 "(`-`: the fp32-contract path, reported without a target)"))
t''',
        '''cols = ["dtype", "batch", "decay", "N", "method", "median_s", "floor_ratio", "vs_fla",
        "vs_original", "rel_error", "workspace_MB"]
ok[[c for c in cols if c in ok]].round(4)''',
        '''disp = T.load_measured(gpu, "dispatch.csv")
if disp is None:
    display(Markdown(f"No `data/{gpu}/dispatch.csv`: run `make tune` on that GPU."))
else:
    display(Markdown(f"`method=auto`: regret against the best method per cell, max "
                     f"{disp.regret.max() * 100:.1f}%, median {disp.regret.median() * 100:.1f}% "
                     f"over {len(disp)} cells"))
    display(disp[["dtype", "batch", "decay", "N", "best", "best_s", "auto", "auto_s", "regret"]].round(5))''',
    ]),
}


def build():
    for name, (intro, cells) in NOTEBOOKS.items():
        nb = nbf.v4.new_notebook()
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
        nb.cells.append(nbf.v4.new_markdown_cell(intro))
        params = nbf.v4.new_code_cell(cells[0])
        params.metadata["tags"] = ["parameters"]
        nb.cells.append(params)
        nb.cells += [nbf.v4.new_code_cell(c) for c in cells[1:]]
        for i, cell in enumerate(nb.cells):  # stable ids: rebuilding changes only what changed
            cell["id"] = f"{name}-{i}"
        nbf.write(nb, os.path.join(HERE, f"{name}.ipynb"))


if __name__ == "__main__":
    build()
