"""How ``method="auto"`` chooses: a measured table per GPU, else a documented rule.

``make tune`` (:mod:`leetrepro.bench.tune`) times every registered method on a grid (dtype × batch
× N × mask, heads 32, r = d = 128) and writes ``data/<gpu>/dispatch.csv``: per cell the fastest
method (``best``) and every method's median. The tables ship inside the wheel, so an installed
package follows them too. :func:`choose` looks the inputs up in the table of the GPU they are on
(:func:`use_table` or ``LEETREPRO_DISPATCH=path.csv``, read when the package loads, names
another file): same dtype and mask, the nearest batch, then
the nearest N on a log scale. Heads, r and d are not keys: the table is measured at the paper's
shape.

Without a table for this GPU (another GPU, the CPU), or when the table's choice cannot run the
inputs (a state is asked for, say), :func:`auto_method` follows :data:`AUTO_ORDER`: Vanilla for
N ≤ :data:`AUTO_SHORT_N` (Section 5.1: fastest there), else the first method of the list that is
registered and runs the inputs' dtype natively on their device. Choices are cached per
arguments (a model asks per layer); registering a method or rewriting a table clears the cache.
"""
from __future__ import annotations

import functools
import os

import torch

from . import registry, tuning
from ._device import gpu_tag
from ._inputs import SHORT_NAMES

AUTO_SHORT_N = 128
#: Chunk (this project's kernel, NOTES.md), lightningAttention-2 (fastest at batch 1 and N > 512
#: in Tables 3-4), then the PyTorch twins
AUTO_ORDER = ("Chunk", "LA", "LA_torch", "Bb")
STATE_ORDER = ("Chunk", "LA_torch")


#: a dispatch table that replaces every GPU's own (:func:`use_table`); the environment is read once
_OVERRIDE: list = [os.environ.get("LEETREPRO_DISPATCH") or None]


def use_table(path: str | None) -> None:
    """Make ``method="auto"`` follow the table at ``path`` on every GPU (None: each GPU's own
    ``data/<gpu>/dispatch.csv`` again); forgets the choices made so far."""
    _OVERRIDE[0] = path
    clear_cache()


def table_path(tag: str) -> str:
    return _OVERRIDE[0] or tuning.path(tag, "dispatch.csv")


def auto_method(n: int, dtype: torch.dtype, device, *, batch: int = 1, decay: bool = False,
                state: bool = False) -> registry.Method:
    """The method ``method="auto"`` uses for these inputs: the measured table's choice where
    there is one, else the rule above; with ``state``, only methods that take and return the
    recurrent state."""
    return _auto(n, dtype, torch.device(device), batch, decay, state)


@functools.lru_cache(maxsize=4096)
def _auto(n, dtype, device, batch, decay, state) -> registry.Method:
    def usable(m):
        # native devices only: a Triton kernel interpreted on a CPU is correct but very slow
        return (m.supports(dtype, device) and device.type in m.devices
                and not m.unsafe and (m.state or not state))

    picked = choose(n, batch, dtype, decay, device)
    candidates = ([picked] if picked else []) + list(
        STATE_ORDER if state else (("Vanilla",) + AUTO_ORDER if n <= AUTO_SHORT_N else AUTO_ORDER))
    for name in candidates:
        try:
            m = registry.get(name)
        except ValueError:
            continue
        if usable(m):
            return m
    raise ValueError(f"no registered method supports dtype {dtype} on {device}"
                     + (" with a state" if state else ""))


def choose(n: int, batch: int, dtype: torch.dtype, decay: bool, device) -> str | None:
    """The abbreviation the table names for these inputs, or None (no table, no matching rows)."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    return tuning.dispatch_choice(table_path(gpu_tag(device)), n, batch, SHORT_NAMES.get(dtype),
                                  bool(decay))


def clear_cache() -> None:
    """Forget every loaded table and every choice made from one (after ``make tune`` rewrote a
    table): :func:`leetrepro.tuning.clear`."""
    tuning.clear()


registry.on_change(_auto.cache_clear)
