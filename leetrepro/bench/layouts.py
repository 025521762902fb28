"""The operator in the layouts models hand it, beside head-major and flash-linear-attention.

``make layouts`` (or ``python -m leetrepro.bench.layouts --out data/<gpu>``; ``make floor`` and
``make bench-train`` run it too) times per cell (r/d and heads × batch × N, bf16, per-head
decays 0.8…0.999) the forward (``fwd``: the forward of a training step, its leaves requiring
grad) and the forward + backward to every input (``fwd_bwd``) of each layout below by each
method (``auto``, the default a model gets, beside methods named; ``picks`` says which method
auto ran), eager calls with CUDA events (``--graph``: CUDA-graph replays, the same comparison
without host time), medians of ``--reps`` rounds in which every entry of the cell is called in
turn (one process, interleaved; each round in its own order, L2 flushed before every timed
call), and writes ``layouts.csv``: ``ms``, ``floor_ms`` (forward 2(r + d), forward + backward
6r + 5d bytes per row and head at the copy bandwidth measured in the same run),
``floor_ratio``, ``vs_head_major`` (time over the head-major entry's of the same method, cell
and pass), ``vs_fla`` (over fla's) and ``vs_best`` (over the fastest named method's in the same
layout and pass).

Grids (``--grid``): ``models`` (the default, ``layouts.csv``): batch 1, 2, 4 × N = 2048-16384 at
the head shapes and counts models train with (:data:`MODEL_SHAPES`), head-major, model and fused
layouts, auto, Chunk and LA; ``shapes`` (``layouts_shapes.csv``): every head shape Chunk
takes at b8/b16, N = 8192, every layout and fla.

Layouts (:func:`make_layout`; the leaves are what gradients are taken to):

* ``head-major``: B, C, V contiguous ``(b, h, N, ·)``: the project's headline numbers;
* ``model``: separate projections, q, k, v contiguous ``(b, N, h, ·)`` transposed to
  ``(b, h, N, ·)``; dO as autograd hands it back through ``O.transpose(1, 2).reshape(b, N, h·d)``;
* ``drop-in``: :func:`leetrepro.chunk_simple_gla` on q, k, v ``(b, N, h, ·)``, ``scale=1``;
* ``fused``: one projection ``(b, N, h·(2r + d))`` cut by :func:`leetrepro.split_projection`;
* ``fla``: flash-linear-attention's ``chunk_simple_gla`` on the ``model`` leaves (its own layout),
  ``scale=1`` (the optional ``fla-core``; it autotunes on its first call of each shape).
"""
from __future__ import annotations

import os
import sys

import torch

from .._dtypes import SHORT_NAMES, parse_dtype
from ..complexity import io_bytes
from .harness import (capture_graph, failed_status, fla_chunk_simple_gla, gpu_main,
                      interleaved_medians)
from .train import train_floor_bytes

LAYOUTS = ("head-major", "model", "drop-in", "fused")
#: (r, d, heads): the head shapes of the cells (h·d = 4096 for the square ones)
HEAD_SHAPES = ((128, 128, 32), (64, 64, 64), (128, 64, 32), (128, 256, 16), (256, 256, 16))
#: (batch, N)
SIZES = ((8, 8192), (16, 8192))
#: the head shapes and counts models train with, and one GPU's micro-batches at long context:
#: where ``method="auto"`` must be as fast as the fastest method named
MODEL_SHAPES = ((64, 64, 64), (128, 64, 128), (128, 128, 32), (128, 128, 16))
MODEL_SIZES = tuple((b, n) for b in (1, 2, 4) for n in (2048, 4096, 8192, 16384))
#: the models grid's largest inputs (B, C, V of one layout), so that a cell's layouts, methods and
#: graphs fit an 80 GB card: b4 N = 16384 at 128 heads of 128/64 (5.4 GB) is left out
MODEL_INPUT_BYTES = 2 ** 32
#: the default (what a model gets), this project's kernel, and what the default chose before
#: its table was held to its regime (NOTES.md)
METHODS = ("auto", "Chunk", "LA")
#: grid name -> (head shapes, sizes, layouts, methods) by default
GRIDS = {"models": (MODEL_SHAPES, MODEL_SIZES, ("head-major", "model", "fused"), METHODS),
         "shapes": (HEAD_SHAPES, SIZES, LAYOUTS + ("fla",), ("auto", "Chunk"))}


