"""The claims of the other papers, judged on this project's measurements (``make eca``,
``make related``): ECA's operation counts, exactness, error and speed; the kernel paper's 3.3× and
3.6× against Gated Linear Attention.

Each judgment is a row like :mod:`leetrepro.reproduce.claims`' (claim, source, holds, evidence,
gap, and where its data come from), with ``holds`` one of ``supported`` (the data show it),
``inconclusive`` (the data straddle it, or the deciding difference is within the noise
``bench.llm.SIGNIFICANT``), ``not shown`` (the data go against it) or ``not measured``.
"""
from __future__ import annotations

from fractions import Fraction

from ..bench.harness import runs_of
from ..bench.llm import SIGNIFICANT
from .claims import claim_row, ok_rows

ECA_SOURCE = "Exact Causal Attention (Rybin et al., 2025)"
KERNEL_SOURCE = "Linear attention GPU kernel (arXiv 2510.21956)"
#: the kernel paper's numbers (an NVIDIA A6000, against flash-linear-attention's GLA)
KERNEL_SPEEDUP, KERNEL_MEMORY = 3.3, 3.6


def _row(claim, source, holds, evidence, gap=None, tables=()):
    """:mod:`claims`' row, with the deciding gap and where the tables read come from."""
    return dict(claim_row(claim, source, holds, evidence), gap=gap, **runs_of(tables))


def notebook_machines(name: str, csv: str, gpus, measure_gpu: bool, out_root):
    """What the other papers' notebooks start with: ``(out_root, fig_dir, cpu_dir, live_gpu,
    gpus)``. The CPU rows are always measured here (``cpu_dir``: ``<out_root>/data/cpu``); the
    GPUs shown are ``gpus`` (None: every ``data/<tag>/`` with ``csv``) and, with
    ``measure_gpu`` and a GPU on this machine, that one, measured now (``live_gpu``). Folders
    are made; the notebook says where its rows come from."""
    import os

    import torch
    from IPython.display import Markdown, display

    from .._device import gpu_tag
    from .._paths import data as committed
    from .tables import output_root
    out_root = output_root(out_root)
    fig_dir = os.path.join(out_root, "figures", name)
    cpu_dir = os.path.join(out_root, "data", "cpu")
    for folder in (fig_dir, cpu_dir):
        os.makedirs(folder, exist_ok=True)
    live_gpu = gpu_tag("cuda") if measure_gpu and torch.cuda.is_available() else None
    if gpus is None:
        gpus = [t for t in os.listdir(committed())
                if os.path.exists(committed(t, csv)) and t != "cpu"]
    gpus = sorted(set(gpus) | ({live_gpu} if live_gpu else set()))
    display(Markdown(
        f"CPU rows: measured now on this machine's CPU ({torch.get_num_threads()} threads). "
        "GPU rows: " + (", ".join(f"**{g.upper()}** " + (
            "measured now" if g == live_gpu else f"re-rendered from the committed `data/{g}/`")
            for g in gpus) or "none here")))
    return out_root, fig_dir, cpu_dir, live_gpu, gpus


def gpu_tables(gpu: str, live: bool, out_root: str, parts, names) -> list:
    """The tables ``names`` of one GPU: measured now by ``bench.related`` (its ``parts``) into
    ``<out_root>/data/<gpu>/`` where ``live``, else the committed ``data/<gpu>/`` ones (None for
    a file that is not there)."""
    import os

    import pandas as pd

    from ..bench import related
    from .tables import load_measured
    if not live:
        return [load_measured(gpu, name) for name in names]
    folder = os.path.join(out_root, "data", gpu)
    related.main(["--out", folder, "--parts", *parts])
    return [pd.read_csv(os.path.join(folder, name), dtype={"commit": str}) for name in names]


def faster_verdict(ratios) -> tuple[str, float]:
    """``ratios``: time of the baseline ÷ time of the method, per cell. ``supported`` where the
    method is faster beyond the noise in every cell, ``not shown`` where it is slower beyond it
    in every cell, else ``inconclusive``; and the gap that decides (the smallest ratio − 1)."""
    ratios = list(ratios)
    lo, hi = min(ratios), max(ratios)
    if lo > 1 + SIGNIFICANT:
        return "supported", lo - 1
    if hi < 1 - SIGNIFICANT:
        return "not shown", hi - 1
    return "inconclusive", lo - 1


def at_least_verdict(values, target: float) -> tuple[str, float]:
    """A factor claimed to be ``target``: ``supported`` where every cell reaches it (within the
    noise), ``not shown`` where none does, else ``inconclusive``; gap: smallest ÷ target − 1."""
    values = list(values)
    lo, hi = min(values), max(values)
    if lo >= target * (1 - SIGNIFICANT):
        return "supported", lo / target - 1
    if hi < target * (1 - SIGNIFICANT):
        return "not shown", hi / target - 1
    return "inconclusive", lo / target - 1


