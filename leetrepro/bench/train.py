"""Forward + backward against its memory floor, beside flash-linear-attention, in one process.

``make bench-train`` (or ``python -m leetrepro.bench.train --out data/<gpu>``) times, per cell
(dtype × batch × N, decay, heads 32, r = d = 128, inputs ``randn`` with B and C scaled by
1/sqrt(r), ALiBi-style decays), the forward with inputs that require grad (``fwd_ms``) and the
forward plus the backward to dB, dC, dV (``fwd_bwd_ms``), each a median of CUDA-event timings
after a warm-up, the entries interleaved call by call. The floor of forward + backward moves 11
tensors at r = d (forward: B, C, V read, O written; backward: B, C, V, dO read, dB, dC, dV
written): ``floor_ms = (6r + 5d)·N·batch·heads·bytes / copy bandwidth`` measured in the same run.
``peak_extra_GiB``: the peak memory of forward + backward beyond the inputs, dO and O;
``grads_GiB``: |dB| + |dC| + |dV|. ``step_host_us`` (eager): the median host time of one forward +
backward, the GPU idle before it (what the host spends launching a training step's operator).
``rel_error_d*``: each gradient of the first (batch, head)
against float64 autograd through the oracle (N ≤ ``--check-max-n``, 8192: the float64 graph
is O(N²)).

``mode``: ``eager`` (each call launched from Python) or ``graph`` (forward + backward captured once
in a CUDA graph and replayed, as a training loop with CUDA graphs runs it; cells up to
``--graph-max-tokens`` batch·N, where both entries' graphs and their inputs fit beside each other).
Entries are compared within one mode only.

``--sweeps`` also writes ``train_sweeps.csv``: Chunk's step taken apart into its three sweeps
(the forward; the backward's dual sweep, dV and dC from one reverse-time state; the forward
sweep that gives dB), each called as the backward calls it and captured in a CUDA graph, timed
interleaved with the whole step's graph, each against its own floor at one read of every input
(4, 6 and 4 passes; the step's floor is 11). The sum of the three sweeps' floors (14 passes) over
the step's (11), times each sweep's own ratio, is where the step's ratio comes from; with segments
(batch 1) each sweep also reads two of its inputs a second time.

Entries: ``auto`` (the default method, as a model calls it), ``Chunk``
(``causal_linear_decoder(..., method="Chunk")``: the custom op, its backward
the reverse sweeps for dV and dC plus a forward sweep for dB, each on the kernel the GPU's
measured table names) and ``fla``
(``fla.ops.simple_gla.chunk_simple_gla``, its time-major layout prepared outside the timed call,
``scale=1``; the optional ``fla-core``).
"""
from __future__ import annotations

import os
import sys

import torch

from .._dtypes import SHORT_NAMES, parse_dtype
from ..decay.per_head import alibi_gammas
from ..api import causal_linear_decoder
from ..reference import reference, rel_error
from .harness import (capture_graph, failed_status, fla_chunk_simple_gla, gpu_main, host_seconds,
                      interleaved_medians, peak_above, random_inputs)

#: (dtype, batch, N): the training cells, decay mask
CELLS = [("bfloat16", 16, 25600), ("bfloat16", 1, 100000), ("bfloat16", 8, 8192),
         ("float16", 1, 32768), ("bfloat16", 4, 2048)]
HEADS, RANK, DIM = 32, 128, 128


def train_floor_bytes(n: int, r: int, d: int, batch: int, heads: int, itemsize: int) -> int:
    """Bytes the forward + backward must move at the least: 11 tensors at r = d."""
    return batch * heads * n * (6 * r + 5 * d) * itemsize


def entries(names) -> dict:
    """name -> (forward(inputs) -> outputs tuple, the leaves its gradients are taken to)."""
    out = {}
    for name in names:
        if name == "fla":
            chunk_simple_gla = fla_chunk_simple_gla()
            if chunk_simple_gla is None:
                continue
            out[name] = lambda x, f=chunk_simple_gla: f(x["q"], x["k"], x["v"], g_gamma=x["lg"],
                                                        scale=1.0)[0]
        else:
            out[name] = lambda x, m=name: causal_linear_decoder(x["B"], x["C"], x["V"], x["g"],
                                                                method=m)
    return out


def _leaves(name: str, x: dict) -> list:
    return [x[k] for k in (("q", "k", "v") if name == "fla" else ("B", "C", "V"))]


def make_cell(dtype, batch, n, device) -> dict:
    B, C, V = random_inputs(batch, HEADS, n, RANK, DIM, dtype=dtype, device=device, seed=n,
                            scale_bc=True)
    g = alibi_gammas(HEADS).to(device)
    x = dict(B=B.requires_grad_(), C=C.requires_grad_(), V=V.requires_grad_(), g=g,
             lg=torch.log(g).float())
    x["dO"] = torch.randn_like(V) * 0.1
    return x


