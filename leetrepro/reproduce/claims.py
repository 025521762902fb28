"""The qualitative claims of Section 5.1 and Appendix D, each checked against measured tables.

``check_claims(tables)`` takes {3: df, 4: df, 5: df, 6: df, 9: df} (any may be missing or partial;
columns method, N, mean_s, status) and returns one row per claim: ``holds`` is "yes", "no" or
"not measured", with the evidence computed from the data. Thresholds that the paper leaves vague
are stated in the claim's wording here.
"""
from __future__ import annotations

import numpy as np

from .._dtypes import SHORT_NAMES, parse_dtype
from ..bench.harness import runs_of

TWINS = (("LA", "LA_torch"), ("FA", "FA_torch"), ("Cdotp", "Cdotp_torch"))


def ok_rows(df):
    """The rows of ``df`` that ran (``status == "ok"``); None for no table."""
    return df[df.status == "ok"] if df is not None else None


def _times(df, method):
    d = ok_rows(df)
    if d is None:
        return {}
    g = d[d.method == method]
    return dict(zip(g.N, g.mean_s))


def claim_row(claim, source, holds, evidence):
    """One judged claim (the other papers' claims add their gap and provenance)."""
    return dict(claim=claim, source=source, holds=holds, evidence=evidence)


def _verdict(flags):
    return "not measured" if not flags else ("yes" if all(flags) else "no")


#: the growth models a latency curve is tested against: t = a·f(N) + b (b the fixed cost)
GROWTH = {"N": lambda n: n, "N log N": lambda n: n * np.log(n), "N²": lambda n: n ** 2}


def best_growth(n, t) -> tuple[str, dict]:
    """The model of :data:`GROWTH` that explains ``t(N)`` best, and each model's rms relative
    residual: least squares with an intercept on relative errors (every point counts alike,
    whatever its size). All models have two parameters, so the smallest residual is also the best
    by AIC; :func:`aic_gap` says by how much."""
    n, t = np.asarray(n, dtype=float), np.asarray(t, dtype=float)
    res = {}
    for name, f in GROWTH.items():
        A = np.stack([f(n), np.ones_like(n)], 1) / t[:, None]
        coef, *_ = np.linalg.lstsq(A, np.ones_like(t), rcond=None)
        res[name] = float(np.sqrt(np.mean((A @ coef - 1) ** 2)))
    return min(res, key=res.get), res


def aic_gap(res: dict, model: str, points: int) -> float:
    """AIC(model) − AIC(best) for least-squares fits with equal parameter counts: n·ln(RSS ratio).
    Below 2 the data do not tell the two apart (the usual reading of AIC differences)."""
    return points * 2 * float(np.log(res[model] / min(res.values())))


#: the AIC difference below which two fits are not told apart (:func:`aic_gap`)
AIC_THRESHOLD = 2.0


def growth_verdict(res: dict, points: int, claimed: str = "N log N") -> str:
    """Whether timings fitted by :func:`best_growth` (``res``: each model's rms residual over
    ``points`` points) show the ``claimed`` growth: ``"supported"`` where it fits best and
    a·N + b is worse by more than :data:`AIC_THRESHOLD`; ``"inconclusive"`` where the best fit
    and the runner-up that decides (a·N + b, or the claimed model where another fits best) are
    within it: the data do not tell them apart; else ``"not shown"``."""
    best = min(res, key=res.get)
    rival = "N" if best == claimed else claimed
    if aic_gap(res, rival, points) <= AIC_THRESHOLD:
        return "inconclusive"
    return "supported" if best == claimed else "not shown"


