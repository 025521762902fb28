"""The measured tables every choice of the package reads, and the defaults used without them.

``make tune`` (:mod:`leetrepro.bench.tune`) measures four tables per GPU into ``data/<gpu>/``; an
installed wheel carries them (``leetrepro/data/<gpu>/``). Each is read here, through one reader
(:func:`rows`: the CSV's rows as string dicts, cached per file), and turned into what its user
looks up:

=====================  ==========================================  ===========================
file                   key → value                                  read by
=====================  ==========================================  ===========================
``dispatch.csv``       (dtype, decay, lanes, N, r, d) → method      :func:`dispatch_row`
                                                                    (``method="auto"``)
``chunk_config.csv``   (operand kind, decay) → (BLOCK_N, stages)    :func:`launch_table`
                                                                    (Chunk's portable kernel)
``la_config.csv``      (operand kind, decay) → (warps, stages)      :func:`launch_table` (LA)
``chunk_kernel.csv``   (kind, dtype, mask, regime, r, d) → kernel  :func:`kernel_table`
                                                                    (Chunk: portable or Hopper)
=====================  ==========================================  ===========================

A GPU without a table (another GPU, the CPU) takes the defaults below: :data:`CHUNK_TABLE`,
:data:`DUAL_TABLE`, :data:`LA_TABLE` and :data:`HOPPER` (the Hopper kernel's launch constants,
which no table overrides); where ``chunk_kernel.csv`` is missing, the portable kernel.

**One invalidation.** :func:`clear` (after ``make tune`` rewrote a table, or to follow another
dispatch file) forgets every table read and every choice derived from one: it is
:func:`leetrepro.registry.changed`, which registering a method also calls and which every cache
of choices (auto's, Chunk's launch plans) listens to.

Where each default comes from is in NOTES.md (the sweeps behind them); the measured tables on
the results page (``make results``).
"""
from __future__ import annotations

import csv
import functools
import math
import os

from . import registry
from ._device import gpu_tag
from ._paths import data

#: Chunk's portable kernel: (operand kind, decay) -> (BLOCK_N, pipeline stages) at
#: r·d ≤ 128·128, from the H100 sweeps. fp32 tiles are twice the bytes, so fp32 gets fewer rows or
#: stages; tf32x3/ieee split or widen the operands: 16-row chunks, whose three-part operands spill
#: a third of what 32-row ones do.
CHUNK_TABLE = {("half", False): (64, 4), ("half", True): (64, 4),
               ("tf32", False): (32, 2), ("tf32", True): (64, 2),
               ("exact", False): (16, 1), ("exact", True): (16, 1)}
#: the dual sweep (the backward's dV and dC) stages a fourth tile per row block: fewer stages,
#: fp32 in 32-row blocks, so that four tiles per stage fit an H100's shared memory
#: (:data:`leetrepro._device.SM90_SHARED_BYTES`); exact products in 16-row ones (half the spills)
DUAL_TABLE = {"half": (64, 2), "tf32": (32, 2), "exact": (16, 1)}
#: LA: (operand kind, decay) -> (num_warps, num_stages) at r ≤ 128, from the H100 sweep at batch 1,
#: N = 100000, r = d = 128; tf32x3 splits operands and fits one stage only
LA_TABLE = {("half", False): (4, 2), ("half", True): (4, 1), ("tf32", False): (4, 1),
            ("tf32", True): (8, 2), ("tf32x3", False): (4, 1), ("tf32x3", True): (4, 1),
            ("ieee", False): (4, 2), ("ieee", True): (4, 2)}
#: the Hopper kernel's launch: 64-row chunks, 4 warps launched (the loader) and 168 registers a
#: thread, moved by ``setmaxnreg`` to the two consumer warp groups (240 each) from the loader (24);
#: the ring's depth follows the tiles (:func:`leetrepro.methods.chunk.hopper_tiles`), at most
#: MAX_STAGES slots
#: (MIN_SEGMENT: the fewest rows a segment of the Hopper kernel's default split holds, eight
#: tiles; shorter ones leave its loader/consumer pipeline too few tiles to overlap, NOTES.md)
HOPPER = dict(BLOCK_N=64, MAX_STAGES=4, num_warps=4, maxnreg=168, MIN_SEGMENT=512)