def eca_counts(seqlens=(1024, 4096, 16384), r: int = 128, depths=(0, 1)):
    """Rows of the operation counts (:func:`leetrepro.methods.eca.operation_count`) per stage, N
    and recursion depth, beside the paper's formula and the standard lower-triangular count."""
    import pandas as pd

    from ..methods import eca
    rows = []
    for depth in depths:
        for n in seqlens:
            for stage in ("1", "2"):
                c = eca.operation_count(n, r, stage=stage, depth=depth)
                standard = n * (n + 1) // 2 * r
                rows.append(dict(stage=stage, N=n, r=r, depth=depth, full_products=c.products["full"],
                                 half_products=c.products["half"], counted=float(c.paper),
                                 counted_over_N2r=float(c.paper / (n * n * r)),
                                 paper_over_N2r=float(eca.paper_fraction(depth)),
                                 equal=c.paper == eca.paper_fraction(depth) * n * n * r,
                                 exact_with_diagonals=c.exact, standard=standard,
                                 exact_vs_standard=c.exact / standard,
                                 performed_vs_standard=c.performed / standard,
                                 block_additions=c.adds))
    return pd.DataFrame(rows)


def eca_claims(counts, exact: bool | None, errors=None, times=None, stages=None, *,
               machine: str = "cpu", run: dict | None = None):
    """ECA's claims on one machine: ``counts`` (:func:`eca_counts`), ``exact`` (the identities
    held in integer arithmetic), ``errors``/``times``/``stages`` the CSVs of
    ``bench.related`` (``eca_errors.csv``, ``eca.csv``, ``eca_stages.csv``) or None. ``run``:
    the provenance (:func:`leetrepro.bench.harness.provenance`) of the code that counted and
    checked the identities, named by the claims that read no measured table."""
    import pandas as pd
    rows = []
    here = () if run is None else (pd.DataFrame([run]),)
    base = counts[counts.depth == 0]
    rows.append(_row(
        "Stages I and II each take 29/64·L²d multiplications, 9.4 % fewer than the "
        "lower-triangular product's L²d/2", "Sec. 2.1-2.2",
        "supported" if base.equal.all() else "not shown",
        f"counted over the algorithms as run ({len(base)} stage × N cells, N = "
        f"{base.N.min()}-{base.N.max()}): {base.counted_over_N2r.iloc[0]:.6f}·N²r each "
        f"(29/64 = {29 / 64:.6f}); with the half products' diagonals counted, "
        f"{base.exact_vs_standard.min():.4f}-{base.exact_vs_standard.max():.4f}× the standard "
        f"N(N+1)r/2", tables=here))
    deep = counts[counts.depth > 0]
    if len(deep):
        by = deep.groupby("depth").counted_over_N2r.first()
        rows.append(_row(
            "recursion into the 10 half products brings this to 4/9·L²d (11.1 % fewer)",
            "Sec. 2.1", "supported" if deep.equal.all() else "not shown",
            "; ".join(f"depth {d}: {f:.5f}·N²r ({(1 - 2 * f) * 100:.2f} % fewer)"
                      for d, f in by.items()) +
            f"; 24/64 + 10/64·c per level tends to 4/9 = {4 / 9:.5f} (−11.11 %) only in the "
            f"limit (depth 1 gives {float(Fraction(24, 64) + Fraction(10, 64) * Fraction(29, 64)):.5f})",
            tables=here))
    rows.append(_row("ECA is exact: its output equals the standard product's", "Abstract, Sec. 2",
                     "not measured" if exact is None else ("supported" if exact else "not shown"),
                     "int64 inputs, both stages and the transposed form, with and without "
                     "recursion: identical to torch's products"
                     if exact else "", tables=here))
    e = ok_rows(errors)
    if e is not None and len(e[e.arithmetic == "in-dtype"]):
        d = e[e.arithmetic == "in-dtype"].pivot_table(index="dtype", columns="entry",
                                                      values="rel_error")
        ratios = (d["ECA"] / d["standard"]).dropna()
        holds = "supported" if ((ratios >= 1) & (ratios <= 4.5)).all() else \
            ("not shown" if (ratios < 1).all() else "inconclusive")
        rows.append(_row(
            "ECA's rounding error is about 2× the standard product's (2-4× in Tables 3-4)",
            "Sec. 3.4, Tables 3-4", holds,
            "arithmetic in the dtype, ECA ÷ standard relative error: " +
            ", ".join(f"{k} {v:.2f}×" for k, v in ratios.items()), tables=(errors,)))
    t, st = ok_rows(times), ok_rows(stages)
    if t is not None and len(t):
        w = t.pivot_table(index="N", columns="entry", values="median_s")
        best = w[[c for c in ("standard", "Vanilla") if c in w]].min(axis=1)
        op = best / w["ECA"]  # > 1: ECA faster
        ev = (f"r = d = {int(t.r.iloc[0])}, forward: ECA takes "
              + ", ".join(f"{1 / x:.2f}×" for x in op) +
              f" the faster standard product's time at N = {', '.join(map(str, w.index))}")
        cells = None
        if st is not None and len(st):
            sw = st.pivot_table(index=["stage", "L", "d"], columns="entry", values="median_s")
            torch_col = sw[[c for c in sw.columns if c.startswith("torch")]].min(axis=1)
            cells = pd.DataFrame({"standard": sw["standard"] / sw["ECA"],
                                  "torch": torch_col / sw["ECA"]})
            ev += "; one stage alone at large d, ECA's time ÷ the standard lower-triangular " \
                  "product's and ÷ torch.matmul's (the paper's baseline, the whole product): " + \
                  ", ".join(f"stage {s} L={L} d={dd} {1 / r_.standard:.2f}×, {1 / r_.torch:.2f}×"
                            for (s, L, dd), r_ in cells.iterrows())
        if machine == "cpu":
            claim = ("where multiplications are what costs (a CPU, the paper's edge setting), "
                     "ECA's fewer multiplications make it faster")
            # judged where the block products are compute-bound (one stage at large d), against
            # the product that needs the same lower triangle; at the operator's head shapes the
            # blocks' inner dimension is r/4 and multiplications are not what costs
            judged = cells.standard if cells is not None else op
            verdict, gap = faster_verdict(judged)
            ev = ("judged on " + ("the stages at large d" if cells is not None else
                                  "the operator's shapes") + " against the standard product; " + ev)
        else:
            claim = "on a GPU ECA brings no gain: its intermediates are materialised"
            judged = list(op) + ([] if cells is None else list(cells.max(axis=1)))
            # no gain: in no cell faster beyond the noise than the faster standard form
            verdict = "supported" if max(judged) <= 1 + SIGNIFICANT else \
                ("not shown" if min(judged) > 1 + SIGNIFICANT else "inconclusive")
            gap = max(judged) - 1
        rows.append(_row(claim, "Sec. 1, 4", verdict, f"{machine.upper()}: {ev}", gap,
                         tables=(times, stages)))
    return pd.DataFrame(rows)