def claim_linear(tables):
    ev, flags, fits = [], [], 0
    for t in (3, 4, 5, 6):
        d = ok_rows(tables.get(t))
        if d is None:
            continue
        for method, g in d.groupby("method"):
            if method == "Vanilla" or len(g) < 4:
                continue
            best, res = best_growth(g.N, g.mean_s)
            gap = aic_gap(res, "N", len(g))
            fits += 1
            flags.append(gap <= AIC_THRESHOLD)
            if not flags[-1]:
                ev.append(f"T{t} {method}: {best} fits better (rms rel. residual {res[best]:.2f} "
                          f"vs {res['N']:.2f}, ΔAIC {gap:.1f})")
    return claim_row("latency grows linearly in N for all but Vanilla: of t = a·N + b, a·N·log N + b "
                "and a·N² + b (fixed cost b included), no model explains a curve better than "
                "a·N + b (ΔAIC > 2)", "Sec. 5.1", _verdict(flags),
                "; ".join(ev[:6]) or (f"{fits} method×table curves, none explained better than by "
                                      f"a·N + b" if flags else ""))


def claim_vanilla_oom(tables):
    d = tables.get(3)
    if d is None or not len(d[d.method == "Vanilla"]):
        return claim_row("Vanilla runs out of memory beyond N = 8192 at batch 1", "Sec. 5.1, Table 3",
                    "not measured", "")
    v = d[d.method == "Vanilla"].sort_values("N")
    oom = v[v.status == "OOM"].N.tolist()
    runs = v[v.status == "ok"].N.tolist()
    holds = bool(oom) and min(oom) > 8192 and all(n <= 8192 for n in runs)
    where = f"first OOM here at N = {min(oom)}" if oom else "never OOM here"
    return claim_row("Vanilla runs out of memory beyond N = 8192 at batch 1 (and not before)",
                "Sec. 5.1, Table 3", "yes" if holds else "no",
                f"{where}; ran up to N = {max(runs) if runs else '-'}")


def _columns(tables, table_ids, keep=lambda n: True):
    """(table, N, methods fastest first, mean time per method) for every column of the tables."""
    for t in table_ids:
        d = ok_rows(tables.get(t))
        if d is None:
            continue
        for n in sorted(set(d.N)):
            if keep(n):
                g = d[d.N == n]
                yield t, n, g.sort_values("mean_s").method.tolist(), g.set_index("method").mean_s


def claim_la_fastest(tables):
    flags, ev = [], []
    for t, n, order, times in _columns(tables, (3, 4), lambda n: n > 512):
        if "LA" not in times or len(order) < 2:
            continue
        others = times.drop("LA").min()
        flags.append(order[0] == "LA" and others >= 2 * times["LA"])
        if not flags[-1]:
            ev.append(f"T{t} N={n}: fastest {order[0]}, next/LA = {others / times['LA']:.2f}")
    return claim_row("batch 1, N > 512: LA fastest, by at least 2×", "Sec. 5.1, Tables 3-4",
                _verdict(flags), "; ".join(ev[:6]) or (f"{len(flags)} columns" if flags else ""))


def claim_vanilla_short(tables):
    flags, ev = [], []
    for t, n, order, _ in _columns(tables, (3, 4), lambda n: n <= 128):
        if "Vanilla" in order:
            flags.append(order[0] == "Vanilla")
            ev.append(f"T{t} N={n}: fastest {order[0]}")
    return claim_row("N ≤ 128: Vanilla fastest", "Sec. 5.1, Tables 3-4", _verdict(flags), "; ".join(ev))


def original_times(df, method: str) -> dict:
    """{N: (ours, original)} median seconds of ``method`` in the cells of ``df`` that the original
    code was measured in too (same GPU, dtype, batch, mask and N; ``data/anchors``)."""
    from ..bench.floor import original_times as anchored
    d = ok_rows(df)
    if d is None or "gpu" not in d:
        return {}
    out, cache = {}, {}
    for r in d[d.method == method].itertuples():
        orig = cache.setdefault(r.gpu, anchored(r.gpu, method))
        key = (SHORT_NAMES[parse_dtype(r.dtype)], int(r.batch), bool(r.decay), int(r.N))
        if key in orig:
            out[r.N] = (getattr(r, "median_s", r.mean_s), orig[key])
    return out