def path(tag: str, name: str) -> str:
    """``data/<tag>/<name>`` of this copy of the package."""
    return data(tag, name)


@functools.lru_cache(maxsize=None)
def rows(file: str) -> tuple[dict, ...]:
    """The rows of the CSV at ``file`` as dicts of strings; () where there is no such file. The
    one reader and the one cache of the tables (:func:`clear` empties it)."""
    if not os.path.exists(file):
        return ()
    with open(file, newline="") as f:
        return tuple(csv.DictReader(f))


def launch_table(device, name: str, columns: tuple[str, str]) -> dict:
    """``{(kind, decay): (a, b)}`` from ``data/<gpu>/<name>`` of the GPU ``device`` is on (a
    launch table: :mod:`leetrepro.bench.sweep`), the two integer ``columns`` per row; {} without a
    device or where that GPU has no such table."""
    if device is None:
        return {}
    return dict(_launch_table(gpu_tag(device), name, columns))


@functools.lru_cache(maxsize=None)
def _launch_table(tag: str, name: str, columns: tuple[str, str]) -> tuple:
    return tuple(((r["kind"], r["decay"] == "True"), (int(r[columns[0]]), int(r[columns[1]])))
                 for r in rows(path(tag, name)))


@functools.lru_cache(maxsize=None)
def kernel_table(tag: str) -> dict:
    """``{"rows": {(kind, dtype, decay, regime, r, d): kernel}, "shapes": {(r, d), ...}}`` of this
    GPU's ``chunk_kernel.csv`` (rows without r and d columns are r = d = 128's; without a dtype,
    ``""``: the kind's every dtype)."""
    found = {(r["kind"], r.get("dtype") or "", r["decay"] == "True", r["regime"],
              int(r.get("r") or 128), int(r.get("d") or 128)): r["kernel"]
             for r in rows(path(tag, "chunk_kernel.csv"))}
    return dict(rows=found, shapes={k[4:] for k in found})


#: the regime a dispatch table was measured in where its rows do not say (``make tune``'s)
DISPATCH_REGIME = dict(heads="32", r="128", d="128", layout="head-major", **{"pass": "fwd"})


@functools.lru_cache(maxsize=4096)  # auto is called per layer: the lookup must cost ~nothing
def dispatch_row(file: str, n: int, lanes: int, dtype: str | None, decay: bool, r: int = 128,
                 d: int = 128) -> tuple[str, float] | None:
    """``(best, margin)`` of the dispatch table (``file``) row for a forward of N rows over
    ``lanes`` (batch × heads) head-major lanes: same dtype (short name), mask, r and d, the
    nearest lanes, then the nearest N, both on a log scale; ``margin`` is Chunk's time over the
    best's in that row (inf where Chunk has no time). None without a table or a matching row."""
    def get(row, key):
        return row.get(key) or DISPATCH_REGIME[key]

    def num(row, key):  # (a column pandas wrote with blanks holds "64.0")
        return int(float(get(row, key)))

    found = [x for x in rows(file) if x["dtype"] == dtype and (x["decay"] == "True") == decay
             and num(x, "r") == r and num(x, "d") == d
             and get(x, "layout") == "head-major" and get(x, "pass") == "fwd"]
    if not found:
        return None
    ll, ln = math.log(max(lanes, 1)), math.log(max(n, 1))

    def lanes_of(x):
        return int(x["batch"]) * num(x, "heads")

    nearest = min(dict.fromkeys(map(lanes_of, found)), key=lambda x: abs(math.log(x) - ll))
    row = min((x for x in found if lanes_of(x) == nearest),
              key=lambda x: abs(math.log(int(x["N"])) - ln))
    best = row["best"]
    chunk, fastest = _seconds(row.get("t_Chunk")), _seconds(row.get(f"t_{best}") or row.get("best_s"))
    margin = chunk / fastest if chunk == chunk and fastest == fastest and fastest > 0 else math.inf
    return best, margin


def _seconds(text) -> float:
    try:
        return float(text)
    except (TypeError, ValueError):
        return math.nan


def clear() -> None:
    """Forget every table read and every choice made from one (after ``make tune`` rewrote a
    table): :func:`leetrepro.registry.changed`, which each cache of such choices listens to."""
    registry.changed()


for _cache in (rows, _launch_table, kernel_table, dispatch_row):
    registry.on_change(_cache.cache_clear)