def _passes(rows) -> str:
    """What computed the normaliser's passes around the operator in these rows: their
    ``passes`` column; rows without one predate the passes' kernels (PyTorch's composition)."""
    kinds = set(rows.passes.dropna()) if "passes" in rows else set()
    names = {"kernels": "its passes on Triton kernels",
             "composition": "its passes by PyTorch's composition",
             "sweep": "its forward one sweep of Chunk's kernel, its backward's passes on Triton "
                      "kernels",
             "sweep+sweeps": "the normaliser inside Chunk's sweeps, forward and backward",
             "kernels+sweeps": "its forward's passes on Triton kernels, its backward inside "
                               "Chunk's sweeps"}
    return " and ".join(names.get(k, k) for k in sorted(kinds)) or names["composition"]


def _graph_ratios(ours, gla, column: str) -> str:
    """The same ratios from the layer's CUDA-graph times (``graph_s``), where a time ratio was
    judged eagerly and both entries have them: the GPU's work without the host's launches, said
    beside the eager verdict (the paper does not say how it timed)."""
    if column != "median_s" or "graph_s" not in ours or "graph_s" not in gla:
        return ""
    both = ours[["graph_s"]].join(gla[["graph_s"]].rename(columns={"graph_s": "graph_s_gla"}),
                                  how="inner").dropna()
    if not len(both):
        return ""
    return "; replayed from CUDA graphs " + ", ".join(
        f"{x:.2f}×" for x in both["graph_s_gla"] / both["graph_s"])