def against_original(df, method: str) -> str:
    """The evidence text of :func:`original_times`: the range of ours/original, or that the
    original was not measured in these cells ('' where ``df`` has no such method)."""
    d = ok_rows(df)
    if d is None or not len(d[d.method == method]):
        return ""
    pairs = original_times(df, method)
    where = f"the {d.gpu.iloc[0]}" if "gpu" in d and len(d) else "the measured GPU"
    if not pairs:
        return f"the original code's {method} was not measured on {where} in these cells (data/anchors)"
    ratios = [ours / orig for ours, orig in pairs.values()]
    span = f"{min(ratios):.2f}" + (f"-{max(ratios):.2f}" if max(ratios) - min(ratios) >= 0.005 else "")
    return (f"this project's {method} takes {span}× the original code's time on {where} "
            f"(data/anchors, N = {min(pairs)}-{max(pairs)})")


def _would_win(tables, table_ids, method: str) -> list[str]:
    """Over the columns the original code was measured in and ``method`` is not fastest here: in
    how many of them the original's time for it would be fastest, as one evidence sentence ([]
    where there are no such columns)."""
    lost = won = 0
    anchored = {t: original_times(tables.get(t), method) for t in table_ids}
    for t, n, order, times in _columns(tables, table_ids):
        orig = anchored[t].get(n)
        if orig is not None and order[0] != method:
            lost += 1
            won += orig[1] < times.drop(method).min()
    return [f"with the original code's {method} times it would be fastest in {won} of the {lost} "
            f"columns measured by both"] if lost else []


def claim_cdotp_batch16(tables):
    flags, ev = [], []
    for t, n, order, _ in _columns(tables, (5, 6)):
        if "Cdotp" in order and len(order) > 1:
            flags.append(order[0] == "Cdotp")
            if not flags[-1]:
                ev.append(f"T{t} N={n}: fastest {order[0]}")
    verdict = _verdict(flags)
    if verdict == "no":
        ev = ev[:6] + [f"T{t}: {note}" for t in (5, 6) if (note := against_original(tables.get(t), "Cdotp"))]
        ev += _would_win(tables, (5, 6), "Cdotp")
    return claim_row("batch 16: Cdotp fastest at every N", "Sec. 5.1, Tables 5-6", verdict,
                "; ".join(ev) or
                (f"{len(flags)} columns" if flags else ""))


def claim_batch_scaling(tables):
    flags, worst = [], (0.0, "")
    for t1, t16 in ((3, 5), (4, 6)):
        a, b = ok_rows(tables.get(t1)), ok_rows(tables.get(t16))
        if a is None or b is None:
            continue
        m = a.merge(b, on=["method", "N"], suffixes=("_1", "_16"))
        for r in m.itertuples():
            ratio = r.mean_s_16 / r.mean_s_1
            flags.append(ratio < 16)
            if ratio > worst[0]:
                worst = (ratio, f"{r.method} N={r.N} (T{t16}/T{t1})")
    return claim_row("batch 16 costs less than 16× batch 1", "Sec. 5.1", _verdict(flags),
                f"largest batch-16/batch-1 ratio {worst[0]:.1f}× at {worst[1]}" if flags else "")


def claim_twins(tables):
    ratios = []
    for t in (3, 4, 5, 6):
        d = ok_rows(tables.get(t))
        if d is None:
            continue
        for gpu, twin in TWINS:
            a, b = _times(d, gpu), _times(d, twin)
            ratios += [(b[n] / a[n], f"{gpu} T{t} N={n}") for n in a if n in b]
    claim = "CUDA/Triton methods 2×-20× faster than their PyTorch twins (both ends tested)"
    if not ratios:
        return claim_row(claim, "Sec. 5.1", "not measured", "")
    lo, hi = min(ratios), max(ratios)
    below = sum(r < 2 for r, _ in ratios)
    above = sum(r > 20 for r, _ in ratios)
    inside = len(ratios) - below - above
    return claim_row(claim, "Sec. 5.1", "yes" if below == above == 0 else "no",
                f"{lo[0]:.1f}× ({lo[1]}) to {hi[0]:.0f}× ({hi[1]}) over {len(ratios)} cells: "
                f"{below} below 2×, {inside} within 2-20×, {above} above 20×")


