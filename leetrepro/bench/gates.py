"""Per-token gates against the per-head decay and against flash-linear-attention's gated path, in
one process: ``make bench-gates`` (or ``python -m leetrepro.bench.gates --out data/<gpu>``).

Per cell (shape × layout × pass × mode), bf16, the gates a ``(batch, N, heads)`` float32 tensor
read through ``transpose(1, 2)``, in two layouts (``layout``):

* ``model``: B, C, V time-major slices of one fused projection ``(batch, N, heads, 2K + V)``,
  sliced in each step as a model does; in eager calls their gradients are written into one
  buffer that is the projection's gradient (``projection.rejoined``; autograd's concatenation
  of the slices where a peer's are not);
* ``separate``: B, C, V time-major views of three tensors ``(batch, N, heads, K or V)``, their
  gradients written once: the operator's own cost;

and the entries

* ``gamma``: :func:`leetrepro.causal_linear_decoder` with one decay per head (the γ path, the
  fastest kernel this GPU has for it);
* ``gates``: the same call with per-token gates ``g`` (logsigmoid of a random logit) instead;
* ``gates_straddle`` (forward + backward, on a GPU): that call on Chunk with
  ``gate_grad="straddle"``, dg from the straddle kernel instead of the backward sweeps' pieces
  (the default in bf16, NOTES.md);
* ``fla``: ``fla.ops.simple_gla.chunk_simple_gla(q, k, v, g=…)`` (the optional peer ``fla-core``),
  on the same time-major views;

are timed interleaved (CUDA events, median of ``--reps``) for the forward (``fwd``) and the
forward with its backward (``fwd+bwd``: the gradients of B, C, V and, for the gated entries, g),
eager and captured in a CUDA graph; eager rows also give ``host_ms``, the host's time a call (the
GPU not waited on: where it exceeds the GPU's, the eager call is host-bound) and ``peak_mib``,
the most the call allocated on the GPU beyond its inputs. ``floor_ms``: the bytes a pass must
move at least (fwd: B, C, V read, O written, the gates read; fwd+bwd: that, then B, C, V, dO and
the gates read and dB, dC, dV and dg written) over the measured copy bandwidth. ``vs_gamma``:
the gated entry's time over the γ path's in the same cell and mode; ``vs_fla``: ours over
flash-linear-attention's. A call that raises is a row whose ``status`` says why
(flash-linear-attention's gated backward refuses Triton 3.4–3.7.0 on Hopper: that refusal is
recorded, not hidden). Writes ``gates.csv``.
"""
from __future__ import annotations

import functools
import sys

import torch

from .harness import fla_chunk_simple_gla, gpu_main, host_seconds, peak_above, timed_entries

#: (label, batch, heads, N, K, V): simple GLA's training shape, Mamba-2-like heads, one GPU's
#: training micro-batch (64 lanes: fewer than an H100's or H200's SMs) and a long prompt (16 lanes)
SHAPES = [("gla", 8, 32, 8192, 128, 128), ("mamba2", 2, 64, 8192, 128, 64),
          ("mamba2-64", 2, 64, 8192, 64, 64), ("micro", 4, 16, 4096, 128, 128),
          ("long", 1, 16, 32768, 128, 128)]


#: the layouts the entries read (module docstring)
LAYOUTS = ("model", "separate")


def _inputs(batch, heads, n, k, v, device, grad, layout="model"):
    """``(src, g, gamma)``: the layout's tensors (``(x,)``, one projection, or ``(q, k, v)``), the
    gates time-major, per-head γ (drawn on the host: a capture that failed leaves the GPU's
    generator unusable for the next cell). B, C, V are made from ``src`` by :func:`_views`."""
    widths = (2 * k + v,) if layout == "model" else (k, k, v)
    src = tuple((torch.randn(batch, n, heads, w) * 0.3).to(device=device, dtype=torch.bfloat16)
                for w in widths)
    logits = torch.randn(batch, n, heads).to(device) + 3.0
    g = torch.nn.functional.logsigmoid(logits)  # (batch, N, heads): mostly ~ −0.05
    if grad:
        for t in src + (g,):
            t.requires_grad_()
    gamma = torch.linspace(0.95, 0.999, heads, dtype=torch.float64, device=device)
    return src, g, gamma


def _views(src, k, v):
    """B, C, V head-major views of the layout's tensors: the projection's slices, or the three."""
    if len(src) == 1:
        return tuple(t.transpose(1, 2) for t in src[0].split([k, k, v], -1))
    return tuple(t.transpose(1, 2) for t in src)


def _entries(fla, grad: bool, k: int, v: int) -> dict:
    """name -> fn(src, g, gamma, dO): one pass of the entry. B, C, V are made from ``src`` inside
    each pass, as a model's step does: views made once outside would carry their backward on the
    stream that made them, which a CUDA graph's capture refuses to wait on (every fwd+bwd
    capture failed so)."""
    from .. import causal_linear_decoder

    def ours(gated, **options):
        def call(src, g, gamma, dO):
            B, C, V = _views(src, k, v)
            o = causal_linear_decoder(B, C, V, None if gated else gamma,
                                      g=g.transpose(1, 2) if gated else None,
                                      method="Chunk" if options else "auto", **options)
            if grad:
                torch.autograd.grad(o, src + ((g,) if gated else ()), dO)
            return o
        return call

    out = {"gamma": ours(False), "gates": ours(True)}
    if grad and torch.cuda.is_available():
        out["gates_straddle"] = ours(True, gate_grad="straddle")
    if fla is not None:
        def peer(src, g, gamma, dO):
            q, kk, vv = (t.transpose(1, 2) for t in _views(src, k, v))
            o, _ = fla(q, kk, vv, g=g, scale=1.0)
            if grad:
                torch.autograd.grad(o, src + (g,), dO.transpose(1, 2))
            return o
        out["fla"] = peer
    return out


