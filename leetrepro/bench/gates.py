"""Per-token gates against the per-head decay and against flash-linear-attention's gated path, in
one process: ``make bench-gates`` (or ``python -m leetrepro.bench.gates --out data/<gpu>``).

Per cell (shape × pass × mode), in the layout a model hands the operator (B, C, V time-major
slices of one fused projection ``(batch, N, heads, 2K + V)``, the gates a ``(batch, N, heads)``
float32 tensor read through ``transpose(1, 2)``), bf16, the entries

* ``gamma``: :func:`leetrepro.causal_linear_decoder` with one decay per head (the γ path, the
  fastest kernel this GPU has for it);
* ``gates``: the same call with per-token gates ``g`` (logsigmoid of a random logit) instead;
* ``fla``: ``fla.ops.simple_gla.chunk_simple_gla(q, k, v, g=…)`` (the optional peer ``fla-core``),
  on the same time-major views;

are timed interleaved (CUDA events, median of ``--reps``) for the forward (``fwd``) and the
forward with its backward (``fwd+bwd``: the gradients of B, C, V and, for the gated entries, g),
eager and captured in a CUDA graph. ``floor_ms``: the bytes a pass must move at least (fwd: B,
C, V read, O written, the gates read; fwd+bwd: that, then B, C, V, dO and the gates read and dB,
dC, dV and dg written) over the measured copy bandwidth. ``vs_gamma``: the gated entry's time over
the γ path's in the same cell and mode; ``vs_fla``: ours over flash-linear-attention's. A call
that raises is a row whose ``status`` says why (flash-linear-attention's gated backward refuses
Triton 3.4–3.7.0 on Hopper: that refusal is recorded, not hidden). Writes ``gates.csv``.
"""
from __future__ import annotations

import sys

import torch

from .harness import fla_chunk_simple_gla, gpu_main, timed_entries

#: (label, batch, heads, N, K, V): simple GLA's training shape and Mamba-2-like heads
SHAPES = [("gla", 8, 32, 8192, 128, 128), ("mamba2", 2, 64, 8192, 128, 64),
          ("mamba2-64", 2, 64, 8192, 64, 64)]


def _inputs(batch, heads, n, k, v, device, grad):
    """B, C, V as time-major slices of one projection, the gates time-major, per-head γ (drawn on
    the host: a capture that failed leaves the GPU's generator unusable for the next cell)."""
    x = (torch.randn(batch, n, heads, 2 * k + v) * 0.3).to(device=device, dtype=torch.bfloat16)
    B, C, V = _split(x, k, v)
    logits = torch.randn(batch, n, heads).to(device) + 3.0
    g = torch.nn.functional.logsigmoid(logits)  # (batch, N, heads): mostly ~ −0.05
    if grad:
        x.requires_grad_()
        g.requires_grad_()
    gamma = torch.linspace(0.95, 0.999, heads, dtype=torch.float64, device=device)
    return x, B, C, V, g, gamma


def _split(x, k, v):
    """B, C, V: the time-major slices of the projection x, viewed head-major."""
    return tuple(t.transpose(1, 2) for t in x.split([k, k, v], -1))


def _entries(fla, grad: bool) -> dict:
    """name -> fn(x, B, C, V, g, gamma, dO): one pass of the entry. With gradients each pass
    slices x itself, as a model's step does: slices made once outside would carry their
    backward on the stream that made them, which a CUDA graph's capture refuses to wait on
    (every fwd+bwd capture failed so)."""
    from .. import causal_linear_decoder

    def ours(gated):
        def call(x, B, C, V, g, gamma, dO):
            if grad:
                B, C, V = _split(x, B.shape[-1], V.shape[-1])
            o = causal_linear_decoder(B, C, V, None if gated else gamma,
                                      g=g.transpose(1, 2) if gated else None)
            if grad:
                leaves = (x, g) if gated else (x,)
                torch.autograd.grad(o, leaves, dO)
            return o
        return call

    out = {"gamma": ours(False), "gates": ours(True)}
    if fla is not None:
        def peer(x, B, C, V, g, gamma, dO):
            if grad:
                B, C, V = _split(x, B.shape[-1], V.shape[-1])
            q, k, v = (t.transpose(1, 2) for t in (B, C, V))
            o, _ = fla(q, k, v, g=g, scale=1.0)
            if grad:
                torch.autograd.grad(o, (x, g), dO.transpose(1, 2))
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


def measure(shape, device, bw, reps: int, meta: dict, fla) -> list[dict]:
    label, batch, heads, n, k, v = shape
    rows = []
    for grad in (False, True):
        x, B, C, V, g, gamma = _inputs(batch, heads, n, k, v, device, grad)
        dO = torch.randn(batch, n, heads, v).to(device=device, dtype=torch.bfloat16).transpose(1, 2)
        args = (x, B, C, V, g, gamma, dO)
        entries = _entries(fla, grad)
        # (ours first, then the peer)
        by_mode, status = timed_entries(
            dict(sorted(entries.items(), key=lambda kv: kv[0] == "fla")), args, reps, device,
            seed=hash((label, grad)) % 1000)
        for mode in ("graph", "eager"):
            times = by_mode[mode]
            base, peer = times.get("gamma"), times.get("fla")
            for name in entries:
                t = times.get(name)
                fb = floor_bytes(batch, heads, n, k, v, grad, name != "gamma")
                row = dict(meta, shape=label, batch=batch, heads=heads, N=n, K=k, V=v,
                           dtype="bf16", layout="model", entry=name,
                           **{"pass": "fwd+bwd" if grad else "fwd"}, mode=mode,
                           median_ms=None if t is None else t * 1e3,
                           floor_ms=fb / bw * 1e3,
                           status=status.get(f"{name}/graph" if mode == "graph" else name,
                                             status.get(name, "ok")))
                row["vs_floor"] = None if t is None else row["median_ms"] / row["floor_ms"]
                row["vs_gamma"] = None if t is None or base is None or name == "gamma" \
                    else t / base
                row["vs_fla"] = None if t is None or peer is None or name == "fla" else t / peer
                rows.append(row)
                print(f"{label:10s} {row['pass']:8s} {mode:6s} {name:6s} "
                      f"{row['median_ms'] if t is not None else float('nan'):8.3f} ms"
                      f"  floor×{row['vs_floor'] or float('nan'):5.2f}"
                      f"  vs_gamma {row['vs_gamma'] or float('nan'):5.2f}"
                      f"  vs_fla {row['vs_fla'] or float('nan'):5.2f}  {row['status'][:60]}",
                      flush=True)
        del x, B, C, V, g, dO, args
        torch.cuda.empty_cache()
    return rows


def _arguments(p) -> None:
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--shapes", nargs="*", default=[s[0] for s in SHAPES],
                   choices=[s[0] for s in SHAPES])
    p.add_argument("--no-fla", action="store_true", help="leave flash-linear-attention out")


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
            rows += measure(shape, device, bw, args.reps, meta, fla)
            pd.DataFrame(rows).to_csv(os.path.join(out, "gates.csv"), index=False)
    print(f"-> {out}/gates.csv")
    return 0


if __name__ == "__main__":
    sys.exit(main())