def claim_recur(tables):
    close, far, ev = [], [], []
    for t, n, _, times in _columns(tables, (3, 4, 5, 6)):
        if "Recur" not in times or len(times) < 2:
            continue
        rel = times["Recur"] / times.drop("Recur").min()
        decayed = t in (4, 6)
        (far if decayed else close).append(rel >= 10 if decayed else rel <= 3)
        ev.append(f"T{t} N={n}: {rel:.1f}× best")
    holds = "not measured" if not close or not far else \
        ("yes" if all(close) and all(far) else "no")
    return claim_row("Recur within 3× of the best without decay, ≥ 10× slower than the best with it",
                "Sec. 5.1", holds, "; ".join(ev[:8]))


def claim_fa_modify(tables):
    d = ok_rows(tables.get(9))
    flags, ev = [], []
    if d is not None:
        for key, g in d.groupby(["batch", "decay", "N"]):
            t = g.set_index("method").mean_s
            if {"FA", "FA_modify"} <= set(t.index):
                r = t["FA_modify"] / t["FA"]
                flags.append(0.35 <= r <= 0.65)
                ev.append(r)
    evidence = f"FA_modify/FA from {min(ev):.2f} to {max(ev):.2f} over {len(ev)} cells" if ev else ""
    return claim_row("FA_modify takes about half the time of FA (ratio 0.35-0.65)", "App. D, Table 9",
                _verdict(flags), evidence)


def claim_fa_long(tables):
    """The companion paper: FleetAttention is the fastest method beyond 64k tokens."""
    d = ok_rows(tables.get("long"))
    claim = "beyond 64k tokens FleetAttention is the fastest method (companion paper)"
    if d is None or "FA" not in set(d.method):
        return claim_row(claim, "FleetAttention paper", "not measured", "")
    d = d[~d.method.str.contains("softmax", case=False)]
    flags, ev = [], []
    for n, g in d[d.N > 65536].groupby("N"):
        order = g.sort_values("mean_s").method.tolist()
        if "FA" in order:
            times = g.set_index("method").mean_s
            flags.append(order[0] == "FA")
            ev.append(f"N={n}: fastest {order[0]}, FA {times['FA'] / times.min():.1f}× the best")
    if ev:
        ev.append(against_original(tables.get("long"), "FA"))
        ev += _would_win({"long": d}, ("long",), "FA")
    return claim_row(claim, "FleetAttention paper", _verdict(flags), "; ".join(ev))


CLAIMS = (claim_linear, claim_vanilla_oom, claim_la_fastest, claim_vanilla_short,
          claim_cdotp_batch16, claim_batch_scaling, claim_twins, claim_recur, claim_fa_modify,
          claim_fa_long)

#: what every verdict is about
JUDGED = ("this project's re-implementations of the paper's methods (PyTorch twins, Triton and "
          "CUDA kernels), not the paper's own code")


class _Reads(dict):
    """The tables, noting which of them a claim reads (its evidence's provenance)."""

    def __init__(self, tables):
        super().__init__(tables)
        self.read: set = set()

    def get(self, key, default=None):
        self.read.add(key)
        return super().get(key, default)

    def __getitem__(self, key):
        self.read.add(key)
        return super().__getitem__(key)


def check_claims(tables: dict):
    """One row per claim (see the module docstring), with ``judged`` (what the verdict is about)
    and where the tables that claim read come from (:func:`bench.harness.runs_of`: ``gpus``,
    ``commits``, ``dates``, and ``one_run``: one commit, the claim judged on one run)."""
    import pandas as pd
    tables = {k: v for k, v in tables.items() if v is not None}
    rows = []
    for claim in CLAIMS:
        reads = _Reads(tables)
        row = claim(reads)
        rows.append(dict(row, judged=JUDGED, **runs_of(tables.get(k) for k in reads.read)))
    return pd.DataFrame(rows)


def paper_tables_as_measured():
    """The paper's own Tables 3-6 and 9 in the measured layout: the claims checked on the
    paper's numbers (a sanity check of the checks)."""
    from . import paper
    out = {}
    for t in (3, 4, 5, 6, 9):
        p = paper.load(t).copy()
        p["status"] = ["OOM" if c == "OOM" else "ok" for c in p.cell]
        out[t] = p
    return out


