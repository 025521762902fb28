"""The results page: every measured table of the project, written from ``data/`` alone.

``make results`` (``python -m leetrepro.reproduce.results``) reads the committed measurements of each
GPU (``data/<gpu>/*.csv``, every row naming its GPU, commit and date) and writes
``figures/results.md``: what was measured where and at which commit, the correctness matrices'
counts, the distance to the memory floor beside flash-linear-attention, training, serving,
sequence parallelism and the paper's claims per GPU. Nothing on the page is typed by hand; a test
holds the committed page to what this module writes from the committed data.

``figures/results.md`` opens with one screen of answers (this project against the best peer
measured, per area and GPU) and the short sections; the long grids are pages of their own in
``figures/results/``, linked from it.

    python -m leetrepro.reproduce.results [--root .] [--check]
"""
from __future__ import annotations

import argparse
import glob
import math
import os
import sys

from .. import _paths

#: the main page, relative to the repository root, and the folder of its topic pages
PAGE = os.path.join("figures", "results.md")
TOPIC_DIR = os.path.join("figures", "results")
#: data folders that hold no GPU's own measurements
NOT_GPUS = ("paper", "anchors", "prompts")
#: the floor's target cells: (dtype, batch, N, Chunk's entry), both masks each; fp32 through
#: tf32 products (``Chunk``) and through the exact ones (``Chunk/tf32x3``, which fla has not)
FLOOR_CELLS = (("fp16", 16, 25600, "Chunk"), ("bf16", 16, 25600, "Chunk"),
               ("fp16", 1, 100000, "Chunk"), ("bf16", 1, 100000, "Chunk"),
               ("fp16", 1, 8192, "Chunk"), ("bf16", 1, 8192, "Chunk"),
               ("fp32", 16, 25600, "Chunk"), ("fp32", 1, 100000, "Chunk"),
               ("fp32", 16, 25600, "Chunk/tf32x3"), ("fp32", 1, 100000, "Chunk/tf32x3"))


def gpu_folders(root: str | None = None) -> list[str]:
    """The tags of ``data/`` that hold a GPU's (or a host's) measurements, sorted."""
    root = root or _paths.data()
    return sorted(t for t in os.listdir(root)
                  if os.path.isdir(os.path.join(root, t)) and t not in NOT_GPUS)


def _read(tag: str, name: str):
    import pandas as pd
    path = _paths.data(tag, name)
    # (commit hashes as text: "7e07502" would read as a float)
    return pd.read_csv(path, dtype={"commit": str}) if os.path.exists(path) else None


def _commits(df) -> str:
    """The short commits of a table's rows (a claims table names its data's in ``commits``)."""
    if "commit" in df:
        found = {str(c)[:7] for c in df.commit.dropna()}
    elif "commits" in df:
        found = {c[:7] for cs in df.commits.dropna() for c in str(cs).split()}
    else:
        return "-"
    return ", ".join(sorted(found))


def _run(df) -> str:
    """``GPU; commit(s); date(s)`` of a table's rows: the caption every table carries."""
    gpu_col = "gpu" if "gpu" in df else ("gpus" if "gpus" in df else None)
    gpu = ", ".join(sorted({g.strip() for gs in df[gpu_col].dropna() for g in str(gs).split(";")})) \
        if gpu_col else "-"
    date_col = "date" if "date" in df else ("dates" if "dates" in df else None)
    dates = sorted({d[:10] for ds in df[date_col].dropna() for d in str(ds).split()}) if date_col else []
    span = dates[0] if len(dates) == 1 else (f"{dates[0]} … {dates[-1]}" if dates else "-")
    return f"{gpu}; commit {_commits(df)}; {span}"


def _table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def _x(v, digits: int = 2) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.{digits}f}×"


def measured_where(tags: list[str]) -> str:
    rows = []
    for tag in tags:
        for path in sorted(glob.glob(_paths.data(tag, "*.csv"))):
            df = _read(tag, os.path.basename(path))
            rows.append([f"`{tag}/{os.path.basename(path)}`", len(df), _run(df)])
    return _table(["file", "rows", "GPU; commit; date"], rows)


def correctness(tags: list[str]) -> str:
    """Per correctness file: cases, how many passed, failed, and were reported but not judged."""
    rows = []
    for tag in tags:
        for path in sorted(glob.glob(_paths.data(tag, "correctness*.csv"))):
            df = _read(tag, os.path.basename(path))
            status = df.status.astype(str)
            failed = int(status.str.startswith("FAIL").sum())
            judged = ~status.str.startswith("unsafe")
            methods = ", ".join(sorted(set(df.abbr.dropna()))) if "abbr" in df else "-"
            rows.append([f"`{tag}/{os.path.basename(path)}`", methods, int(judged.sum()), failed,
                         int((~judged).sum()), _commits(df)])
    return _table(["file", "methods", "judged", "failed", "reported, not judged", "commit"], rows)