def fits(batch: int, n: int, r: int, d: int, heads: int, itemsize: int) -> bool:
    """Whether a models-grid cell's B, C, V take at most :data:`MODEL_INPUT_BYTES`."""
    return batch * heads * n * (2 * r + d) * itemsize <= MODEL_INPUT_BYTES


def decays(heads: int) -> torch.Tensor:
    """Per-head λ from 0.8 to 0.999 (float64)."""
    return torch.linspace(0.8, 0.999, heads, dtype=torch.float64)


def make_layout(layout: str, batch: int, heads: int, n: int, r: int, d: int, *, dtype, device,
                seed: int = 0, generator: torch.Generator | None = None):
    """``(leaves, bcv, dO)`` for one of :data:`LAYOUTS` (or ``fla``, whose leaves are the model
    layout's): random leaves requiring grad, ``bcv(*leaves) -> (B, C, V)`` as ``(b, h, N, ·)``
    views (the drop-in and fla take the leaves themselves), and an output gradient in the layout
    autograd hands back for that entry's O. B and C scaled by 1/sqrt(r) (sums O(1) in half
    precision)."""
    gen = generator or torch.Generator(device=device).manual_seed(seed)

    def rand(*shape, scale=1.0):
        t = torch.randn(*shape, generator=gen, device=device, dtype=dtype)
        return (t.mul_(scale) if scale != 1.0 else t).requires_grad_()

    s = r ** -0.5
    dO = torch.randn(batch, n, heads, d, generator=gen, device=device, dtype=dtype)
    if layout == "head-major":
        leaves = [rand(batch, heads, n, r, scale=s), rand(batch, heads, n, r, scale=s),
                  rand(batch, heads, n, d)]
        return leaves, lambda B, C, V: (B, C, V), dO.transpose(1, 2).contiguous()
    if layout in ("model", "drop-in", "fla"):
        leaves = [rand(batch, n, heads, r, scale=s), rand(batch, n, heads, r, scale=s),
                  rand(batch, n, heads, d)]
        bcv = lambda q, k, v: tuple(t.transpose(1, 2) for t in (q, k, v))  # noqa: E731
        return leaves, bcv, dO if layout != "model" else dO.transpose(1, 2)
    if layout == "fused":
        from ..projection import split_projection
        y = torch.randn(batch, n, heads * (2 * r + d), generator=gen, device=device, dtype=dtype)
        with torch.no_grad():
            y[..., :2 * heads * r] *= s
        return [y.requires_grad_()], lambda y: split_projection(y, heads, r, d), dO.transpose(1, 2)
    raise ValueError(f"layout {layout!r}; use one of {LAYOUTS + ('fla',)}")


def entry(layout: str, gamma: torch.Tensor, method: str = "Chunk"):
    """``fn(leaves, bcv) -> O`` of one layout (O as that entry returns it), or None where fla is
    not installed."""
    from .. import causal_linear_decoder, chunk_simple_gla
    if layout == "fla":
        fla = fla_chunk_simple_gla()
        if fla is None:
            return None
        lg = torch.log(gamma).float()
        return lambda x, bcv: fla(*x, g_gamma=lg, scale=1.0)[0]
    if layout == "drop-in":
        lg = torch.log(gamma)
        return lambda x, bcv: chunk_simple_gla(*x, g_gamma=lg, scale=1.0, method=method)[0]
    return lambda x, bcv: causal_linear_decoder(*bcv(*x), gamma, method=method)


def floor_bytes(pass_: str, batch: int, heads: int, n: int, r: int, d: int, itemsize: int) -> int:
    """The fewest bytes a pass moves: forward B, C, V read and O written
    (:func:`leetrepro.complexity.io_bytes`, 2(r + d) per row and head); forward + backward
    6r + 5d (:func:`leetrepro.bench.train.train_floor_bytes`, the 11-pass floor at r = d)."""
    if pass_ == "fwd":
        return io_bytes(n, r, d, batch=batch, heads=heads, itemsize=itemsize)
    return train_floor_bytes(n, r, d, batch, heads, itemsize)


