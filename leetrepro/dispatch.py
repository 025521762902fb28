"""How ``method="auto"`` chooses: a measured table per GPU where the call is in the regime it
measured, else a documented rule that puts Chunk first.

``make tune`` (:mod:`leetrepro.bench.tune`) times every registered method on a grid (dtype × batch
× N × mask) in one **regime**: the forward alone, B, C, V head-major and contiguous, heads 32,
r = d = 128 (the table's ``pass``, ``layout``, ``heads``, ``r`` and ``d`` columns; a table
without them was measured there). It writes ``data/<gpu>/dispatch.csv``: per cell the fastest
method (``best``) and every method's median. The tables ship inside the wheel. :func:`choose`
reads the table of the GPU the inputs are on (:func:`use_table` or
``LEETREPRO_DISPATCH=path.csv``, read when the package loads, names another file) and follows it
only where it speaks for the call (:class:`Call`):

* **the same regime**: no gradient will be taken (the table timed forwards: a method's backward
  is three more of its calls, and Chunk's two of them share one sweep), B, C and V head-major
  with their rows packed (a time-major view of a projection is another memory walk), and the
  table's r and d;
* **the same load**: the row whose lanes (batch × heads, what fills the GPU) are nearest on a
  log scale, then the nearest N on a log scale, with the same dtype and mask;
* **a clear win**: a method other than Chunk only where the table timed it at least
  :data:`AUTO_MARGIN` times faster than Chunk in that cell (a win inside the noise of one
  measurement is no reason to leave the method measured everywhere else).

Everywhere else (a call outside the table's regime, another GPU, the CPU), or when the table's
choice cannot run the inputs (a state is asked for, say), :func:`auto_method` follows
:data:`AUTO_ORDER`: Vanilla for N ≤ :data:`AUTO_SHORT_N` (Section 5.1: fastest there), else the
first method of the list that is registered and runs the inputs' dtype natively on their device.
Choices are cached per signature (a model asks per layer); registering a method or rewriting a
table clears the cache.

Why the regime matters (NOTES.md): LA, timed 4 % faster than Chunk at batch 1, N = 8192,
head-major, forward only, was 4-7× slower than Chunk on time-major views with the backward.
"""
from __future__ import annotations

import functools
import os
from typing import NamedTuple

import torch

from . import registry, tuning
from ._device import gpu_tag
from ._dtypes import SHORT_NAMES

AUTO_SHORT_N = 128
#: Chunk (this project's kernel, NOTES.md), lightningAttention-2 (fastest at batch 1 and N > 512
#: in Tables 3-4), then the PyTorch twins
AUTO_ORDER = ("Chunk", "LA", "LA_torch", "Bb")
STATE_ORDER = ("Chunk", "LA_torch")
#: how much faster than Chunk the table must have timed another method for auto to take it
AUTO_MARGIN = 1.10


class Call(NamedTuple):
    """What ``method="auto"`` decides on: the call's signature beyond dtype and device.
    ``head_major``: B, C, V ``(batch, heads, N, ·)`` with rows packed (row stride = the last
    dimension), as the table measured; ``grad``: autograd will take this call's gradient;
    ``gates``: per-token gates (only methods that take them; the table timed none)."""
    batch: int = 1
    heads: int = 32
    r: int = 128
    d: int = 128
    decay: bool = False
    state: bool = False
    grad: bool = False
    head_major: bool = True
    gates: bool = False


def call_of(B: torch.Tensor, V: torch.Tensor, *, decay: bool, state: bool, grad: bool,
            gates: bool = False) -> Call:
    """:class:`Call` of inputs B ``(batch, heads, N, r)`` and V ``(batch, heads, N, d)``."""
    batch, _, _, r = B.shape
    heads = V.shape[1]  # (B may hold groups)
    return Call(batch, heads, r, V.shape[-1], bool(decay), bool(state), bool(grad),
                packed_rows(B) and packed_rows(V), bool(gates))


def packed_rows(t: torch.Tensor) -> bool:
    """Whether ``t`` (4-D) is head-major with its rows packed: a time-major view of a
    projection ``(batch, N, heads, ·)`` has a row stride of heads × its last dimension."""
    return t.shape[-2] <= 1 or t.stride(-2) == t.shape[-1]


#: a dispatch table that replaces every GPU's own (:func:`use_table`); the environment is read once
_OVERRIDE: list = [os.environ.get("LEETREPRO_DISPATCH") or None]