def floor_cells(tags: list[str]) -> str:
    """Chunk and flash-linear-attention at the floor's target cells (time ÷ floor), per GPU, and
    Chunk's time on the second GPU ÷ the first where both were measured."""
    frames = {t: df for t in tags if (df := _read(t, "floor.csv")) is not None}
    if not frames:
        return "(no floor.csv measured yet: `make floor` on a GPU)"
    header = ["cell"] + [f"{t.upper()} {m}" for t in frames for m in ("Chunk", "fla")]
    both = len(frames) == 2
    if both:
        a, b = list(frames)
        header.append(f"Chunk's time, {b.upper()} ÷ {a.upper()}")
    rows = []
    for dtype, batch, n, entry in FLOOR_CELLS:
        exact = entry != "Chunk"
        for decay in (False, True):
            row, times = [f"{dtype}{' tf32x3' if exact else ''} b{batch} N={n} "
                          f"{'decay' if decay else '0-1'}"], []
            for df in frames.values():
                sel = df[(df.dtype == dtype) & (df.batch == batch) & (df.N == n)
                         & (df.decay == decay) & (df.status == "ok")].set_index("method")
                row += [_x(sel.floor_ratio.get(entry)), "-" if exact else _x(sel.floor_ratio.get("fla"))]
                times.append(sel.median_s.get(entry))
            if both:
                row.append("-" if None in times else f"{times[1] / times[0]:.2f}")
            rows.append(row)
    runs = "; ".join(f"{t.upper()}: {_run(df)}, copy {df.copy_TBps.iloc[0]:.2f} TB/s"
                     for t, df in frames.items())
    return _table(header, rows) + f"\n\nRuns: {runs}."


def dispatch(tags: list[str]) -> str:
    rows = []
    for tag in tags:
        df = _read(tag, "dispatch.csv")
        if df is None:
            continue
        best = df.best.value_counts()
        regret = df.regret.dropna() * 100
        rows.append([tag.upper(), len(df), ", ".join(f"{m} {c}" for m, c in best.items()),
                     f"{regret.median():+.1f} %", f"{regret.max():+.1f} %", _commits(df)])
    return _table(["GPU", "cells", "fastest method (cells)", "auto's regret, median",
                   "auto's regret, largest", "commit"], rows)


def training(tags: list[str]) -> str:
    parts = []
    for tag in tags:
        df = _read(tag, "train.csv")
        if df is None:
            continue
        ok = df[df.status == "ok"]
        if "mode" not in ok:  # files measured before graph rows: every call eager
            ok = ok.assign(mode="eager")
        ok = ok.sort_values(["mode", "batch", "N"], kind="stable")
        rows = [[r.mode, r.method, r.dtype, r.batch, r.N, "decay" if r.decay else "0-1",
                 f"{r.fwd_bwd_ms:.2f} ms", _x(r.floor_ratio), f"{r.peak_extra_GiB:.2f}",
                 f"{r.grads_GiB:.2f}"] for r in ok.itertuples()]
        parts.append(f"{tag.upper()} ({_run(df)}; floor: 11 passes at the measured copy "
                     f"bandwidth; entries compared within one mode, eager calls or CUDA graph "
                     f"replays):\n\n" + _table(
                         ["mode", "method", "dtype", "batch", "N", "mask", "forward + backward",
                          "× floor", "peak beyond inputs, GiB", "gradients, GiB"], rows))
        sweeps = _read(tag, "train_sweeps.csv")
        if sweeps is not None:
            cells = sweeps.pivot_table(index=["dtype", "batch", "N"], columns="sweep",
                                       values="floor_ratio", sort=False)
            rows = [[f"{dt} b{b} N={n}"] + [_x(cells.loc[(dt, b, n)].get(s))
                                            for s in ("step", "forward", "dual", "dB")]
                    for dt, b, n in cells.index]
            parts.append(f"Chunk's step taken apart (`train_sweeps.csv`; {_run(sweeps)}; each in "
                         f"a CUDA graph, × its own floor: the step 11 passes, forward 4, dual "
                         f"(dV, dC) 6, dB 4):\n\n"
                         + _table(["cell", "step", "forward", "dual", "dB"], rows))
        lm = _read(tag, "train_lm.csv")
        if lm is not None:
            last = lm.sort_values("step").groupby("method").tail(1).set_index("method")
            speed = lm[lm.step > lm.step.min()].groupby("method").tokens_per_s.median()
            rows = [[m, f"{last.loss[m]:.3f}", f"{speed[m] / 1e3:.0f}k"] for m in last.index]
            parts.append(f"A byte-level language model trained once per method "
                         f"(`make train`; {_run(lm)}; {int(lm.layers.iloc[0])} layers × "
                         f"{int(lm.dim.iloc[0])}, batch {int(lm.batch.iloc[0])} × "
                         f"{int(lm.seq_len.iloc[0])} bytes):\n\n"
                         + _table(["method", "final loss, nats/byte", "tokens/s (median)"], rows))
    return "\n\n".join(parts) or "(no train.csv measured yet: `make bench-train` on a GPU)"


#: the layouts tables of a GPU (``make layouts``, ``make bench-layer``): file, how it was timed
LAYOUT_FILES = (("layouts.csv", "eager"), ("layouts_graph.csv", "CUDA graph"),
                ("layouts_shapes.csv", "eager"), ("layouts_shapes_graph.csv", "CUDA graph"),
                ("layouts_fla.csv", "eager"), ("layouts_fla_graph.csv", "CUDA graph"),
                ("layouts_fla_heads.csv", "eager"), ("layouts_fla_heads_graph.csv", "CUDA graph"),
                ("layouts_float16_graph.csv", "CUDA graph"),
                ("layouts_float32_graph.csv", "CUDA graph"))