def auto_picks(layout: str, x, bcv, gamma, grad: bool) -> str:
    """The method ``method="auto"`` runs for one layout's call (``grad``: with its backward)."""
    from ..ops import resolve
    B, _, V = bcv(*x) if layout != "drop-in" else tuple(t.transpose(1, 2) for t in x)
    return resolve("auto", B, gamma, False, V, grad).abbr


def measure_cell(dtype, batch, n, r, d, heads, layouts, reps, bw, device,
                 graph: bool = False, methods=("Chunk",)) -> list[dict]:
    """Every layout's forward and forward + backward in one cell by each of ``methods`` (names,
    or ``"auto"``: the default a model gets), interleaved: rows of ``layouts.csv`` (without
    provenance). ``graph``: each call captured once in a CUDA graph and replayed
    (``mode="graph"``: what a step captured by a training loop pays, no host time)."""
    gamma = decays(heads).to(device)
    calls, rows, keep = {}, [], []
    for layout in layouts:
        inputs = None  # one set of leaves per layout, shared by its methods (memory)
        for method in (methods if layout != "fla" else ("fla",)):
            fn = entry(layout, gamma, method)
            if fn is None:
                continue
            base = dict(dtype=SHORT_NAMES[dtype], batch=batch, N=n, heads=heads, r=r, d=d,
                        layout=layout if layout != "fla" else "model", method=method)
            picks = {}
            try:
                inputs = inputs or make_layout(layout, batch, heads, n, r, d, dtype=dtype,
                                               device=device, seed=n + r + d)
                x, bcv, dO = inputs
                if method == "auto":  # (fwd: the forward of a training step, leaves need grad)
                    picks = {p: auto_picks(layout, x, bcv, gamma, True) for p in PASSES}
                fwd = (lambda f=fn, x=x, bcv=bcv: f(x, bcv))
                both = (lambda f=fn, x=x, bcv=bcv, g=dO: torch.autograd.grad(f(x, bcv), x, g))
                both()  # warm-up: compiles (fla: autotunes)
                if graph:  # (a graph holds no reference to its inputs: kept alive here)
                    keep.append((x, dO, fwd, both))
                    fwd, both = (capture_graph(f, (), device).replay for f in (fwd, both))
                calls[(layout, method, "fwd")] = fwd
                calls[(layout, method, "fwd_bwd")] = both
                status = "ok"
            except Exception as err:  # an entry that cannot take the cell is a row, not an abort
                status = failed_status(err, 160)
            for p in PASSES:
                rows.append(dict(base, entry=layout, **{"pass": p}, status=status,
                                 mode="graph" if graph else "eager", picks=picks.get(p),
                                 floor_ms=floor_bytes(p, batch, heads, n, r, d, dtype.itemsize)
                                 / bw * 1e3))
    # entries share their layout's inputs: each timed call starts from a flushed L2 and in its
    # own place in the round, so that none is favoured by what the one before left behind
    times = interleaved_medians(calls, [()], reps, device, warmup=1, shuffle=True, flush=True,
                                seed=hash((batch, n, r, d, heads)) % 2 ** 31)
    for row in rows:
        t = times.get((row["entry"], row["method"], row["pass"]))
        row.update(ms=None if t is None else t * 1e3, reps=reps)
        row["floor_ratio"] = None if t is None else row["ms"] / row["floor_ms"]
    compare(rows)
    calls = x = keep = inputs = None  # the cell's tensors freed before the next
    torch.cuda.empty_cache()
    return rows


PASSES = ("fwd", "fwd_bwd")


