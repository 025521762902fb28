"""What one eager forward and backward launches on a GPU, read on any machine.

``python -m leetrepro.probes.launches [--gpu h200] [--shape 4 4096 12 64 64] [--gamma]``
runs ``chunk_simple_gla`` (time-major views of one projection, as a model's layer hands them;
per-token gates, or ``--gamma``'s per-head decay) forward and backward on the CPU as a GPU of that
kind would: its measured tables (``data/<gpu>/``), its SM count and an sm_90 capability, the
Hopper kernel taken wherever the call's operands fit it. No kernel runs: each launch is recorded
(the kernel's name; the portable kernel's as ``sweep`` or ``repair``), and each ATen operator the
call issues is counted (float16 stands for bfloat16: the interpreter computes bf16 dots wrongly,
and nothing is computed here). On a GPU's host each launch costs tens of microseconds and each
operator a few (notes/gates.md): the census says where an eager step's host time can shrink, and
:func:`census`'s counts are held by a test.
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import os
import sys

import torch

#: SMs of the GPUs whose tables the package ships
SMS = {"h100": 132, "h200": 132}


def _kernel_name(kernel, arguments: dict) -> str:
    name = getattr(kernel, "__name__", None) or getattr(getattr(kernel, "fn", None), "__name__",
                                                        type(kernel).__name__)
    if name == "chunk_scan_kernel":
        name += " repair" if arguments.get("REPAIR") else " sweep"
    return name


@contextlib.contextmanager
def as_gpu(gpu: str, launches: list):
    """The package made to plan as a ``gpu`` would (its tables, SMs, sm_90), its launches
    appended to ``launches`` instead of run; everything restored and every plan and table
    forgotten after."""
    from .. import _device, tuning
    from ..methods import _gpu
    from ..methods.chunk import hopper_launch, tables

    fakes = {"launch": lambda kernel, grid, arguments, key=None, **o:
             launches.append(_kernel_name(kernel, arguments)),
             "gpu_tag": lambda device=None: gpu, "sm_count": lambda device=None: SMS[gpu],
             "_capability": lambda index: (9, 0), "device_unfit": lambda device: None}
    originals = {"launch": _gpu.launch, "gpu_tag": _device.gpu_tag, "sm_count": _device.sm_count,
                 "_capability": tables._capability, "device_unfit": hopper_launch.device_unfit}
    patched = []
    for mod in [m for k, m in sorted(sys.modules.items()) if k.startswith("leetrepro")]:
        for name, original in originals.items():
            if getattr(mod, name, None) is original:
                patched.append((mod, name, original))
                setattr(mod, name, fakes[name])
    interpret = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"  # (the launchers' CPU path: the kernels' own launches)
    tuning.clear()
    try:
        yield
    finally:
        for mod, name, original in patched:
            setattr(mod, name, original)
        if interpret is None:
            os.environ.pop("TRITON_INTERPRET")
        else:
            os.environ["TRITON_INTERPRET"] = interpret
        tuning.clear()


class _Operators(torch.utils._python_dispatch.TorchDispatchMode):
    """The ATen operators issued within it (``counts``)."""

    def __init__(self):
        super().__init__()
        self.counts = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.counts[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


def _python_calls(fn) -> tuple:
    """``(fn()'s result, the Python functions it called)`` (``sys.setprofile``'s count)."""
    calls = [0]

    def count(frame, event, arg):
        if event == "call":
            calls[0] += 1
    sys.setprofile(count)
    try:
        out = fn()
    finally:
        sys.setprofile(None)
    return out, calls[0]


def census(gpu: str = "h200", shape: tuple = (4, 4096, 12, 64, 64), gated: bool = True) -> dict:
    """``{"forward": [...], "backward": [...]}``: the kernels one call of ``chunk_simple_gla`` at
    ``shape = (batch, N, heads, K, V)`` launches on ``gpu`` (:func:`as_gpu`), each phase's list in
    launch order, and ``"forward_ops"``, ``"backward_ops"``: the ATen operators it issues
    (:class:`collections.Counter`), ``"forward_calls"``, ``"backward_calls"``: the Python
    functions it calls (the launches' stand-in's among them). Its second call's: the plans and
    tables already made."""
    from ..compat import chunk_simple_gla
    b, n, h, k, v = shape
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(b, n, h * (2 * k + v), generator=gen, dtype=torch.float16, requires_grad=True)
    q, kk, vv = x.view(b, n, h, 2 * k + v).split([k, k, v], -1)
    decay = dict(g=torch.nn.functional.logsigmoid(torch.randn(b, n, h, generator=gen))) if gated \
        else dict(g_gamma=torch.full((h,), -0.05))
    if gated:
        decay["g"].requires_grad_()
    launches, out = [], {}

    def forward():
        return chunk_simple_gla(q, kk, vv, method="Chunk", **decay)[0]
    with as_gpu(gpu, launches):
        o = forward()
        o.backward(torch.ones_like(o))  # (the plans and tables made)
        launches.clear()
        with _Operators() as fwd:
            o = forward()
        out["forward"], out["forward_ops"] = list(launches), fwd.counts
        launches.clear()
        dy = torch.ones_like(o)
        with _Operators() as bwd:
            o.backward(dy)
        out["backward"], out["backward_ops"] = list(launches), bwd.counts
        o, out["forward_calls"] = _python_calls(forward)
        out["backward_calls"] = _python_calls(lambda: o.backward(dy))[1]
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpu", default="h200", choices=sorted(SMS))
    parser.add_argument("--shape", type=int, nargs=5, default=(4, 4096, 12, 64, 64),
                        metavar=("BATCH", "N", "HEADS", "K", "V"))
    parser.add_argument("--gamma", action="store_true", help="a per-head decay, not gates")
    args = parser.parse_args(argv)
    res = census(args.gpu, tuple(args.shape), gated=not args.gamma)
    for phase in ("forward", "backward"):
        ops = res[phase + "_ops"]
        print(f"{phase}: {len(res[phase])} launches: {', '.join(res[phase])}; "
              f"{res[phase + '_calls']} Python calls")
        print(f"  {sum(ops.values())} ATen operators: "
              + ", ".join(f"{k} {c}" for k, c in ops.most_common()))


if __name__ == "__main__":
    main()