def layouts(tags: list[str]) -> str:
    """Per GPU and layouts file: each cell's entries, forward and forward + backward, × floor,
    ÷ head-major's time and ÷ fla's in the same process; then one attention layer's step."""
    parts = []
    for tag in tags:
        for name, mode in LAYOUT_FILES:
            df = _read(tag, name)
            if df is None:
                continue
            if "vs_best" in df and (df.method == "auto").any():
                parts.append(auto_table(tag, name, mode, df))
                continue
            ok = df[df.status == "ok"].to_dict("records")
            cells = sorted({(r["dtype"], r["r"], r["d"], r["heads"], r["batch"], r["N"])
                            for r in ok}, key=lambda c: (c[1], c[2], c[4]))
            rows = []
            for cell in cells:
                for r in ok:
                    if (r["dtype"], r["r"], r["d"], r["heads"], r["batch"], r["N"]) != cell:
                        continue
                    rows.append([f"{cell[0]} r={cell[1]} d={cell[2]} h{cell[3]} b{cell[4]} "
                                 f"N={cell[5]}", r["entry"], r.get("method", "Chunk"),
                                 r["pass"], f"{r['ms']:.3f} ms", _x(r["floor_ratio"]),
                                 _x(r["vs_head_major"]), _x(r["vs_fla"])])
            parts.append(f"{tag.upper()}, `{name}` ({mode}; {_run(df)}; floor: forward "
                         f"2(r + d), forward + backward 6r + 5d bytes per row and head; entries "
                         f"of a cell interleaved in one process):\n\n" + _table(
                             ["cell", "layout", "method", "pass", "time", "× floor",
                              "÷ head-major", "÷ fla"], rows))
        packed = _read(tag, "prefill_layouts.csv")
        if packed is not None:
            rows = [[r["method"], r["dtype"], r["batch"], f"{r['ms']:.3f} ms", _x(r["floor_ratio"])]
                    for r in packed.to_dict("records")]
            parts.append(f"Packed prompts (`cu_seqlens`), head-major `Chunk` against the drop-in "
                         f"`chunk_simple_gla` on time-major q, k, v (`prefill_layouts.csv`, "
                         f"`bench.serve --parts prefill`; {_run(packed)}):\n\n" + _table(
                             ["entry", "dtype", "prompts", "time", "× floor"], rows))
        layer = _read(tag, "layer.csv")
        if layer is not None:
            rows = [[r["entry"], f"{r['dtype']} h{r['heads']} r=d={r['r']} b{r['batch']} "
                     f"N={r['N']}", f"{r['ms']:.2f} ms", f"{r['tokens_per_s'] / 1e6:.2f}M",
                     _op_time(r),
                     _x(r.get("vs_fla"))] for r in layer.to_dict("records") if r["status"] == "ok"]
            parts.append(f"One attention layer, forward + backward (`make bench-layer`; "
                         f"{_run(layer)}; eager; the operator's time: the step less the same "
                         f"layer's with the operator replaced by a copy of V whose backward "
                         f"feeds all three projections):\n\n" + _table(
                             ["entry", "cell", "step", "tokens/s", "operator (share)", "÷ fla"],
                             rows))
    return "\n\n".join(parts) or "(no layouts.csv measured yet: `make layouts` on a GPU)"


def auto_table(tag: str, name: str, mode: str, df) -> str:
    """A layouts file that times ``auto`` beside named methods, one row per cell: auto's time over
    the fastest method named (÷ best), forward / forward + backward, in each layout; the method
    auto ran; Chunk's and LA's forward + backward in the model layout (× floor)."""
    ok = df[df.status == "ok"]
    layouts_ = list(dict.fromkeys(ok.entry))
    cells = ["dtype", "r", "d", "heads", "batch", "N"]
    rows = []
    for cell, g in ok.groupby(cells, sort=True):
        def at(entry, method, pass_, col):
            x = g[(g.entry == entry) & (g.method == method) & (g["pass"] == pass_)][col]
            return x.iloc[0] if len(x) else None
        picks = sorted({str(p) for p in g[g.method == "auto"].picks.dropna()})
        rows.append([f"{cell[0]} {cell[1]}/{cell[2]} h{cell[3]} b{cell[4]} N={cell[5]}"]
                    + [f"{_x(at(e, 'auto', 'fwd', 'vs_best'))} / "
                       f"{_x(at(e, 'auto', 'fwd_bwd', 'vs_best'))}" for e in layouts_]
                    + [", ".join(picks) or "-",
                       _x(at("model", "Chunk", "fwd_bwd", "floor_ratio")),
                       _x(at("model", "LA", "fwd_bwd", "floor_ratio"))])
    auto = ok[ok.method == "auto"]
    worst = "; ".join(f"{p}: at most {auto[auto['pass'] == p].vs_best.max():.2f}×"
                      for p in ("fwd", "fwd_bwd") if (auto["pass"] == p).any())
    return (f"{tag.upper()}, `{name}`: `method=\"auto\"` against the fastest method named, in "
            f"the layouts and head shapes models use ({mode}; {_run(df)}; entries of a cell "
            f"interleaved in one process, each round in its own order, L2 flushed before every "
            f"call; fwd: the forward of a training step). auto ÷ best, {worst}:\n\n"
            + _table(["cell (r/d)"] + [f"{e}: fwd / fwd+bwd" for e in layouts_]
                     + ["auto ran", "Chunk fwd+bwd × floor (model)",
                        "LA fwd+bwd × floor (model)"], rows))


def _op_time(row: dict) -> str:
    """The operator's time in a layer's step and its share (``layer.csv``), or "-"."""
    op = row.get("op_ms")
    return "-" if op is None or op != op else f"{op:.2f} ms ({row['op_share']:.0%})"