def add_fla_layout(x: dict) -> None:
    """fla's time-major copies (b, T, h, K), made outside the timed calls."""
    for ours, theirs in (("B", "q"), ("C", "k"), ("V", "v")):
        x[theirs] = x[ours].detach().transpose(1, 2).contiguous().requires_grad_()
    x["dO_t"] = x["dO"].transpose(1, 2).contiguous()


def gradient_errors(name: str, fn, x: dict) -> dict:
    """Relative errors of dB, dC, dV on the first (batch, head) against float64 autograd."""
    sl = (slice(0, 1), slice(0, 1))
    leaves = [t.detach()[sl].clone().requires_grad_() for t in (x["B"], x["C"], x["V"])]
    dO = x["dO"][sl]
    exact = [t.detach().double().requires_grad_() for t in leaves]
    want = torch.autograd.grad((reference(*exact, x["g"][:1], row_block=1024) * dO.double()).sum(),
                               exact)
    if name == "fla":
        sub = dict(q=leaves[0].transpose(1, 2), k=leaves[1].transpose(1, 2),
                   v=leaves[2].transpose(1, 2), lg=x["lg"][:1])
        got = torch.autograd.grad(fn(sub), leaves, dO.transpose(1, 2))
    else:
        got = torch.autograd.grad(fn(dict(B=leaves[0], C=leaves[1], V=leaves[2], g=x["g"][:1])),
                                  leaves, dO)
    return {f"rel_error_d{k}": rel_error(a, w) for k, a, w in zip("BCV", got, want)}


def measure(fns: dict, dtype, batch, n, reps, bw, device, check_max_n,
            graph_max_tokens: int = 0) -> list[dict]:
    x = make_cell(dtype, batch, n, device)
    if "fla" in fns:
        add_fla_layout(x)
    floor = train_floor_bytes(n, RANK, DIM, batch, HEADS, dtype.itemsize) / bw
    grads_gib = batch * HEADS * n * (2 * RANK + DIM) * dtype.itemsize / 2 ** 30
    out_bytes = batch * HEADS * n * DIM * dtype.itemsize
    rows, calls = {}, {}
    for name, fn in fns.items():
        dO = x["dO_t"] if name == "fla" else x["dO"]
        leaves = _leaves(name, x)
        row = dict(method=name, dtype=SHORT_NAMES[dtype], batch=batch, N=n, decay=True,
                   heads=HEADS, r=RANK, d=DIM, floor_ms=floor * 1e3, grads_GiB=grads_gib)
        try:
            fwd = (lambda f=fn: f(x))
            both = (lambda f=fn, lv=leaves, g=dO: torch.autograd.grad(f(x), lv, g))
            both()  # warm-up: compiles
            grads, peak = peak_above(both, device)
            row["peak_extra_GiB"] = (peak - out_bytes) / 2 ** 30
            del grads
            if n <= check_max_n:
                row.update(gradient_errors(name, fn, x))
            calls[name] = (fwd, both)
            row["status"] = "ok"
        except Exception as err:  # an entry that cannot take the cell is a row, not an abort
            row["status"] = failed_status(err, 160)
            torch.cuda.empty_cache()
        rows[name] = row
    times = interleaved_medians({(name, k): f for name, fs in calls.items()
                                 for k, f in zip(("fwd", "both"), fs)}, [()], reps, device, warmup=0)
    for name in calls:
        row = rows[name]
        row.update(mode="eager", fwd_ms=times[(name, "fwd")] * 1e3,
                   fwd_bwd_ms=times[(name, "both")] * 1e3, reps=reps)
        row["floor_ratio"] = row["fwd_bwd_ms"] / row["floor_ms"]
        row["step_host_us"] = host_seconds(calls[name][1], (), reps, device) * 1e6
    out = list(rows.values())
    if batch * n <= graph_max_tokens and calls:
        out += _graph_rows(rows, calls, reps, device)
    x = None  # the memory freed before the next shape
    torch.cuda.empty_cache()
    return out


def _graph_rows(rows: dict, calls: dict, reps: int, device) -> list[dict]:
    """The same entries each captured in a CUDA graph (forward alone, forward + backward) and
    replayed, interleaved: rows with ``mode="graph"``."""
    graphs, out = {}, []
    for name, (fwd, both) in calls.items():
        row = {k: v for k, v in rows[name].items()
               if not k.startswith(("rel_error", "step_host"))}
        try:
            graphs[(name, "fwd")] = capture_graph(fwd, (), device)
            graphs[(name, "both")] = capture_graph(both, (), device)
            row["status"] = "ok"
        except Exception as err:  # a call that cannot be captured is a row, not an abort
            row["status"] = failed_status(err, 160)
            graphs.pop((name, "fwd"), None)
        out.append(dict(row, mode="graph"))
    times = interleaved_medians({k: g.replay for k, g in graphs.items()}, [()], reps, device,
                                warmup=1)
    for row in out:
        if row["status"] == "ok":
            row.update(fwd_ms=times[(row["method"], "fwd")] * 1e3,
                       fwd_bwd_ms=times[(row["method"], "both")] * 1e3, reps=reps)
            row["floor_ratio"] = row["fwd_bwd_ms"] / row["floor_ms"]
    return out