def compare(rows: list[dict]) -> None:
    """Each row's ratios within its cell: ``vs_head_major`` (over the head-major entry of the same
    method and pass), ``vs_fla`` (over fla's, same pass) and ``vs_best`` (over the fastest named
    method, neither auto nor fla, in the same layout and pass)."""
    ms = {(r["entry"], r["method"], r["pass"]): r["ms"] for r in rows if r["ms"]}
    for row in rows:
        t, p = row["ms"], row["pass"]
        named = [v for (e, m, q), v in ms.items()
                 if e == row["entry"] and q == p and m not in ("auto", "fla")]
        for col, base in (("vs_head_major", ms.get(("head-major", row["method"], p))),
                          ("vs_fla", ms.get(("fla", "fla", p))),
                          ("vs_best", min(named) if named else None)):
            row[col] = t / base if t and base else None


def _arguments(p) -> None:
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--grid", choices=sorted(GRIDS), default="models",
                   help="the cells and their defaults: 'models' (batch 1, 2, 4 × N = 2048-16384 "
                        "at the head shapes and counts models use; head-major, model, fused; "
                        "auto, Chunk, LA) or 'shapes' (every head shape at b8/b16, N = 8192; "
                        "every layout and fla; auto, Chunk); the options below replace a part")
    p.add_argument("--layouts", nargs="*", default=None, help=f"of {LAYOUTS + ('fla',)}")
    p.add_argument("--methods", nargs="*", default=None,
                   help="methods timed in each layout ('auto': the default method)")
    p.add_argument("--shapes", nargs="*", default=None,
                   help="r:d:heads triples (default: 128:128:32 64:64:64 128:64:32 128:256:16 256:256:16)")
    p.add_argument("--sizes", nargs="*", default=None, help="batch:N pairs (default 8:8192 16:8192)")
    p.add_argument("--reps", type=int, default=31)
    p.add_argument("--graph", action="store_true",
                   help="CUDA-graph replays instead of eager calls (rows with mode=graph)")
    p.add_argument("--csv", default="layouts.csv")


def main(argv=None) -> int:
    args, setup = gpu_main("bench.layouts", __doc__, argv, _arguments, output="layouts.csv",
                           bandwidth=True)
    if setup is None:
        return 2
    import pandas as pd

    device, meta, out, bw = setup
    dtype = parse_dtype(args.dtype)
    grid_shapes, grid_sizes, grid_layouts, grid_methods = GRIDS[args.grid]
    layouts, methods = args.layouts or grid_layouts, args.methods or grid_methods
    shapes = grid_shapes if args.shapes is None else \
        [tuple(map(int, s.split(":"))) for s in args.shapes]
    sizes = grid_sizes if args.sizes is None else [tuple(map(int, s.split(":"))) for s in args.sizes]
    rows = []
    for (r, d, heads) in shapes:
        for batch, n in sizes:
            if args.grid == "models" and not fits(batch, n, r, d, heads, dtype.itemsize):
                continue
            cell = measure_cell(dtype, batch, n, r, d, heads, layouts, args.reps, bw, device,
                                graph=args.graph, methods=methods)
            rows += cell
            print(f"{SHORT_NAMES[dtype]} b{batch} N={n} h{heads} r={r} d={d} | " + " | ".join(
                f"{c['entry']} {c['method']} {c['pass']} {c['floor_ratio']:.2f}x"
                + (f" ({c['vs_best']:.2f} best)" if c['vs_best'] else "")
                if c["status"] == "ok" else f"{c['entry']} {c['method']} {c['status'][:50]}"
                for c in cell), flush=True)
            pd.DataFrame(rows).assign(copy_TBps=bw / 1e12, **meta).to_csv(
                os.path.join(out, args.csv), index=False)  # rewritten per cell: a cut run keeps rows
    print(f"wrote {os.path.join(out, args.csv)} ({len(rows)} rows)")
    auto = [r for r in rows if r["method"] == "auto" and r.get("vs_best")]
    for p in PASSES:
        worst = max((r for r in auto if r["pass"] == p), key=lambda r: r["vs_best"], default=None)
        if worst is not None:
            print(f"auto {p}: at most {worst['vs_best']:.2f}x the fastest named method "
                  f"(b{worst['batch']} N={worst['N']} h{worst['heads']} {worst['r']}/{worst['d']} "
                  f"{worst['entry']}: ran {worst['picks']}); ran "
                  f"{sorted({r['picks'] for r in auto if r['pass'] == p})}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
