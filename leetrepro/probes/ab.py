"""A switch of the package, on and off, in one process: the same calls' results compared bit for
bit and their times interleaved, so that a change's A/B needs one GPU call and no script of its
own.

``python -m leetrepro.probes.ab --switch methods.chunk.tables.GATE_FOLD_FUSED [--values False
True] [--cells gated125 gamma125 ssd_zamba2 …] [--lm "leetrepro gated" …] [--out DIR]``

* ``--switch``: a module-level name of the package (``module.path.NAME``), set to each of
  ``--values`` (Python literals; default ``False True``) in turn and restored after;
* ``--cells``: forward + backward calls (:func:`cell`; ``fwd:<cell>`` the forward alone): the
  backward cells of
  :mod:`leetrepro.probes.ncu` (``BACKWARD``), a 125M layer's call (``gated125``, ``gamma125``:
  4 × 12 heads × 4096, 64/64, bf16; ``gated13b``, ``gamma13b``: a 1.3B model's, 2 × 16 heads × 4096,
  128/128), Mamba-2's SSD at :mod:`leetrepro.bench.ssd`'s shapes
  (``ssd_<label>``), the kernel paper's normalised layer (``normalized4096``,
  ``normalized16384``: b2 × 16 heads × 128, time-major, rows normalised), and
  :mod:`leetrepro.bench.gates`' entries at its shapes (``gates:<shape>``, ``gamma:<shape>``:
  the model's layout, its gates);
* ``--lm``: mixers of :mod:`leetrepro.bench.model` whose 125M model's training step is timed
  with each value, rounds of five steps taking turns, in each of ``--lm-modes`` (``eager``,
  ``compile``: the blocks under ``torch.compile``, which calls the operator's custom op on every
  step, so a switch read at call time takes effect; not CUDA graphs, whose replays keep the
  value they were captured with).

For each cell and value: whether the results equal the first value's bit for bit (``same``; a
switch that sums in another order says so here, it is not a failure), whether they are finite,
then per round the host time of one call (:func:`harness.host_seconds`), back-to-back calls
(:func:`harness.wall_per_call`) and, on a GPU, the replay of a CUDA graph captured with that
value (:func:`harness.graph_seconds`); the rounds alternate the values' order. Written to
``ab.csv`` (one row per cell, value and round, with the run's provenance) and printed as medians.
"""
from __future__ import annotations

import argparse
import ast
import importlib
import os
import sys
import time
from typing import Callable

import torch

from ..bench.harness import (graph_seconds, host_seconds, median, provenance, sync,
                             wall_per_call)

#: named layer calls beside :mod:`leetrepro.probes.ncu`'s: (batch, heads, N, r, d, gated)
LAYERS = {"gated125": (4, 12, 4096, 64, 64, True), "gamma125": (4, 12, 4096, 64, 64, False),
          "gated13b": (2, 16, 4096, 128, 128, True), "gamma13b": (2, 16, 4096, 128, 128, False)}
#: the kernel paper's normalised layer: (batch, heads, head dim, N) by name
NORMALIZED = {"normalized4096": (2, 16, 128, 4096), "normalized16384": (2, 16, 128, 16384)}


class Switch:
    """A module-level name of the package (``"methods.chunk.tables.GATE_FOLD_FUSED"``): ``set``
    gives it a value, ``restore`` its own back."""

    def __init__(self, path: str):
        where, _, self.name = path.rpartition(".")
        if not where:
            raise ValueError(f"--switch {path!r}: give module.path.NAME, a module of leetrepro")
        self.module = importlib.import_module(f"leetrepro.{where}")
        if not hasattr(self.module, self.name):
            raise ValueError(f"--switch {path!r}: leetrepro.{where} has no {self.name}")
        self.path, self.original = path, getattr(self.module, self.name)

    def set(self, value) -> None:
        setattr(self.module, self.name, value)

    def restore(self) -> None:
        setattr(self.module, self.name, self.original)


