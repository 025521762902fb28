"""One attention layer of a model, forward + backward, in tokens per second: the operator as a
model runs it, beside the same layer with flash-linear-attention's op.

``make bench-layer`` (or ``python -m leetrepro.bench.layer --out data/<gpu>``) builds, per cell
(heads × r = d, batch, N; bf16 parameters and activations, per-head decays 0.8…0.999), the layer

    B, C, V = projections of x (b, N, h·r)    (separate q, k, v Linear layers, or one fused)
    O = op(B, C, V)                          (time-major views, O time-major)
    y = o_proj(O.transpose(1, 2).reshape(b, N, h·d))

and times ``y`` and its backward to x and every weight (eager, CUDA events, medians of
``--reps`` rounds with the entries called in turn, each round in its own order), writing
``layer.csv``: ``ms`` per step, ``tokens_per_s`` (b·N / step), ``op_ms`` and ``op_share`` (the
operator's time in the step and its part of it: the step less the same layer's with the
operator replaced by ``identity``; not for ``Chunk-fused``, whose one projection is not the
identity layer's three), and ``vs_fla``.

Entries: ``auto`` and ``Chunk`` (separate projections, :func:`leetrepro.causal_linear_decoder`
with the default method and with Chunk named), ``Chunk-fused`` (one projection cut by
:func:`leetrepro.split_projection`), ``fla`` (separate projections, ``chunk_simple_gla`` on the
projections' ``(b, N, h, ·)`` views, ``scale=1``) and ``identity``: O a copy of V whose backward
hands dO to q, k and v alike (:class:`PassThrough`), so the step still runs all four projections'
backward (a copy of V alone leaves q and k out of the graph: autograd then skips two of the
projections' backward, four of the layer's twelve matrix products, and charged their time to the
operator).
"""
from __future__ import annotations

import os
import sys

import torch

from .._dtypes import SHORT_NAMES, parse_dtype
from .harness import failed_status, fla_chunk_simple_gla, gpu_main, interleaved_medians
from .layouts import decays

#: (heads, r = d, batch, N)
CELLS = ((32, 128, 4, 8192), (64, 64, 4, 8192))
ENTRIES = ("auto", "Chunk", "Chunk-fused", "fla", "identity")


class PassThrough(torch.autograd.Function):
    """``O = copy of V`` with ``dq = dk = dv = dO`` (r = d): the layer's graph and every tensor's
    gradient as the operator's, at the cost of one copy of V, so that the step less this one is
    the operator's own time. Not a gradient of anything: for timing only."""

    @staticmethod
    def forward(ctx, q, k, v):
        if q.shape != v.shape or k.shape != v.shape:
            raise ValueError(f"identity needs r = d (q, k, v of one shape), got {tuple(q.shape)}, "
                             f"{tuple(k.shape)}, {tuple(v.shape)}")
        return v.clone()

    @staticmethod
    def backward(ctx, dO):
        return dO, dO, dO


class Layer(torch.nn.Module):
    """The attention layer of the module docstring; ``op(q, k, v)`` takes and returns
    ``(b, N, h, ·)`` tensors (flash-linear-attention's layout), or with ``fused`` one projection
    is cut into B, C, V by :func:`leetrepro.split_projection`."""

    def __init__(self, heads: int, r: int, op, fused: bool = False):
        super().__init__()
        dim = heads * r
        self.heads, self.r, self.op, self.fused = heads, r, op, fused
        if fused:
            self.bcv = torch.nn.Linear(dim, 3 * dim, bias=False)
        else:
            self.q, self.k, self.v = (torch.nn.Linear(dim, dim, bias=False) for _ in range(3))
        self.o = torch.nn.Linear(dim, dim, bias=False)

    def forward(self, x):
        b, n, dim = x.shape
        if self.fused:
            from ..projection import split_projection
            B, C, V = split_projection(self.bcv(x), self.heads, self.r)
            O = self.op(*(t.transpose(1, 2) for t in (B, C, V)))
        else:
            O = self.op(*(p(x).view(b, n, self.heads, self.r) for p in (self.q, self.k, self.v)))
        return self.o(O.reshape(b, n, dim))


