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
# # Tables 7-8: the methods inside a linear-attention LLM
# The first two layers of TransNormerLLM-7B (Table 7) or toy-retnet-1.3B (Table 8) with **seeded random weights of the published shapes** (wall time does not depend on the values; `leetrepro.models.configs` cites the shapes), each attention method swapped in, over the stored prompt set (`data/prompts/lengths.csv`: 100 lengths in 6000-8192, seeded token ids). Protocol of Appendix A.1: 7 runs over the set (after a warm-up that compiles every kernel the set needs: `leetrepro.bench.llm.warm_up`), fastest and slowest dropped, mean ± sample std (`runs` fewer: all kept). `set_limit` (seconds) caps one run of any linear-time method (set it above the fast methods' run time): a method whose run would exceed it runs on the first prompts only and its total is scaled to the set by tokens (`prompts_timed`, `extrapolated` say so per row). The paper's totals are over 100 prompts; the comparison is per prompt. Then the equivalence table: each method's final hidden states against the float64 run of the same formulation (the operator methods: the reference path; Original: the model's own computation).

# %% tags=["parameters"]
table = 7           # 7: TransNormerLLM-7B, 8: toy-retnet-1.3B
methods = ["Original", "Bb", "Cdotp", "Cdotp_torch", "FA", "FA_torch", "LA", "LA_torch", "Vanilla", "Recur", "Chunk"]
batch_sizes = [1, 2]
n_prompts = 100     # the paper's set size; fewer for a quicker look (the comparison is per prompt)
runs = 7
dtype = "float32"   # the paper's (toy-retnet-1.3B runs only in fp32)
device = "cuda"
tiny = False        # True: toy shapes for a CPU (CI)
max_len = None      # cut every prompt to this length (tiny runs)
time_limit = 120.0  # a method whose first run exceeds this is not run again
set_limit = None    # seconds: a linear-time method whose run exceeds it runs on the first prompts, total scaled by tokens
equiv_prompts = 2
gpu = None
out_root = None     # where tables and figures go; None: scratch/ of the checkout (make: RESULTS)

# %%
import os
from IPython.display import Markdown, display
from leetrepro.reproduce import tables as T, paper
from leetrepro.reproduce.claims import record_verdicts
live, gpu, data_dir, fig_dir = T.notebook_setup(device, gpu, out_root)
import pandas as pd
import matplotlib.pyplot as plt
from leetrepro.bench import llm as L
model = {7: "transnormer", 8: "retnet"}[table]
name = f"table{table}"
if live:
    measured = L.measure(model, methods, batch_sizes, n_prompts=n_prompts, runs=runs, device=device,
                         dtype=dtype, tiny=tiny, max_len=max_len, time_limit=time_limit,
                         set_limit=set_limit)
    measured.to_csv(os.path.join(data_dir, f"{name}.csv"), index=False)
    equiv = L.equivalence(model, methods, n_prompts=equiv_prompts, device=device, dtype=dtype,
                          tiny=tiny, max_len=max_len)
    equiv.to_csv(os.path.join(data_dir, f"{name}_equivalence.csv"), index=False)
else:
    measured, equiv = T.load_measured(gpu, f"{name}.csv"), T.load_measured(gpu, f"{name}_equivalence.csv")
assert measured is not None, f"no {name}.csv for {gpu}: run `make {name}` on that GPU"
p = measured.iloc[0]
cut = measured[measured.get("extrapolated", pd.Series(False, index=measured.index)).fillna(False).astype(bool)]
display(Markdown(f"**{p.model}**, {p.gpu}, {p['dtype']}, {p.prompts} prompts ({p.tokens} tokens), "
                 f"{measured.runs.max():.0f} run(s) over the set, weights: {p.weights}; commit {p.commit}, {p.date}"
                 + ("; timed on fewer prompts, totals scaled by tokens: " + ", ".join(
                     f"{r.method} b{r.batch} ({r.prompts_timed:.0f} prompts)" for r in cut.itertuples())
                    if len(cut) else "")))
both = L.side_by_side(measured, paper.load(table))
both.round(4)