def serving(tags: list[str]) -> str:
    parts = []
    for tag in tags:
        df = _read(tag, "serve.csv")
        if df is not None:
            rows = [[r.case, r.method, r.dtype, r.batch,
                     f"{r.ms:.3f} ms" if r.ms >= 0.1 else f"{r.ms * 1e3:.1f} µs",
                     _x(r.floor_ratio), "-" if r.host_us != r.host_us else f"{r.host_us:.0f}"]
                    for r in df.itertuples()]
            parts.append(f"{tag.upper()} ({_run(df)}):\n\n" + _table(
                ["case", "method", "dtype", "batch", "time", "× floor", "host µs"], rows))
        gen = _read(tag, "generation.csv")
        if gen is not None:
            host = gen.get("host_us_per_layer")
            rows = [[r.model, r.method, r.mode, r.batch, f"{r.ttft_ms:.1f}", f"{r.step_ms:.2f}",
                     f"{r.tokens_per_s:,.0f}",
                     "-" if host is None or host[i] != host[i] else f"{host[i]:.0f}",
                     "-" if r.agree != r.agree else f"{r.agree:.0%}"]
                    for i, r in zip(gen.index, gen.itertuples())]
            timed = "" if "timed" not in gen.columns else "\n\n" + "\n".join(
                f"- `{m}`: {t}" for m, t in gen.drop_duplicates("mode").set_index("mode").timed.items())
            parts.append(f"Generation in Tables 7-8's models, {tag.upper()} ({_run(gen)}):\n\n"
                         + _table(["model", "method", "mode", "batch", "first token, ms",
                                   "step, ms", "tokens/s", "host µs a layer", "tokens agreeing"],
                                  rows) + timed)
    return "\n\n".join(parts) or "(no serve.csv measured yet: `make bench-serve` on a GPU)"


def sequence_parallel(tags: list[str]) -> str:
    parts = []
    for tag in tags:
        df = _read(tag, "sp.csv")
        if df is None:
            continue
        # (by name: the column "pass" is a Python keyword, which itertuples renames by position)
        # (a cell whose memory estimate did not fit the GPUs: a row saying so, no numbers)
        rows = [[r["gpus"], r["N"], r["n_per_gpu"], r["pass"], f"{r['ms']:.2f} ms",
                 _x(r["floor_ratio"]), f"{r['exchange_ms']:.3f}", _x(r["speedup_vs_single"])]
                if r.get("status", "ok") == "ok" else
                [r["gpus"], r["N"], r["n_per_gpu"], r["pass"], "does not fit: not run", "-", "-", "-"]
                for r in df.to_dict("records")]
        parts.append(f"{tag} ({_run(df)}; {df.dtype.iloc[0]}, batch {df.batch.iloc[0]}, "
                     f"heads {df.heads.iloc[0]}):\n\n" + _table(
                         ["GPUs", "N", "rows per GPU", "pass", "time", "× floor",
                          "exchange, ms", "vs one GPU"], rows))
    return "\n\n".join(parts) or "(no sp.csv measured yet: `make bench-sp` on a host of GPUs)"


#: the claims tables of each GPU and where the claims come from when the table does not say
CLAIMS = (("claims.csv", None), ("table7_claims.csv", "Sec. 5.2, Table 7"),
          ("table8_claims.csv", "Sec. 5.2, Table 8"))


def _verdict(df, claim: str, source: str) -> str:
    """A claim's verdict in one machine's claims table, with the commits it was judged on."""
    sel = df[(df.claim == claim) & (df.source == source)]
    return f"{sel.holds.iloc[0]} ({_commits(sel)})" if len(sel) else "-"


def claims(tags: list[str]) -> str:
    """Every claim of the paper with its verdict on the paper's own numbers and on each GPU's."""
    import pandas as pd
    frames = {}
    for t in tags:
        parts = [df.assign(source=df.source if "source" in df else src)
                 for name, src in CLAIMS if (df := _read(t, name)) is not None]
        if parts:
            frames[t] = pd.concat(parts, ignore_index=True)
    if not frames:
        return "(no claims.csv yet: `make claims`)"
    first = next(iter(frames.values()))
    rows = []
    for r in first.to_dict("records"):
        rows.append([r["claim"], r["source"], r.get("on the paper's numbers", "-")]
                    + [_verdict(df, r["claim"], r["source"]) for df in frames.values()])
    header = ["claim", "source", "on the paper's numbers"] + [t.upper() for t in frames]
    return _table(header, rows) + "\n\nEach GPU's verdict names the commits of the data it was " \
        "judged on; `figures/<gpu>/claims.ipynb` (Tables 7-8: `figures/<gpu>/table7.ipynb`, " \
        "`table8.ipynb`) has the evidence."


#: the other papers' claims tables of each machine (``make eca``, ``make related``)
OTHER_CLAIMS = ("eca_claims.csv", "kernel_paper_claims.csv")


def other_papers(tags: list[str]) -> str:
    """The other papers' claims per machine (this project's CPU rows and each GPU's), then the
    kernel paper's layer and training step beside flash-linear-attention and softmax attention."""
    import pandas as pd

    from ..bench.related import LAYER_ENTRIES
    frames = {t: pd.concat(parts, ignore_index=True) for t in tags
              if (parts := [df for name in OTHER_CLAIMS if (df := _read(t, name)) is not None])}
    if not frames:
        return "(no eca_claims.csv yet: `make eca`, `make related`)"
    claims = list(dict.fromkeys((r.claim, r.source) for df in frames.values()
                                for r in df.itertuples()))
    rows = [[claim, source] + [_verdict(df, claim, source) for df in frames.values()]
            for claim, source in claims]
    text = _table(["claim", "source"] + [t.upper() for t in frames], rows)
    text += ("\n\n`supported`: the data show it; `inconclusive`: they straddle it, or the "
             "deciding difference is within the noise; `not shown`: they go against it. The "
             "evidence of each verdict is in `figures/eca/eca.ipynb` and "
             "`figures/related_methods/related_methods.ipynb`.")
    layer_rows = []
    for t in tags:
        for name, what in (("kernel_paper_layer.csv", "layer"), ("kernel_paper_lm.csv", "1.4B step")):
            df = _read(t, name)
            if df is None or "peak_bytes" not in df or df.peak_bytes.isna().all():
                continue
            df = df[df.status == "ok"]
            df = df[df["mode"] == "fwd+bwd"] if "mode" in df else df.assign(N=df.seq)
            for n, g in df.groupby("N"):
                cell = g.set_index("entry")
                layer_rows.append([t.upper(), what, int(n)] + [
                    _layer_cell(cell.loc[e]) if e in cell.index else "-"
                    for e in LAYER_ENTRIES] + [_commits(g)])
    if layer_rows:
        text += ("\n\nThe kernel paper's normalised linear attention (1 + x) on this project's "
                 "operator, forward + backward (bf16, time-major, batch 2 × 16 heads × 128; the "
                 "step: the whole 1.4B model with fused AdamW), eager time (and replayed from a "
                 "CUDA graph, where the row has one) and peak memory above the inputs:\n\n" +
                 _table(["GPU", "what", "N", *LAYER_ENTRIES, "commit"], layer_rows))
    return text