def kernel_paper_claims(layer=None, lm=None):
    """The kernel paper's 3.3× speed and 3.6× memory against GLA, in a layer (fwd + bwd) and in
    a language model's training step, from ``kernel_paper_layer.csv`` and ``kernel_paper_lm.csv``."""
    import pandas as pd
    ours, gla = "leetrepro (1+x)", "fla chunk_gla"
    rows = []
    for what, df, mode in (("an attention layer (forward + backward)", layer, "fwd+bwd"),
                           ("a 1.4B language model's training step", lm, None)):
        d = df if df is None or mode is None else df[df["mode"] == mode]
        for kind, column, target in (("faster", "median_s", KERNEL_SPEEDUP),
                                     ("less memory", "peak_bytes", KERNEL_MEMORY)):
            claim = f"{target}× {kind} than Gated Linear Attention in {what}"
            if d is None or not len(d[d.entry == ours]):
                rows.append(_row(claim, KERNEL_SOURCE, "not measured", ""))
                continue
            keys = [k for k in ("N", "batch", "heads", "head_dim", "seq") if k in d]
            a = d[d.entry == ours].set_index(keys)
            b = d[d.entry == gla].set_index(keys)
            failed = b[b.status != "ok"] if len(b) else b
            gla_col = b[b.status == "ok"][[column]].rename(columns={column: f"{column}_gla"})
            good = a[a.status == "ok"].join(gla_col, how="inner")
            good = good.dropna(subset=[column, f"{column}_gla"])
            if not len(good):
                why = failed.status.iloc[0] if len(failed) else "GLA (fla-core) not installed here"
                rows.append(_row(claim, KERNEL_SOURCE, "not measured", f"GLA did not run: {why}",
                                 tables=(df,)))
                continue
            ratios = good[f"{column}_gla"] / good[column]
            verdict, gap = at_least_verdict(ratios, target)
            rows.append(_row(claim, KERNEL_SOURCE, verdict,
                             f"GLA ÷ this project's normalised linear attention ({_passes(good)}): "
                             + ", ".join(f"{x:.2f}×" for x in ratios) + _graph_ratios(a, b, column)
                             + f" (the paper: {target}× on an A6000)", gap, tables=(df,)))
    return pd.DataFrame(rows)


def parse_eca_tables(text: str):
    """ECA's Tables 1-4 from the paper's text: ``(times, errors)`` DataFrames. Times (Tables 1-2,
    an RTX 4090, fp32, 400 runs): stage, L, d, entry, mean_ms, std_ms. Errors (Tables 3-4, L =
    4096, d = 128, against fp64): table, entry (``standard`` for the paper's "Baseline", or
    ``ECA``), dtype, max_abs_error, mean_abs_error."""
    import re

    import pandas as pd
    times, errors = [], []
    stage = None
    for line in text.splitlines():
        if line.startswith("torch.matmul"):
            stage, baseline = ("II", "torch.matmul(P, V)") if "ECA Stage II" in line else \
                ("I", "torch.matmul(Q, K.t()).tril_()")
        shape = re.match(r"L=(\d+),d=(\d+)", line)
        # "14.2±0.214.2\pm 0.2 ms": the plain cell, then its LaTeX (which repeats the mean)
        cells = re.findall(r"(\d+\.\d+)±([\d.]+?)(?=\1\\pm)", line)
        if shape and len(cells) == 2 and stage:
            for entry, (mean, std) in zip((baseline, "ECA"), cells):
                times.append(dict(stage=stage, L=int(shape[1]), d=int(shape[2]), entry=entry,
                                  mean_ms=float(mean), std_ms=float(std)))
        err = re.match(r"(Baseline|ECA Stage (I|II)) (fp32|fp16|bf16) ([\d.e+-]+) ([\d.e+-]+)$",
                       line.strip())
        if err:
            table = 3 + sum(1 for e in errors if e["entry"] == "standard" and
                            e["dtype"] == err[3])
            if err[1].startswith("ECA"):
                table = 3 if err[2] == "I" else 4
            errors.append(dict(table=table, entry="standard" if err[1] == "Baseline" else "ECA",
                               dtype=err[3], max_abs_error=float(err[4]),
                               mean_abs_error=float(err[5])))
    return pd.DataFrame(times), pd.DataFrame(errors)


PAPER_TIMES, PAPER_ERRORS = "eca_times.csv", "eca_errors.csv"


def main(argv=None) -> int:
    """``python -m leetrepro.reproduce.other_papers ECA.txt``: rewrite ``data/paper/eca_*.csv``
    from the paper's text."""
    import argparse
    import os

    from .._paths import data
    p = argparse.ArgumentParser(description=main.__doc__.split("\n")[0])
    p.add_argument("paper", help="the ECA paper as text (exact-causal-attention.txt)")
    args = p.parse_args(argv)
    with open(args.paper, encoding="utf-8") as f:
        times, errors = parse_eca_tables(f.read())
    for name, df in ((PAPER_TIMES, times), (PAPER_ERRORS, errors)):
        df.to_csv(os.path.join(data("paper"), name), index=False)
        print(f"wrote data/paper/{name} ({len(df)} rows)")
    return 0


if __name__ == "__main__":
    import sys
    sys.exit(main())
