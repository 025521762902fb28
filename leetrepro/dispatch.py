"""The measured dispatch table behind ``method="auto"``.

``make tune`` (:mod:`leetrepro.tune`) times every registered method on a grid (dtype × batch × N ×
mask, heads 32, r = d = 128) and writes ``data/<gpu>/dispatch.csv``: per cell the fastest method
(``best``) and every method's median. :func:`choose` looks the inputs up in the table of the GPU
they are on (``LEETREPRO_DISPATCH=path.csv`` overrides the file): same dtype and mask, the nearest
batch and the nearest N on a log scale. Heads, r and d are not keys: the table is measured at the
paper's shape. Without a table for this GPU, or when its choice cannot run these inputs (a state
is asked for, say), ``auto`` falls back to the rule in :mod:`leetrepro.api`.
"""
from __future__ import annotations

import functools
import math
import os

import torch

from ._inputs import SHORT_NAMES


def table_path(tag: str) -> str:
    return os.environ.get("LEETREPRO_DISPATCH") or os.path.join(
        os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", tag, "dispatch.csv")


@functools.lru_cache(maxsize=None)
def _load(path: str):
    if not os.path.exists(path):
        return None
    import pandas as pd
    return pd.read_csv(path)


@functools.lru_cache(maxsize=None)
def _tag(index: int) -> str:
    from .bench import gpu_tag
    return gpu_tag(torch.device("cuda", index))


def choose(n: int, batch: int, dtype: torch.dtype, decay: bool, device) -> str | None:
    """The abbreviation the table names for these inputs, or None (no table, no matching rows)."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _choose(table_path(_tag(index)), n, batch, SHORT_NAMES.get(dtype), bool(decay))


@functools.lru_cache(maxsize=4096)  # auto is called per layer: the lookup must cost ~nothing
def _choose(path: str, n: int, batch: int, dtype: str | None, decay: bool) -> str | None:
    table = _load(path)
    if table is None:
        return None
    rows = table[(table.dtype == dtype) & (table.decay == decay)]
    return None if rows.empty else _nearest(rows, n, batch)


def clear_cache() -> None:
    """Forget loaded tables and choices (after ``make tune`` rewrote a table)."""
    from .api import _auto_method
    _load.cache_clear()
    _choose.cache_clear()
    _auto_method.cache_clear()


def _nearest(rows, n: int, batch: int) -> str:
    lb, ln = math.log(max(batch, 1)), math.log(max(n, 1))
    b = min(rows.batch.unique(), key=lambda x: abs(math.log(x) - lb))
    rows = rows[rows.batch == b]
    best = min(rows.itertuples(), key=lambda r: abs(math.log(r.N) - ln))
    return best.best