def _layer_cell(row) -> str:
    """One entry of the kernel paper's table: eager ms (the graph's beside it where measured),
    peak GiB."""
    import pandas as pd
    graph = row.get("graph_s")
    graph = f" (graph {graph * 1e3:.2f})" if pd.notna(graph) else ""
    return f"{row.median_s * 1e3:.2f} ms{graph}, {row.peak_bytes / 2 ** 30:.2f} GiB"


#: ``make bench-ssd``'s files: the package as it is first, then the earlier backwards NOTES.md
#: compares it with
SSD_FILES = (("ssd.csv", "as the package computes it"),
             ("ssd_falcon_rowdots.csv", "d_state 256's gates' gradient by the row dots' fp32 copies"),
             ("ssd_straddle.csv", "the straddle kernel walking each lane's segments in turn, "
                                  "PyTorch's per-row passes"),
             ("ssd_fp32_copies.csv", "the backward's sweeps on fp32 copies"),
             ("ssd_bf16_backward.csv", "the backward's sweeps in bf16, dg not yet exact"))


def ssd(tags: list[str]) -> str:
    """``make bench-ssd``'s cells: our Mamba-2 SSD (the drop-in) beside mamba_ssm's Triton
    kernels, per shape, pass and mode, each × its floor, and ours over theirs (> 1: slower);
    then the Mamba-2 LM trained with each (``ssd_lm.csv``)."""
    rows, lm_rows = [], []
    for tag in tags:
        for name, _ in SSD_FILES:
            df = _read(tag, name)
            if df is None:
                continue
            for (what, shape, pass_, mode), g in df.groupby(["what", "shape", "pass", "mode"],
                                                           sort=False):
                cell = g.set_index("entry")

                def at(entry):
                    if entry not in cell.index or cell.median_ms[entry] != cell.median_ms[entry]:
                        return "-"
                    floor = cell.vs_floor[entry]
                    return f"{cell.median_ms[entry]:.3f} ms" + \
                        (f" ({floor:.1f}× floor)" if floor == floor else "")
                ratio = cell.vs_peer.get("ours") if "ours" in cell.index else None
                rows.append([tag.upper(), name, f"{what} {shape}", pass_, mode, at("ours"),
                             at("mamba_ssm"), _x(ratio), _commits(g)])
        lm = _read(tag, "ssd_lm.csv")
        if lm is not None:
            for label, g in lm.groupby("method", sort=False):
                later = g[g.step > 10]  # (past the first steps' compilation and autotuning)
                lm_rows.append([tag.upper(), label, f"{later.tokens_per_s.median():,.0f}",
                                f"{g.loss.iloc[0]:.4f}", f"{g.loss.iloc[-1]:.4f}",
                                str(int(g.step.max())), _commits(g)])
    if not rows:
        return "Nothing measured yet."
    files = "; ".join(f"`{name}`: {what}" for name, what in SSD_FILES)
    text = ("bf16, a Mamba-2 layer's inputs (dt_bias, softplus, D). " + files + " (NOTES.md, "
            "\"Mamba-2's SSD on the operator: results\" and the sections after it):\n\n"
            + _table(["GPU", "file", "cell", "pass", "mode", "ours", "mamba_ssm",
                      "ours / mamba_ssm", "commit"], rows))
    if lm_rows:
        text += ("\n\nThe byte-level Mamba-2 LM (4 layers × 1024, batch 8 × 2048, bf16 autocast) "
                 "trained from the same weights on the same batches with each SSD: median "
                 "tokens/s past step 10, the first and the last logged loss (each the mean of "
                 "its 5 steps; a first loss far above ln 256 = 5.55 is an earlier embedding "
                 "init, NOTES.md):\n\n"
                 + _table(["GPU", "SSD", "tokens/s", "first loss", "last loss", "steps",
                           "commit"], lm_rows))
    return text


def _given(v) -> bool:
    """Whether a cell holds a number (not absent, not NaN)."""
    return v is not None and v == v


#: the model benchmark's files: the whole run, then re-measures of some mixers
MODEL_FILES = ("model.csv", "model_dropin.csv", "model_graphs.csv")