def make_op(name: str, gamma: torch.Tensor):
    """``op(q, k, v) -> o``, all ``(b, N, h, ·)``, or None where fla is not installed."""
    from .. import causal_linear_decoder
    if name == "identity":
        return PassThrough.apply
    if name == "fla":
        fla = fla_chunk_simple_gla()
        if fla is None:
            return None
        lg = torch.log(gamma).float()
        return lambda q, k, v: fla(q, k, v, g_gamma=lg, scale=1.0)[0]
    method = "auto" if name == "auto" else "Chunk"
    return lambda q, k, v: causal_linear_decoder(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), gamma,
        method=method).transpose(1, 2)


def measure_cell(dtype, heads, r, batch, n, entries, reps, device) -> list[dict]:
    gamma = decays(heads).to(device)
    gen = torch.Generator(device=device).manual_seed(n)
    x = torch.randn(batch, n, heads * r, generator=gen, device=device, dtype=dtype) \
        .requires_grad_()
    calls, rows = {}, []
    for name in entries:
        op = make_op(name, gamma)
        if op is None:
            continue
        row = dict(entry=name, dtype=SHORT_NAMES[dtype], batch=batch, N=n, heads=heads, r=r, d=r)
        try:
            torch.manual_seed(0)
            layer = Layer(heads, r, op, fused=name == "Chunk-fused").to(device, dtype)
            for p in layer.parameters():
                torch.nn.init.normal_(p, std=r ** -0.5 / heads ** 0.5)
            dy = torch.randn_like(x) * 0.1
            params = [x] + list(layer.parameters())
            step = (lambda m=layer, g=dy, p=params: torch.autograd.grad(m(x), p, g))
            step()  # warm-up: compiles (fla: autotunes)
            calls[name] = step
            row["status"] = "ok"
        except Exception as err:  # an entry that cannot take the cell is a row, not an abort
            row["status"] = failed_status(err, 160)
        rows.append(row)
    times = interleaved_medians(calls, [()], reps, device, warmup=1, shuffle=True)
    for row in rows:
        t = times.get(row["entry"])
        row.update(ms=None if t is None else t * 1e3, reps=reps,
                   tokens_per_s=None if t is None else batch * n / t)
    ms = {row["entry"]: row["ms"] for row in rows if row["ms"]}
    for row in rows:
        # (the identity layer has separate projections: the fused layer's step is not comparable)
        if row["ms"] and row["entry"] not in ("identity", "Chunk-fused") and "identity" in ms:
            row["op_ms"] = row["ms"] - ms["identity"]
            row["op_share"] = row["op_ms"] / row["ms"]
        row["vs_fla"] = row["ms"] / ms["fla"] if row["ms"] and "fla" in ms else None
    calls = x = None
    torch.cuda.empty_cache()
    return rows


def _arguments(p) -> None:
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--entries", nargs="*", default=list(ENTRIES))
    p.add_argument("--cells", nargs="*", default=None,
                   help="heads:r:batch:N (default 32:128:4:8192 64:64:4:8192)")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--csv", default="layer.csv")


def main(argv=None) -> int:
    args, setup = gpu_main("bench.layer", __doc__, argv, _arguments, output="layer.csv")
    if setup is None:
        return 2
    import pandas as pd

    device, meta, out = setup
    dtype = parse_dtype(args.dtype)
    cells = CELLS if args.cells is None else [tuple(map(int, c.split(":"))) for c in args.cells]
    rows = []
    for heads, r, batch, n in cells:
        cell = measure_cell(dtype, heads, r, batch, n, args.entries, args.reps, device)
        rows += cell
        print(f"{SHORT_NAMES[dtype]} h{heads} r=d={r} b{batch} N={n} | " + " | ".join(
            f"{c['entry']} {c['ms']:.2f} ms {c['tokens_per_s'] / 1e6:.2f}M tok/s"
            if c["status"] == "ok" else f"{c['entry']} {c['status'][:50]}" for c in cell),
            flush=True)
        pd.DataFrame(rows).assign(**meta).to_csv(os.path.join(out, args.csv), index=False)
    print(f"wrote {os.path.join(out, args.csv)} ({len(rows)} rows)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
