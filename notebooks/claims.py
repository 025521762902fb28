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
# # The paper's claims, checked from the data
# Each qualitative claim of Section 5.1 and Appendix D (and the companion paper's claim about FleetAttention beyond 64k tokens), computed from this GPU's tables (and, as a check of the checks, from the paper's own numbers). Growth claims are decided by which of t = a·N + b, a·N·log N + b, a·N² + b explains each curve (least squares with the fixed cost b, AIC); range claims ("2×–20×") test both ends.

# %% tags=["parameters"]
gpu = None
device = "cuda"
out_root = None     # where tables and figures go; None: scratch/ of the checkout (make: RESULTS)

# %%
import os
from IPython.display import Markdown, display
from leetrepro.reproduce import tables as T
live, gpu, data_dir, fig_dir = T.notebook_setup(device, gpu, out_root)
import pandas as pd
from leetrepro.reproduce.claims import (check_claims, paper_tables_as_measured, record_verdicts,
                                        verdict_changes)
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
long_path = os.path.join(data_dir, "long_prompts.csv")
tables["long"] = pd.read_csv(long_path) if os.path.exists(long_path) else T.load_measured(gpu, "long_prompts.csv")
sources["long prompts"] = "long_prompts.csv" if tables["long"] is not None else "missing"
display(Markdown("Sources: " + ", ".join(f"Table {t}: {s}" for t, s in sources.items())))
claims = check_claims(tables)
claims.insert(2, "on the paper's numbers", check_claims(paper_tables_as_measured()).holds)
claims.to_csv(os.path.join(data_dir, "claims.csv"), index=False)
history = record_verdicts(claims, "claims", data_dir, gpu)
every = " ".join(sorted(set(" ".join(claims.commits).split()) - {"none"}))
display(Markdown(f"Every verdict below concerns {claims.judged.iloc[0]}. Judged on data of commit(s) "
                 f"`{every}`; " + ("each claim on one run (its commit is in the last column)."
                                   if claims.one_run.all() else
                                   "**some claims mix runs** (`one_run` says which): a full `make "
                                   "reproduce` on one commit judges every claim on one run.")))
claims.drop(columns=["judged", "one_run", "gpus", "dates"])

# %% [markdown]
# ## Conclusions (written from the data above)

# %%
here = claims.holds.value_counts().to_dict()
own = claims["on the paper's numbers"].value_counts().to_dict()
n_yes, n_no, n_none = here.get("yes", 0), here.get("no", 0), here.get("not measured", 0)
display(Markdown(
    f"On {T.gpu_words(gpu, live)} {n_yes} of {len(claims)} claims {'holds' if n_yes == 1 else 'hold'}, {n_no} "
    f"{'does' if n_no == 1 else 'do'} not"
    + (f", {n_none} {'is' if n_none == 1 else 'are'} not measured" if n_none else "")
    + f"; on the paper's own numbers {own.get('yes', 0)} hold under the same thresholds. Holding here: "
    + ("; ".join(claims[claims.holds == "yes"].claim) or "none") + "."))

# %% [markdown]
# ## Verdicts against the earlier runs on this GPU
# Every judgment of a claim is kept in `data/<gpu>/claims_history.csv` (this notebook's claims and those of Tables 7-8, which their notebook records; `make reproduce` runs this notebook after them). Below: each claim whose verdict now differs from its judgment on the runs before, and why: *within noise* where the comparison that decides it was within the run-to-run margin of flipping both times, else what moved.

# %%
changes = verdict_changes(history)
judged_before = history.groupby(["file", "claim"]).commits.nunique().gt(1).sum()
display(Markdown(
    f"{len(history.groupby(['file', 'claim']))} claims recorded on {T.gpu_words(gpu, live)}, {judged_before} "
    "of them judged on earlier runs as well: "
    + (f"**{len(changes)} verdict(s) changed** against those runs." if len(changes) else
       "no verdict changed against those runs." if judged_before else "no earlier judgment to compare with.")))
changes