def model(tags: list[str]) -> str:
    """``make bench-model``'s rows: a decoder LM's training step with each token mixer, per GPU,
    size and mode, and the figure beside them."""
    rows, figures = [], []
    for tag, name in ((t, n) for t in tags for n in MODEL_FILES):
        df = _read(tag, name)
        if df is None:
            continue
        if name == MODEL_FILES[0]:
            figures.append(f"![{tag.upper()}](../{tag}/model.png)")  # (from figures/results/)
        for _, r in df.iterrows():
            ok = r.status == "ok"
            rows.append([tag.upper(), name, r["size"], r.mixer, r["mode"],
                         f"{r.ms:.1f}" if ok else "-",
                         f"{r.tokens_per_s / 1e3:.1f}k" if ok else "-",
                         _x(r.get("vs_leetrepro")) if ok else "-",
                         f"{r.peak_GiB:.1f}" if ok and _given(r.get("peak_GiB")) else "-",
                         f"{r.op_ms:.2f} ms ({r.op_share:.1%})"
                         if ok and _given(r.get("op_share")) else "-",
                         f"{r.op_ms / r.op_share / r.ms:.0%}"
                         if ok and _given(r.get("op_share")) and r.op_share > 0 else "-",
                         "ok" if ok else str(r.status)[:90], r.commit])
    if not rows:
        return "Nothing measured yet."
    return ("A decoder language model (pre-norm, fused q/k/v, SwiGLU, vocabulary 32k, bf16 weights, "
            "fused AdamW) trained a step at a time with its token mixer swapped, eager and with "
            "its blocks under `torch.compile`; medians of interleaved steps. `vs leetrepro`: "
            "tokens/s over the `leetrepro` mixer's in the same size and mode (above 1: faster). "
            "`operator`: the GPU time per step of the mixer's own kernels and its share of all "
            "kernels' time (`torch.profiler`; what each is: `leetrepro/bench/model.py`). "
            "`GPU busy`: all kernels' time per step over the step's wall time (from the same "
            "profile: the operator's time over its share); well below 100 %, the step waits on "
            "the host (Python and launches), not on the GPU. "
            "`model_dropin.csv`: the drop-in beside `causal_linear_decoder` again after its "
            "compiled decays stopped syncing with the host (NOTES.md). `model_graphs.csv`: "
            "eager, compiled and `graphs` (the blocks under "
            "`torch.compile(mode=\"reduce-overhead\")`: CUDA graphs replayed) in one run.\n\n"
            + "\n".join(figures) + "\n\n"
            + _table(["GPU", "file", "size", "mixer", "mode", "ms/step", "tokens/s", "vs leetrepro",
                      "peak GiB", "operator", "GPU busy", "status", "commit"], rows))


def hf(tags: list[str]) -> str:
    """``make bench-hf``'s rows: transformers' models trained and generating with each entry,
    per GPU, beside the same model on transformers' own fallback and on mamba_ssm's kernels."""
    rows = []
    for tag in tags:
        df = _read(tag, "hf.csv")
        if df is None:
            continue
        ok = df[df.status == "ok"]
        base = {(r.entry, r.model, r.what, r.batch): r.tokens_per_s for r in ok.itertuples()
                if r.entry in ("fallback", "mamba_ssm")}
        for r in df.itertuples():
            good = r.status == "ok"
            ratios = [base.get((peer, r.model, r.what, r.batch))
                      for peer in ("fallback", "mamba_ssm")]
            rows.append([tag.upper(), r.model, r.entry, r.what,
                         int(r.batch) if _given(r.batch) else "-",  # (a failed cell's too)
                         f"{r.ms:.1f}" if good else "-",
                         f"{r.tokens_per_s:,.0f}" if good else "-",
                         *(_x(r.tokens_per_s / ref) if good and ref else "-" for ref in ratios),
                         f"{r.peak_GiB:.1f}" if good and _given(r.peak_GiB) else "-",
                         "ok" if good else str(r.status)[:90],
                         str(getattr(r, "transformers", "-")), r.commit])
    if not rows:
        return "Nothing measured yet."
    return ("transformers' models (random weights, 24 layers, hidden 2048, bf16) with their "
            "Mamba-2 mixers on this project (`leetrepro.integrations.transformers.enable`), on "
            "transformers' own PyTorch fallback (no mamba_ssm, no causal-conv1d), and on "
            "mamba_ssm's Triton kernels where they were carried to the host. `train`: a step "
            "(forward, backward, fused AdamW) on batch × tokens, median ms, peak memory; "
            "`generate`: greedy new tokens after a 128-token prompt, each call after one of the "
            "same length (eager, host-bound). `vs fallback`, `vs mamba_ssm`: tokens/s over "
            "that entry's in the same cell; `transformers`: the release measured (hosts differ).\n\n"
            + _table(["GPU", "model", "entry", "what", "batch", "ms", "tokens/s", "vs fallback",
                      "vs mamba_ssm", "peak GiB", "status", "transformers", "commit"], rows))


def _geo(values) -> float:
    """Geometric mean of the finite positive values (NaN if none)."""
    vals = [float(v) for v in values if v == v and v > 0 and v != math.inf]
    return math.exp(sum(math.log(v) for v in vals) / len(vals)) if vals else math.nan


def _speed(ratio: float) -> str:
    """``their time ÷ ours`` as words: "1.9× faster" or "1.4× slower"."""
    if ratio != ratio:
        return "-"
    return f"{ratio:.2f}× faster" if ratio >= 1 else f"{1 / ratio:.2f}× slower"


def _gates_rows(tag: str):
    """``gates.csv`` of a GPU, or None; rows from before the bench timed two layouts are the
    ``model`` layout's."""
    df = _read(tag, "gates.csv")
    return df if df is None or "layout" in df else df.assign(layout="model")