def cell(label: str, device) -> Callable[[], tuple]:
    """``fn()``: one forward + backward of the named call on fresh inputs, returning its results
    (the output's gradients); ``fwd:<label>`` its forward alone, returning the output."""
    from .host import call_of
    if label in NORMALIZED:
        return _normalized(NORMALIZED[label], device)
    name = label.removeprefix("fwd:")
    entry, _, shape = name.partition(":")
    if shape:
        return _bench_gates(entry, shape, device, grad=name == label)
    return call_of(name, device, shape=LAYERS.get(name), backward=name == label)


def _bench_gates(entry: str, label: str, device, grad: bool) -> Callable[[], tuple]:
    """``gates:<shape>`` or ``gamma:<shape>``: that entry of :mod:`leetrepro.bench.gates` at its
    shape, in the model's layout and with its inputs (gates of a model's strength), returning
    the output."""
    from ..bench import gates
    shapes = {s[0]: s[1:] for s in gates.SHAPES}
    if entry not in ("gates", "gamma") or label not in shapes:
        raise ValueError(f"--cells {entry}:{label}: take gates:<shape> or gamma:<shape>, shapes "
                         f"{sorted(shapes)}")
    batch, heads, n, k, v = shapes[label]
    src, g, gamma = gates._inputs(batch, heads, n, k, v, device, grad)
    dO = torch.randn(batch, n, heads, v).to(device=device, dtype=torch.bfloat16).transpose(1, 2)
    fn = gates._entries(None, grad, k, v)[entry]
    return lambda: fn(src, g, gamma, dO)


def _normalized(shape: tuple, device) -> Callable[[], tuple]:
    from ..bench.related import MIXERS, mixer
    batch, heads, dh, n = shape
    gen = torch.Generator(device=device).manual_seed(n)
    q, k, v = (torch.randn(batch, n, heads, dh, generator=gen, device=device,
                           dtype=torch.bfloat16).requires_grad_() for _ in range(3))
    do = torch.randn_like(v)
    mix = mixer(MIXERS[0])
    return lambda: torch.autograd.grad(mix(q, k, v, None), (q, k, v), do)


def _results(fn) -> list:
    out = fn()
    return [t.detach().clone() for t in (out if isinstance(out, (tuple, list)) else (out,))
            if isinstance(t, torch.Tensor)]


def compare(switch: Switch, values: list, fns: dict, device, rounds: int = 3,
            reps: int = 20) -> list[dict]:
    """Rows of :func:`main`'s table for ``fns`` (name → call): every value checked, then timed
    ``rounds`` times in alternating order, the switch restored after."""
    cuda = torch.device(device).type == "cuda"
    rows = []
    try:
        for name, fn in fns.items():
            first = None
            for value in values:
                switch.set(value)
                got = _results(fn)
                first = got if first is None else first
                same = len(got) == len(first) and all(
                    torch.equal(a.nan_to_num(0.0), b.nan_to_num(0.0)) and
                    torch.equal(a.isnan(), b.isnan()) for a, b in zip(got, first))
                finite = all(bool(torch.isfinite(t).all()) for t in got if t.is_floating_point())
                for r in range(rounds):
                    rows.append(dict(cell=name, value=repr(value), round=r, same=same,
                                     finite=finite))
            for r in range(rounds):
                for value in values if r % 2 == 0 else values[::-1]:
                    switch.set(value)
                    for _ in range(2):  # (compiled, plans made)
                        fn()
                    row = next(x for x in rows if x["cell"] == name and x["round"] == r and
                               x["value"] == repr(value))
                    row["host_ms"] = host_seconds(fn, (), reps, device) * 1e3
                    row["eager_ms"] = wall_per_call(fn, reps, device) * 1e3
                    if cuda:  # (captured with this value: its replays are this value's)
                        row["graph_ms"] = graph_seconds(lambda: fn(), (), reps, device) * 1e3
    finally:
        switch.restore()
    return rows