def use_table(path: str | None) -> None:
    """Make ``method="auto"`` follow the table at ``path`` on every GPU (None: each GPU's own
    ``data/<gpu>/dispatch.csv`` again); forgets the choices made so far."""
    _OVERRIDE[0] = path
    clear_cache()


def table_path(tag: str) -> str:
    return _OVERRIDE[0] or tuning.path(tag, "dispatch.csv")


def auto_method(n, dtype=None, device=None, *, batch: int = 1, decay: bool = False,
                state: bool = False, heads: int = 32, r: int = 128, d: int = 128,
                grad: bool = False, head_major: bool = True,
                gates: bool = False) -> registry.Method:
    """The method ``method="auto"`` uses for these inputs (N rows, ``dtype`` on ``device``, the
    rest of the signature as :class:`Call`): the measured table's choice where it speaks for the
    call, else the rule above; with ``state``, only methods that take and return the recurrent
    state; with ``gates``, only methods that take per-token gates.

    Or from the call's own tensors: ``auto_method(B, C, V)`` (B ``(batch, heads, N, r)``, V
    ``(batch, heads, N, d)``; N, dtype, device, shapes, layout and whether any requires grad read
    off them; ``decay``, ``state`` and ``gates`` as keywords)."""
    if isinstance(n, torch.Tensor):
        tensors = (n, dtype, device)
        if not all(isinstance(t, torch.Tensor) and t.dim() == 4 for t in tensors):
            raise TypeError("auto_method takes (n, dtype, device) or the tensors (B, C, V), "
                            "each (batch, heads, N, ·)")
        B, _, V = tensors
        call = call_of(B, V, decay=decay, state=state, gates=gates,
                       grad=grad or any(t.requires_grad for t in tensors))
        return method_for(V.shape[2], V.dtype, V.device, call)
    if not isinstance(dtype, torch.dtype) or device is None:
        raise TypeError(f"auto_method takes (n, dtype, device) or the tensors (B, C, V); got "
                        f"n={n!r}, dtype={dtype!r}, device={device!r}")
    return method_for(n, dtype, torch.device(device),
                      Call(batch, heads, r, d, bool(decay), bool(state), bool(grad),
                           bool(head_major), bool(gates)))


def method_for(n: int, dtype: torch.dtype, device: torch.device, call: Call) -> registry.Method:
    """:func:`auto_method` for a :class:`Call` (:func:`call_of` the inputs), cached per signature."""
    return _auto(n, dtype, device, call)


@functools.lru_cache(maxsize=4096)
def _auto(n, dtype, device, call: Call) -> registry.Method:
    def usable(m):
        # native devices only: a Triton kernel interpreted on a CPU is correct but very slow
        return (m.supports(dtype, device) and device.type in m.devices
                and not m.unsafe and (m.state or not call.state) and (m.gates or not call.gates))

    picked = choose(n, dtype, device, call)
    candidates = ([picked] if picked else []) + list(
        STATE_ORDER if call.state else
        (("Vanilla",) + AUTO_ORDER if n <= AUTO_SHORT_N else AUTO_ORDER))
    for name in candidates:
        try:
            m = registry.get(name)
        except ValueError:
            continue
        if usable(m):
            return m
    raise ValueError(f"no registered method supports dtype {dtype} on {device}"
                     + (" with a state" if call.state else "")
                     + (" with per-token gates" if call.gates else ""))


def choose(n: int, dtype: torch.dtype, device, call: Call = Call()) -> str | None:
    """The abbreviation the table names for a call of N rows (:class:`Call`), or None where no
    table speaks for it (no table, another regime, no matching rows): the rule decides."""
    device = torch.device(device)
    if device.type != "cuda" or call.grad or not call.head_major or call.gates:
        return None
    found = tuning.dispatch_row(table_path(gpu_tag(device)), n, call.batch * call.heads,
                                SHORT_NAMES.get(dtype), call.decay, call.r, call.d)
    if found is None:
        return None
    best, margin = found
    return best if best == "Chunk" or margin >= AUTO_MARGIN else "Chunk"


def clear_cache() -> None:
    """Forget every loaded table and every choice made from one (after ``make tune`` rewrote a
    table): :func:`leetrepro.tuning.clear`."""
    tuning.clear()


registry.on_change(_auto.cache_clear)