def _answer_cells(tag: str) -> dict:
    """One GPU's answers: ``{area: "ratio (detail; commit)"}`` from its committed data."""
    out = {}
    floor = _read(tag, "floor.csv")
    if floor is not None:
        big = floor[(floor.N >= 8192) & floor.dtype.isin(["fp16", "bf16"])]
        ours = big[big.method == "Chunk"]
        if len(ours):
            out["forward"] = (f"{_speed(1 / _geo(ours.vs_fla))} (Chunk {ours.floor_ratio.min():.2f}"
                              f"-{ours.floor_ratio.max():.2f}× its floor; {_commits(big)})")
    train = _read(tag, "train.csv")
    if train is not None:
        g = train[(train["mode"] == "graph") & (train.status == "ok")]
        key = ["dtype", "batch", "N"]
        pair = g[g.method == "Chunk"].merge(g[g.method == "fla"], on=key, suffixes=("", "_fla"))
        if len(pair):
            out["training"] = (f"{_speed(_geo(pair.fwd_bwd_ms_fla / pair.fwd_bwd_ms))} (Chunk "
                               f"{pair.floor_ratio.min():.2f}-{pair.floor_ratio.max():.2f}× its "
                               f"floor; {_commits(g)})")
    serve = _read(tag, "serve.csv")
    if serve is not None:
        t = serve.set_index(["case", "method", "dtype", "batch"]).ms

        def ratio(case, ours, theirs):
            both = [(t[k[:1] + (theirs,) + k[2:]], t[k]) for k in t.index
                    if k[0] == case and k[1] == ours and k[:1] + (theirs,) + k[2:] in t.index]
            return _geo([a / b for a, b in both])
        out["prefill"] = f"{_speed(ratio('prefill_varlen', 'Chunk', 'fla'))} ({_commits(serve)})"
        out["decode"] = (f"{_speed(ratio('decode', 'decode_step_graph8', 'fla_graph8'))} "
                         f"({_commits(serve)})")
    gates = _gates_rows(tag)
    if gates is not None:
        # (the operator's own cost where it was measured apart from the projection's slicing)
        layout = "separate" if "separate" in set(gates.layout) else "model"
        gates = gates[gates.layout == layout]
        g = gates[(gates["pass"] == "fwd+bwd") & (gates["mode"] == "graph") &
                  (gates.entry == "gates")]
        f = gates[(gates["pass"] == "fwd") & (gates["mode"] == "graph") & (gates.entry == "gates")]
        if len(g):
            out["gates"] = (f"{_geo(g.vs_gamma):.2f}× the per-head decay's time forward + "
                            f"backward, {_geo(f.vs_gamma):.2f}× forward ({layout} layout; "
                            f"{_commits(gates)})")
    ssd_df = _read(tag, "ssd.csv")
    if ssd_df is not None:
        ours = ssd_df[(ssd_df.entry == "ours") & (ssd_df["mode"] == "graph") &
                      ssd_df.what.isin(["ssd", "block"])]  # (Mamba-2's; Mamba-3's rows apart)
        fb, fw = ours[ours["pass"] == "fwd+bwd"], ours[ours["pass"] == "fwd"]
        if len(fb):
            out["ssd"] = (f"{_speed(1 / _geo(fb.vs_peer))} forward + backward, "
                          f"{_speed(1 / _geo(fw.vs_peer))} forward ({_commits(ssd_df)})")
    lm = _read(tag, "model.csv")
    if lm is not None:
        ok = lm[lm.status == "ok"].set_index(["size", "mode", "mixer"]).tokens_per_s

        def lm_ratio(ours, theirs):
            return _geo([ok[k] / ok[k[:2] + (theirs,)] for k in ok.index
                         if k[2] == ours and k[:2] + (theirs,) in ok.index])
        out["model"] = (f"{_speed(lm_ratio('leetrepro', 'softmax SDPA'))} than softmax SDPA; "
                        f"Mamba-2 {_speed(lm_ratio('Mamba-2 leetrepro', 'Mamba-2 mamba_ssm'))} "
                        f"than mamba_ssm's ({_commits(lm)})")
    import pandas as pd
    checks = [_read(tag, os.path.basename(p))
              for p in sorted(glob.glob(_paths.data(tag, "correctness*.csv")))]
    if checks:
        status = pd.concat([c.status.astype(str) for c in checks])
        judged = int((~status.str.startswith("unsafe")).sum())
        failed = int(status.str.startswith("FAIL").sum())
        out["correctness"] = (f"{judged - failed} of {judged} cases pass, in {len(checks)} files "
                              f"(commits in [correctness](#correctness-against-the-float64-oracle))")
    return out


#: the answers' rows: (key, what is compared); tokens/s or time, geometric means over the cells
ANSWERS = (
    ("forward", "Forward at N ≥ 8192, fp16/bf16, against flash-linear-attention "
                "([floor](#distance-to-the-memory-floor))"),
    ("training", "Training step (forward + backward), CUDA graphs, against "
                 "flash-linear-attention ([training](results/training.md))"),
    ("prefill", "Packed prefill of 100 prompts against flash-linear-attention "
                "([serving](results/serving.md))"),
    ("decode", "Decode step, eight layers a graph, against flash-linear-attention "
               "([serving](results/serving.md))"),
    ("gates", "Per-token gates (simple GLA, Mamba-2 shapes) against the per-head decay, graphs "
              "([gates](results/gates.md))"),
    ("ssd", "Mamba-2's SSD against mamba_ssm's Triton kernels, graphs ([SSD](results/ssd.md))"),
    ("model", "A decoder LM's tokens/s with this operator as its mixer "
              "([model](results/model.md))"),
    ("correctness", "Every method against the float64 oracle "
                    "([correctness](#correctness-against-the-float64-oracle))"),
)


def answers(tags: list[str]) -> str:
    """One screen: per area, this project against the best peer measured, per GPU, with the
    commits of the rows behind each cell."""
    cells = {tag: _answer_cells(tag) for tag in tags}
    rows = [[what] + [cells[tag].get(key, "not measured") for tag in tags] for key, what in ANSWERS]
    return ("Geometric means over each table's cells; every ratio is the peer's time (or our "
            "tokens/s) over ours, measured in one process, like with like. The sections and "
            "pages below hold every cell.\n\n"
            + _table(["area"] + [t.upper() for t in tags], rows))