#: every judgment of every claim on one GPU, kept beside its claims files: one row per (claims
#: file, claim, commits judged on), so that a later run can say which verdicts changed
HISTORY = "claims_history.csv"
HISTORY_COLUMNS = ("file", "claim", "holds", "evidence", "gap", "gpus", "commits", "dates")


def _by_date(history, *keys):
    """The history's rows in the order of their latest date (within ``keys`` first)."""
    def latest(dates):
        return max(dates.split()) if isinstance(dates, str) and dates.strip() else ""
    at = history.assign(_at=history.dates.map(latest))
    return at.sort_values([*keys, "_at"], kind="stable").drop(columns="_at")


def record_verdicts(claims, file: str, data_dir: str, gpu: str):
    """Adds one judgment (``claims``: the rows of a claims table, with ``holds``, ``evidence``,
    ``commits``, ``dates`` and, where a comparison of times decides, ``gap``) to the GPU's verdict
    history :data:`HISTORY`, read from ``data_dir`` or else from the committed ``data/<gpu>/``
    and written to ``data_dir``. ``file``: the claims table's name ("claims", "table7_claims", ...).
    A claim judged again on the same commits replaces its row (the rules may have changed); the
    paper's own numbers and claims judged on nothing measured are not recorded. Returns the
    history."""
    import os

    import pandas as pd

    from .tables import load_measured
    path = os.path.join(data_dir, HISTORY)
    old = pd.read_csv(path, dtype={"commit": str}) if os.path.exists(path) else \
        load_measured(gpu, HISTORY)
    new = claims.assign(file=file).reindex(columns=list(HISTORY_COLUMNS))
    new = new[~new.commits.isin(["none", "paper"])].assign(gap=lambda d: d.gap.round(5))
    both = new if old is None else pd.concat([old, new], ignore_index=True)
    both = both.drop_duplicates(["file", "claim", "commits"], keep="last")
    both = _by_date(both, "file").reset_index(drop=True)
    both.to_csv(path, index=False)
    return both


def verdict_changes(history, noise: float | None = None):
    """The claims whose latest verdict differs from the one before it on other runs: one row each
    with both verdicts, their commits and evidence, and ``why``. A flip is *within noise* where the
    comparison that decides it (``gap``) was within ``noise`` of flipping in both judgments (default
    :data:`bench.llm.SIGNIFICANT`, the share of a time no run-to-run difference is taken to reach);
    otherwise the measurements moved by more than that, or the verdict rests on a count or a fit
    (no ``gap``), and the evidence says how."""
    import pandas as pd
    if noise is None:
        from ..bench.llm import SIGNIFICANT as noise
    rows = []
    for (file, claim), g in _by_date(history).groupby(["file", "claim"], sort=False):
        if len(g) < 2 or g.holds.iloc[-1] == g.holds.iloc[-2]:
            continue
        a, b = g.iloc[-2], g.iloc[-1]
        if pd.notna(a.gap) and pd.notna(b.gap):
            within = abs(a.gap) <= noise and abs(b.gap) <= noise
            why = (f"within noise: decided by a gap of {a.gap:+.1%}, then {b.gap:+.1%}, both "
                   f"under the {noise:.0%} no run-to-run difference is taken to reach" if within else
                   f"a move beyond noise: the deciding gap went from {a.gap:+.1%} to {b.gap:+.1%} "
                   f"(the methods or the software measured changed between these commits)")
        else:
            why = "decided by a count or a fit, not one gap: the evidence says what moved"
        rows.append(dict(file=file, claim=claim, earlier=a.holds, now=b.holds,
                         earlier_commits=a.commits, now_commits=b.commits,
                         earlier_evidence=a.evidence, now_evidence=b.evidence, why=why))
    return pd.DataFrame(rows, columns=["file", "claim", "earlier", "now", "earlier_commits",
                                       "now_commits", "earlier_evidence", "now_evidence", "why"])