def lm_steps(switch: Switch, values: list, mixers, device, rounds: int = 12,
             steps: int = 5, modes=("eager",)) -> list[dict]:
    """Rows for the 125M model's step with each of ``mixers`` (:mod:`leetrepro.bench.model`) in
    each of ``modes`` (eager, compile), ``rounds`` rounds of ``steps`` steps per value and mode,
    the values' order alternating."""
    if "graphs" in modes:
        raise ValueError("--lm-modes: eager or compile (a CUDA graph's replays keep the value "
                         "they were captured with)")
    from ..bench import model as bm
    cfg = bm.SIZES["125M"]
    gen = torch.Generator(device=device).manual_seed(0)
    ids = torch.randint(0, cfg["vocab"], (cfg["batch"], cfg["seq"] + 1), generator=gen,
                        device=device)
    rows = []
    try:
        for name in mixers:
            make = bm.mixer(name, cfg, device)
            if make is None:
                continue
            built = bm._built(make, cfg, tuple(modes), device, "inductor", ids, 0)
            for value in values:  # (each value's kernels compiled before any round is timed)
                switch.set(value)
                for _ in range(3):
                    for mode in modes:
                        built[2][mode]()
            for r in range(rounds):
                for value in values if r % 2 == 0 else values[::-1]:
                    switch.set(value)
                    for mode in modes:
                        sync(device)
                        t0 = time.perf_counter()
                        for _ in range(steps):
                            built[2][mode]()
                        sync(device)
                        cell = f"lm125 {name}" + ("" if mode == "eager" else f" {mode}")
                        rows.append(dict(cell=cell, value=repr(value), round=r,
                                         eager_ms=(time.perf_counter() - t0) / steps * 1e3))
            built = None
            if torch.device(device).type == "cuda":
                torch.cuda.empty_cache()
    finally:
        switch.restore()
    return rows


def summary(rows: list[dict]) -> list[str]:
    """One line per cell and value: the medians over the rounds."""
    lines = []
    for name in dict.fromkeys(r["cell"] for r in rows):
        for value in dict.fromkeys(r["value"] for r in rows if r["cell"] == name):
            mine = [r for r in rows if r["cell"] == name and r["value"] == value]
            parts = [f"{k.removesuffix('_ms')} {median([r[k] for r in mine]):.3f} ms"
                     for k in ("host_ms", "eager_ms", "graph_ms") if k in mine[0]]
            flags = "" if "same" not in mine[0] else \
                f"; same bits: {mine[0]['same']}, finite: {mine[0]['finite']}"
            lines.append(f"{name:22s} {value:>8s}: " + ", ".join(parts) + flags)
    return lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--switch", required=True, help="module.path.NAME of the package")
    p.add_argument("--values", nargs="+", default=["False", "True"],
                   help="Python literals, each set in turn (default: False True)")
    p.add_argument("--cells", nargs="*", default=["gated125", "gamma125"])
    p.add_argument("--lm", nargs="*", default=[], help="mixers of bench.model, 125M steps")
    p.add_argument("--lm-modes", nargs="*", default=["eager"], choices=["eager", "compile"],
                   help="the LM's steps eager and/or under torch.compile (default eager)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--out", default=None, help="folder for ab.csv (default: not written)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = p.parse_args(argv)
    switch = Switch(args.switch)
    try:
        values = [ast.literal_eval(v) for v in args.values]
    except (ValueError, SyntaxError) as err:
        p.error(f"--values: each a Python literal ({err})")
    device = torch.device(args.device)
    rows = compare(switch, values, {c: cell(c, device) for c in args.cells}, device,
                   args.rounds, args.reps)
    rows += lm_steps(switch, values, args.lm, device, modes=args.lm_modes)
    meta = provenance(device)
    print(f"# {args.switch} in {', '.join(map(repr, values))}: {meta['gpu']}, commit "
          f"{meta['commit']}, {meta['date']}; medians of {args.rounds} rounds")
    print("\n".join(summary(rows)))
    if args.out:
        import pandas as pd
        os.makedirs(args.out, exist_ok=True)
        pd.DataFrame(rows).assign(switch=args.switch, **meta).to_csv(
            os.path.join(args.out, "ab.csv"), index=False)
        print(f"-> {args.out}/ab.csv")
    return 0


if __name__ == "__main__":
    sys.exit(main())