def floor_bytes(batch, heads, n, k, v, grad: bool, gated: bool) -> int:
    """The bytes a pass moves at least (bf16 tensors, fp32 gates)."""
    rows = batch * heads * n
    fwd = rows * (2 * k + 2 * v) * 2 + (rows * 4 if gated else 0)
    if not grad:
        return fwd
    return fwd + rows * (4 * k + 3 * v) * 2 + (rows * 8 if gated else 0)


def measure(shape, device, bw, reps: int, meta: dict, fla, layouts=LAYOUTS) -> list[dict]:
    label, batch, heads, n, k, v = shape
    rows = []
    for layout in layouts:
        for grad in (False, True):
            rows += _cell(shape, layout, grad, device, bw, reps, meta, fla)
    return rows


def _cell(shape, layout, grad, device, bw, reps, meta, fla) -> list[dict]:
    label, batch, heads, n, k, v = shape
    src, g, gamma = _inputs(batch, heads, n, k, v, device, grad, layout)
    dO = torch.randn(batch, n, heads, v).to(device=device, dtype=torch.bfloat16).transpose(1, 2)
    args = (src, g, gamma, dO)
    entries = _entries(fla, grad, k, v)
    # (ours first, then the peer)
    by_mode, status = timed_entries(
        dict(sorted(entries.items(), key=lambda kv: kv[0] == "fla")), args, reps, device,
        seed=hash((label, layout, grad)) % 1000)
    # (eager, each entry alone: the host's time a call, the GPU not waited on, and the most the
    # call allocated beyond its inputs, its output and gradients included)
    alone = {}
    for name, fn in entries.items():
        if name in by_mode["eager"]:
            alone[name] = (host_seconds(fn, args, 5, device),
                           peak_above(functools.partial(fn, *args), device)[1])
    rows = []
    for mode in ("graph", "eager"):
        times = by_mode[mode]
        base, peer = times.get("gamma"), times.get("fla")
        for name in entries:
            t = times.get(name)
            fb = floor_bytes(batch, heads, n, k, v, grad, name != "gamma")
            row = dict(meta, shape=label, batch=batch, heads=heads, N=n, K=k, V=v,
                       dtype="bf16", layout=layout, entry=name,
                       **{"pass": "fwd+bwd" if grad else "fwd"}, mode=mode,
                       median_ms=None if t is None else t * 1e3,
                       floor_ms=fb / bw * 1e3,
                       host_ms=alone[name][0] * 1e3 if mode == "eager" and name in alone else None,
                       peak_mib=alone[name][1] / 2 ** 20 if mode == "eager" and name in alone
                       else None,
                       status=status.get(f"{name}/graph" if mode == "graph" else name,
                                         status.get(name, "ok")))
            row["vs_floor"] = None if t is None else row["median_ms"] / row["floor_ms"]
            row["vs_gamma"] = None if t is None or base is None or name == "gamma" \
                else t / base
            row["vs_fla"] = None if t is None or peer is None or name == "fla" else t / peer
            rows.append(row)
            print(f"{label:10s} {layout:8s} {row['pass']:8s} {mode:6s} {name:6s} "
                  f"{row['median_ms'] if t is not None else float('nan'):8.3f} ms"
                  f"  floor×{row['vs_floor'] or float('nan'):5.2f}"
                  f"  vs_gamma {row['vs_gamma'] or float('nan'):5.2f}"
                  f"  vs_fla {row['vs_fla'] or float('nan'):5.2f}  {row['status'][:60]}",
                  flush=True)
    del src, g, dO, args
    torch.cuda.empty_cache()
    return rows


def _arguments(p) -> None:
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--shapes", nargs="*", default=[s[0] for s in SHAPES],
                   choices=[s[0] for s in SHAPES])
    p.add_argument("--no-fla", action="store_true", help="leave flash-linear-attention out")
    p.add_argument("--layouts", nargs="*", default=list(LAYOUTS), choices=LAYOUTS)


def main(argv=None) -> int:
    import os

    import pandas as pd

    args, setup = gpu_main("bench.gates", __doc__, argv, _arguments, output="gates.csv",
                           bandwidth=True)
    if setup is None:
        return 2
    device, meta, out, bw = setup
    fla = None if args.no_fla else fla_chunk_simple_gla()
    rows = []
    for shape in SHAPES:
        if shape[0] in args.shapes:
            rows += measure(shape, device, bw, args.reps, meta, fla, args.layouts)
            pd.DataFrame(rows).to_csv(os.path.join(out, "gates.csv"), index=False)
    print(f"-> {out}/gates.csv")
    return 0


if __name__ == "__main__":
    sys.exit(main())
