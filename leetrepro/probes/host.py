"""Where an eager forward + backward's host time goes.

``python -m leetrepro.probes.host [--cells bf16_bwd_gates_mamba2 … ssd_zamba2 …] [--out data/<gpu>]``
takes the backward cells of :mod:`leetrepro.probes.ncu` (``BACKWARD``: the gated backward beside
the per-head decay's, bf16) and Mamba-2's SSD at :mod:`leetrepro.bench.ssd`'s shapes (``ssd_<label>``:
``compat.mamba_chunk_scan_combined`` and its backward) and for each writes to ``host_calls.txt``:

* ``host``: the median seconds the host spends in one call of ``causal_linear_decoder`` and its
  backward, the GPU not waited on (it queues the launches and returns;
  :func:`harness.host_seconds`);
* ``gpu``: the same call's GPU time, replayed from a CUDA graph (:func:`harness.graph_seconds`);
* ``eager``: back-to-back calls, synchronised at the end (:func:`harness.wall_per_call`): what an
  eager training step pays, the larger of the two when they overlap;
* the ATen operators and kernel launches one call issues (``torch.profiler``, CPU), the
  functions with the most host time of their own (``cProfile``, one call), this package's and
  torch's, and this package's functions by their time with what they call (where the host time
  of a step of the path goes).

Host time is the eager path's limit wherever ``host`` > ``gpu``: a CUDA graph or
``torch.compile(mode="reduce-overhead")`` removes it, a shorter host path lowers it.
"""
from __future__ import annotations

import cProfile
import os
import pstats
import sys

import torch


def call_of(label: str, device, dtype=torch.bfloat16, shape: tuple | None = None,
            backward: bool = True):
    """``fn()``: one forward + backward of a backward cell (``probes.ncu.BACKWARD``, or
    ``shape = (batch, heads, N, r, d, gated)``) on fresh inputs (:func:`ncu.backward_cell`), or of
    the SSD at ``bench.ssd``'s shape ``ssd_<label>``; the forward alone without ``backward``."""
    if label.startswith("ssd_"):
        from ..bench import ssd
        shape = next(s[1:] for s in ssd.SHAPES if f"ssd_{s[0]}" == label)
        from ..compat import mamba_chunk_scan_combined
        kw, dy = ssd._inputs(*shape, device, grad=backward)
        leaves = list(kw.values())

        def forward():
            return mamba_chunk_scan_combined(**kw, chunk_size=ssd.CHUNK, dt_softplus=True)
    else:
        from .ncu import backward_cell
        forward, leaves, dy = backward_cell(label, device, dtype, shape)
    if not backward:
        return forward

    def fn():
        return torch.autograd.grad(forward(), leaves, dy)
    return fn


def operator_counts(fn) -> tuple:
    """``(ATen operators, kernel launches)`` one call of ``fn`` issues (``torch.profiler``'s CPU
    events: the ``aten::`` ones at the top of their stack, and the launches of any kernel)."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    names = [e.name for e in prof.events()]
    top = [e for e in prof.events() if e.name.startswith("aten::") and
           not (e.cpu_parent is not None and e.cpu_parent.name.startswith("aten::"))]
    launches = sum(n in ("cudaLaunchKernel", "cuLaunchKernel", "cuLaunchKernelEx") for n in names)
    return len(top), launches


def own_time(fn, top: int = 12, cumulative: bool = False) -> list:
    """The ``top`` functions by their own host time in one call of ``fn`` (``cProfile``):
    ``(seconds, calls, "file:line(name)")``, largest first; with ``cumulative``, this package's
    functions by their time with what they call."""
    prof = cProfile.Profile()
    prof.enable()
    fn()
    prof.disable()
    stats = pstats.Stats(prof).stats
    ours = os.sep + "leetrepro" + os.sep
    rows = [(ct if cumulative else tt, nc, f"{os.path.basename(f)}:{line}({name})")
            for (f, line, name), (_, nc, tt, ct, _) in stats.items()
            if not cumulative or ours in f]
    return sorted(rows, key=lambda row: -row[0])[:top]


def report(label: str, fn, device, reps: int = 20, top: int = 12) -> list:
    """The lines of one cell (module docstring)."""
    from ..bench.harness import graph_seconds, host_seconds, sync, wall_per_call
    for _ in range(3):  # (compiled, plans made, memory cached)
        fn()
    sync(device)
    host = host_seconds(fn, (), reps, device)
    eager = wall_per_call(fn, reps, device)
    gpu = graph_seconds(lambda: fn(), (), reps, device) if device.type == "cuda" else None
    ops, launches = operator_counts(fn)
    lines = [f"{label:24s} host {host * 1e3:.3f} ms, eager {eager * 1e3:.3f} ms"
             + (f", gpu {gpu * 1e3:.3f} ms (graph)" if gpu is not None else "")
             + f"; {ops} ATen operators, {launches} kernel launches a call"]
    lines += [f"{label:24s}   {t * 1e6:8.1f} µs  {calls:4d}×  {where}"
              for t, calls, where in own_time(fn, top)]
    lines += [f"{label:24s}   {t * 1e6:8.1f} µs  {calls:4d}×  {where} (with what it calls)"
              for t, calls, where in own_time(fn, top, cumulative=True)]
    return lines


def main(argv=None) -> int:
    import argparse

    from ..bench.ssd import SHAPES
    from .ncu import BACKWARD
    cells = list(BACKWARD) + [f"ssd_{s[0]}" for s in SHAPES]
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--cells", nargs="*", default=cells, choices=cells)
    p.add_argument("--top", type=int, default=12, help="functions listed a cell, by each order")
    p.add_argument("--out", default=None, help="folder for host_calls.txt (default data/<gpu>)")
    p.add_argument("--reps", type=int, default=20)
    args = p.parse_args(argv)
    from ..bench.harness import gpu_script_setup
    setup = gpu_script_setup("host", args.out)
    if setup is None:
        return 2
    device, meta, out = setup
    lines = [f"# Host time of one eager forward + backward, {meta['gpu']}, {meta['date']}, "
             f"commit {meta['commit']}: causal_linear_decoder (method auto, bf16) and the SSD "
             f"(compat.mamba_chunk_scan_combined, bf16), medians of "
             f"{args.reps}; the functions by their own host time in one call (cProfile)"]
    for label in args.cells:
        found = report(label, call_of(label, device), device, args.reps, args.top)
        lines += found
        print("\n".join(found), flush=True)
    with open(os.path.join(out, "host_calls.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"-> {out}/host_calls.txt")
    return 0


if __name__ == "__main__":
    sys.exit(main())