# %%
ok = measured[measured.status == "ok"]
fig, axes = plt.subplots(1, 2, figsize=(13, 4.2))
# seconds per prompt as points on a log axis (bars on a log axis start nowhere), ours beside the
# paper's (its total over 100 prompts / 100), per batch size
pp = both.dropna(subset=["per_prompt_s"]) if "per_prompt_s" in both else both.iloc[:0]
order = sorted(set(pp.method))
for i, (batch, g) in enumerate(pp.groupby("batch")):
    g = g.set_index("method").reindex(order)
    xs = [j + 0.25 * i for j in range(len(order))]
    axes[0].plot(xs, g.per_prompt_s, "o", color=f"C{i}", label=f"{T.gpu_name(gpu)}, batch {batch}")
    axes[0].plot(xs, g.paper_per_prompt_s, "s", mfc="none", color=f"C{i}", label=f"paper, batch {batch}")
axes[0].set_xticks(range(len(order)), order, rotation=45, ha="right", fontsize=8)
axes[0].set(yscale="log", ylabel="seconds per prompt (mean over the runs)",
            title=f"Table {table}: {p.model}")
axes[0].legend(fontsize=7)
T.readable_log(axes[0], "y")
if "peak_mem_GB" in ok and ok.peak_mem_GB.notna().any():
    ok.pivot(index="method", columns="batch", values="peak_mem_GB").plot.bar(ax=axes[1])
axes[1].set(ylabel="peak memory (GB)", title=f"peak memory, {T.gpu_name(gpu)}")
for ax in axes:
    ax.grid(alpha=0.3, axis="y")
fig.tight_layout()
T.stamp(fig, measured)
for ext in ("png", "svg"):
    fig.savefig(os.path.join(fig_dir, f"{name}.{ext}"), dpi=110)

# %%
display(Markdown("**Claims of Section 5.2 in the paper's wording, from these data** (this project's "
                 "re-implementations; the paper's own numbers judged the same way beside them)"))
claims = L.check_claims(measured, table)
own = L.check_claims(L.paper_as_measured(paper.load(table)), table).set_index("claim").holds
claims.insert(2, "on the paper's numbers", claims.claim.map(own))
claims.to_csv(os.path.join(data_dir, f"{name}_claims.csv"), index=False)
record_verdicts(claims, f"{name}_claims", data_dir, gpu)  # the claims notebook compares runs
display(Markdown(f"Judged on {claims.gpus.iloc[0]}, commit(s) `{claims.commits.iloc[0]}`"
                 + (": one run." if claims.one_run.iloc[0] else ": **more than one run**.")))
claims.drop(columns=["gpus", "commits", "dates", "one_run"])

# %%
equiv = L.judge_equivalence(equiv)
judged = equiv[equiv.within_tol != "not judged"]
gap = equiv[(equiv.dtype == "float64") & (equiv.status == "ok")]
display(Markdown("**Equivalence** (in place of the MMLU tables, which need the real weights): "
                 "final hidden states against the float64 run of the same formulation (`against`), "
                 "each method held to a stated tolerance (`tol`; `leetrepro.bench.llm.judge_equivalence` "
                 f"says why): **{(judged.within_tol == 'yes').sum()} of {len(judged)}** judged methods "
                 "within it" + (f", {len(equiv) - len(judged)} row(s) not judged (FA_modify: wrong by "
                                "design; the float64 row: a gap between formulations; or did not run)"
                                if len(equiv) > len(judged) else "")
                 + (f". The model's own formulation and the operator's differ by "
                    f"{gap.rel_diff.iloc[0]:.1e} in float64, by design, not rounding" if len(gap) else "")))
equiv

# %% [markdown]
# ## Conclusions (written from the data above)

# %%
lines = []
if "per_prompt_s" in both:
    for batch, g in both.dropna(subset=["per_prompt_s"]).groupby("batch"):
        fast = g.sort_values("per_prompt_s").iloc[0]
        pg = g.dropna(subset=["paper_per_prompt_s"]).sort_values("paper_per_prompt_s")
        lines.append(f"* batch {batch}: fastest here **{fast.method}** ({fast.per_prompt_s:.3f} s per "
                     f"prompt)" + (f"; the paper's fastest {pg.iloc[0].method}" if len(pg) else "") + ".")
held = (claims.holds == "yes").sum() if "holds" in claims else 0
lines.append(f"* Claims of Section 5.2: {held} of {len(claims)} hold on these data.")
lines.append(f"* Equivalence: {(judged.within_tol == 'yes').sum()} of {len(judged)} judged methods "
             f"within their stated tolerance of the float64 run of their formulation"
             + (f"; the model's own formulation is {gap.rel_diff.iloc[0]:.1e} from the operator's in "
                f"float64." if len(gap) else "."))
display(Markdown("\n".join(lines)))