def gates(tags: list[str]) -> str:
    """``make bench-gates``' cells: per-token gates beside the per-head decay at the same shape,
    per pass and mode, each × its floor, and gated ÷ γ."""
    rows = []
    for tag in tags:
        df = _gates_rows(tag)
        if df is None:
            continue
        for (shape, layout, pass_, mode), g in df.groupby(["shape", "layout", "pass", "mode"],
                                                         sort=False):
            cell = g.set_index("entry")
            if not {"gamma", "gates"} <= set(cell.index):
                continue
            first = g.iloc[0]
            # (eager rows since host_ms and peak_mib were recorded: γ / gates)
            alone = ""
            if "host_ms" in cell and cell.host_ms.notna()[["gamma", "gates"]].all():
                alone = (f"{cell.host_ms['gamma']:.2f} / {cell.host_ms['gates']:.2f} ms; "
                         f"{cell.peak_mib['gamma']:.0f} / {cell.peak_mib['gates']:.0f} MiB")
            rows.append([tag.upper(), f"{shape} (b{first.batch} N{first.N} h{first.heads} "
                         f"{first.K}/{first.V})", layout, pass_, mode,
                         f"{cell.median_ms['gamma']:.3f} ms ({cell.vs_floor['gamma']:.2f}×)",
                         f"{cell.median_ms['gates']:.3f} ms ({cell.vs_floor['gates']:.2f}×)",
                         _x(cell.vs_gamma["gates"]), alone, _commits(g)])
    if not rows:
        return "Nothing measured yet."
    return ("bf16, time-major; `model`: slices of one fused projection taken in each step, "
            "`separate`: three tensors (the operator's own cost; `bench/gates.py` says why both); "
            "each time × its memory floor; `gated ÷ γ`: the gated call's time over the per-head "
            "decay's at the same shape and layout (NOTES.md, the gated backward's sections); "
            "eager rows, where recorded: the host's time a call (the GPU not waited on) and the "
            "most a call allocated beyond its inputs, γ / gates:\n\n"
            + _table(["GPU", "shape", "layout", "pass", "mode", "per-head decay γ",
                      "per-token gates", "gated ÷ γ", "host a call; peak", "commit"], rows))


#: the pages beside the main one, in figures/results/: (file, title, body)
TOPICS = (
    ("provenance.md", "What was measured where", lambda tags, gpus: measured_where(tags)),
    ("model.md", "What a model gets (`make bench-model`)", lambda tags, gpus: model(gpus)),
    ("training.md", "Training (`make bench-train`, `make train`)", lambda tags, gpus: training(gpus)),
    ("layouts.md", "The layouts models hand the operator (`make layouts`, `make bench-layer`)",
     lambda tags, gpus: layouts(gpus)),
    ("serving.md", "Serving (`make bench-serve`)", lambda tags, gpus: serving(gpus)),
    ("gates.md", "Per-token gates against the per-head decay (`make bench-gates`)",
     lambda tags, gpus: gates(gpus)),
    ("ssd.md", "Mamba-2's SSD against mamba_ssm (`make bench-ssd`)", lambda tags, gpus: ssd(gpus)),
    ("hf.md", "transformers' Mamba-2 family on this project (`make bench-hf`)",
     lambda tags, gpus: hf(gpus)),
    ("sequence_parallel.md", "Sequence parallelism (`make bench-sp`)",
     lambda tags, gpus: sequence_parallel([t for t in tags if "x" in t])),
)


def pages() -> dict:
    """``{path relative to the repository: text}``: the main page (figures/results.md: the
    answers, then the short sections) and one page per topic in figures/results/."""
    tags = gpu_folders()
    gpus = [t for t in tags if "x" not in t and t != "cpu"]
    sections = [
        ("Answers", answers(gpus)),
        ("Correctness against the float64 oracle", "`make gpu-check`, `make test-gpu`.\n\n"
         + correctness(gpus)),
        ("Distance to the memory floor", "`make floor`; heads 32, r = d = 128; time ÷ floor.\n\n"
         + floor_cells(gpus)),
        ("`method=\"auto\"` (`make tune`)", dispatch(gpus)),
        ("The paper's claims (`make claims`)", claims(gpus)),
        ("The other papers (`make eca`, `make related`)",
         other_papers([t for t in tags if t == "cpu"] + gpus)),
        ("More pages", "\n".join(f"- [{title}](results/{name})" for name, title, _ in TOPICS)),
    ]
    head = ("# Results\n\nWritten by `make results` from `data/` alone; do not edit by hand. Every "
            "table names the GPU, commit and date of its rows. How each number came about, and "
            "what it was predicted to be, is in [`NOTES.md`](../NOTES.md) and [`notes/`](../notes/).\n")
    out = {PAGE: head + "".join(f"\n## {title}\n\n{body}\n" for title, body in sections)}
    for name, title, body in TOPICS:
        out[os.path.join(TOPIC_DIR, name)] = (
            f"# {title}\n\nWritten by `make results` from `data/` alone; part of the "
            f"[results](../results.md).\n\n{body(tags, gpus)}\n")
    return out


def page() -> str:
    """The main page's text (:func:`pages` has every page)."""
    return pages()[PAGE]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--root", default=_paths.ROOT, help="where figures/ is written")
    p.add_argument("--check", action="store_true",
                   help="exit 1 if a page on disk differs from what the data give")
    args = p.parse_args(argv)
    stale = []
    for rel, text in pages().items():
        path = os.path.join(args.root, rel)
        if args.check:
            if not os.path.exists(path) or open(path, encoding="utf-8").read() != text:
                stale.append(rel)
            continue
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        print(f"wrote {path}")
    if args.check:
        print("up to date" if not stale else f"differ from data/ (make results): {stale}")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