#: Chunk's training step as its backward runs it: (sweep, passes at its floor, the call on a cell)
SWEEPS = [("forward", 4, lambda x, f: f(x["B"], x["C"], x["V"], x["g"])),
          ("dual", 6, lambda x, f: f(x["C"], x["B"], x["dO"], x["g"], reverse=True, dual=x["V"])),
          ("dB", 4, lambda x, f: f(x["dO"], x["V"], x["C"], x["g"]))]


def sweep_rows(dtype, batch, n, reps, bw, device) -> list[dict]:
    """Chunk's step and each of its sweeps (:data:`SWEEPS`, through ``chunk_scan`` with the kernel
    the GPU's table names) captured in CUDA graphs and replayed interleaved: one row each, its
    time against its own floor (``passes`` tensors of ``batch·heads·N·128`` elements)."""
    from ..methods.chunk import chunk_scan
    x = make_cell(dtype, batch, n, device)
    fwd = entries(["Chunk"])["Chunk"]
    leaves = _leaves("Chunk", x)
    calls = {"step": (11, lambda: torch.autograd.grad(fwd(x), leaves, x["dO"]))}
    plain = {k: (v.detach() if isinstance(v, torch.Tensor) else v) for k, v in x.items()}
    calls |= {name: (passes, lambda c=call: c(plain, chunk_scan)) for name, passes, call in SWEEPS}
    graphs = {name: capture_graph(fn, (), device) for name, (_, fn) in calls.items()}
    times = interleaved_medians({k: g.replay for k, g in graphs.items()}, [()], reps, device,
                                warmup=1)
    tensor_bytes = batch * HEADS * n * DIM * dtype.itemsize
    rows = [dict(sweep=name, passes=passes, dtype=SHORT_NAMES[dtype], batch=batch, N=n, decay=True,
                 heads=HEADS, r=RANK, d=DIM, mode="graph", ms=times[name] * 1e3,
                 floor_ms=passes * tensor_bytes / bw * 1e3, reps=reps)
            for name, (passes, _) in calls.items()]
    for row in rows:
        row["floor_ratio"] = row["ms"] / row["floor_ms"]
    graphs = calls = x = plain = leaves = None  # the cell's tensors freed before the next
    torch.cuda.empty_cache()
    return rows


def _arguments(p) -> None:
    p.add_argument("--entries", nargs="*", default=["auto", "Chunk", "fla"])
    p.add_argument("--cells", nargs="*", default=None,
                   help="dtype:batch:N triples (default: the training cells of the results page)")
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--check-max-n", type=int, default=8192,
                   help="largest N whose gradients are checked against float64 autograd")
    p.add_argument("--csv", default="train.csv")
    p.add_argument("--graph-max-tokens", type=int, default=131072,
                   help="cells up to this batch·N also timed as CUDA graph replays (0: none)")
    p.add_argument("--sweeps", action="store_true",
                   help="also Chunk's step taken apart into its sweeps, each against its own floor "
                        "(train_sweeps.csv)")


def main(argv=None) -> int:
    args, setup = gpu_main("bench.train", __doc__, argv, _arguments, output="train.csv", bandwidth=True)
    if setup is None:
        return 2
    import pandas as pd

    device, meta, out, bw = setup
    cells = CELLS if args.cells is None else [
        (c.split(":")[0], int(c.split(":")[1]), int(c.split(":")[2])) for c in args.cells]
    fns = entries(args.entries)
    rows, sweeps = [], []
    for dt, batch, n in cells:
        dtype = parse_dtype(dt)
        cell = measure(fns, dtype, batch, n, args.reps, bw, device, args.check_max_n,
                       args.graph_max_tokens)
        rows += cell
        if args.sweeps:
            parts = sweep_rows(dtype, batch, n, args.reps, bw, device)
            sweeps += parts
            print("  Chunk's sweeps (graph): " + " | ".join(
                f"{r['sweep']} {r['ms']:.3f} ms ({r['floor_ratio']:.2f}x its {r['passes']} passes)"
                for r in parts), flush=True)
            pd.DataFrame(sweeps).assign(copy_TBps=bw / 1e12, **meta).to_csv(
                os.path.join(out, "train_sweeps.csv"), index=False)
        print(f"{SHORT_NAMES[dtype]} b{batch} N={n} decay, floor {cell[0]['floor_ms']:.2f} ms | "
              + " | ".join(f"{r['method']} {r['mode']} fwd {r['fwd_ms']:.2f} "
                           f"fwd+bwd {r['fwd_bwd_ms']:.2f} ms "
                           f"({r['floor_ratio']:.2f}x) peak+{r['peak_extra_GiB']:.2f} GiB"
                           if r["status"] == "ok" else f"{r['method']} {r['status'][:60]}"
                           for r in cell), flush=True)
        pd.DataFrame(rows).assign(copy_TBps=bw / 1e12, **meta).to_csv(
            os.path.join(out, args.csv), index=False)  # rewritten per cell: a cut run keeps its rows
    print(f"wrote {os.path.join(out, args.csv)} ({len(rows)} rows)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
