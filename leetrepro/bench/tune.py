"""``make tune``: measure every registered method on a grid and write the dispatch table that
``method="auto"`` uses on this GPU (``data/<gpu>/dispatch.csv``, :mod:`leetrepro.dispatch`), then
time ``auto`` against the best method of each cell and report its regret.

Grid: dtype (fp16, bf16, fp32) × batch (1, 16) × N (128 … 100000 at batch 1, … 25600 at batch 16)
× mask, heads 32, r = d = 128, the forward of head-major inputs: the regime the table speaks for
(its ``heads``, ``r``, ``d``, ``layout`` and ``pass`` columns; :func:`leetrepro.dispatch.choose`
leaves every other call to the rule). Each method: median of ``--reps`` CUDA-event timings of the Python
call after a warm-up. A method slower than ``--time-limit`` per call, or out of memory, is not
tried at larger N for that dtype/batch/mask (its times only grow). Unsafe methods (FA_modify)
and interpreted ones are never candidates.

A long run that was cut off goes on where it stopped with ``--resume``: the cells already in the
table are kept as measured (each row keeps its own provenance) and only the others are timed.

    python -m leetrepro.bench.tune --out data/h200 [--dtypes bfloat16 float32] [--resume]
"""
from __future__ import annotations

import os
import sys

import torch

from .. import dispatch
from .._dtypes import SHORT_NAMES, parse_dtype
from ..decay.per_head import alibi_gammas
from ..api import causal_linear_decoder
from ..dispatch import auto_method
from ..methods import methods
from .floor import GRID_N
from .harness import gpu_main, interleaved_medians, is_oom, median, random_inputs, time_calls


def candidates(dtype: torch.dtype) -> list[str]:
    return [m.abbr for m in methods() if not m.unsafe and m.supports(dtype, torch.device("cuda"))
            and "cuda" in m.devices]


def _time(fn, args, reps, device, limit: float = float("inf")) -> float:
    """Median seconds per call; a single call's time when even that exceeds ``limit``."""
    fn(*args[0])  # warm-up (compiles, builds)
    torch.cuda.synchronize(device)
    once = time_calls(fn, args, 1, device)[0]
    if once > limit:
        return once
    return median(time_calls(fn, args, reps, device))


def _paired(f1, f2, args, reps, device) -> tuple[float, float]:
    t = interleaved_medians({1: f1, 2: f2}, args, reps, device)
    return t[1], t[2]


def tune_cell(dtype, batch, n, decay, names, reps, limit, device, dropped: set, publish) -> dict:
    """Time every method on one cell; ``publish(row)`` puts its best into the table before
    ``auto`` (which reads the table) is timed against it."""
    gen = torch.Generator(device=device).manual_seed(n)
    per = batch * 32 * n * 384 * dtype.itemsize
    sets = [random_inputs(batch, 32, n, 128, 128, dtype=dtype, device=device, generator=gen)
            for _ in range(2 if per < 2 ** 30 else 1)]
    g = alibi_gammas(32).view(32, 1) if decay else None
    # the regime the cell stands for (dispatch.choose follows the table only there)
    row = dict(dtype=SHORT_NAMES[dtype], batch=batch, decay=decay, N=n, heads=32, r=128, d=128,
               layout="head-major", **{"pass": "fwd"})
    for name in names:
        if name in dropped:
            row[f"t_{name}"] = float("nan")
            continue
        fn = (lambda B, C, V, m=name: causal_linear_decoder(B, C, V, g, method=m))
        try:
            t = _time(fn, sets, reps, device, limit)
            if t > limit:
                dropped.add(name)
        except Exception as err:  # OOM or a method that cannot take the cell
            t = float("nan")
            dropped.add(name)
            if not is_oom(err):
                print(f"  {name}: {type(err).__name__}: {str(err)[:100]}", file=sys.stderr)
        torch.cuda.empty_cache()
        row[f"t_{name}"] = t
    times = {k[2:]: v for k, v in row.items() if k.startswith("t_") and v == v}
    row["best"] = min(times, key=times.get)
    row["best_s"] = times[row["best"]]
    publish(row)
    # auto as a user calls it, against the best method called by name, timed call by call in
    # alternation (each call synchronised), so drift and noise hit both alike
    auto = (lambda B, C, V: causal_linear_decoder(B, C, V, g))
    best = (lambda B, C, V, m=row["best"]: causal_linear_decoder(B, C, V, g, method=m))
    row["auto_s"], row["best_again_s"] = _paired(auto, best, sets, 2 * reps + 1, device)
    row["auto"] = auto_method(n, dtype, device, batch=batch, decay=decay).abbr
    row["regret"] = row["auto_s"] / row["best_again_s"] - 1
    return row


def _arguments(p) -> None:
    p.add_argument("--dtypes", nargs="*", default=["float16", "bfloat16", "float32"])
    p.add_argument("--batches", nargs="*", type=int, default=[1, 16])
    p.add_argument("--seqlens", nargs="*", type=int, default=None)
    p.add_argument("--reps", type=int, default=15)
    p.add_argument("--time-limit", type=float, default=0.25)
    p.add_argument("--resume", action="store_true",
                   help="keep the cells already in dispatch.csv and time only the others")


CELL = ["dtype", "batch", "decay", "N"]


def measured_before(path: str, limit: float):
    """The rows of an earlier run of this table (``--resume``) and, per (dtype, batch, mask), the
    methods it dropped (out of time or memory at some N: not tried at larger N). A cell cut off
    after its best was published but before ``auto`` was timed against it is measured again."""
    import pandas as pd

    if not os.path.exists(path):
        return [], {}
    old = pd.read_csv(path, dtype={"commit": str})  # (kept rows are written back: as text)
    old = old[old.regret.notna()] if "regret" in old else old.iloc[:0]
    dropped: dict = {}
    for row in old.to_dict("records"):
        names = {k[2:] for k, v in row.items() if k.startswith("t_") and not v <= limit}
        dropped.setdefault((row["dtype"], row["batch"], row["decay"]), set()).update(names)
    return old.to_dict("records"), dropped


def main(argv=None) -> int:

    args, setup = gpu_main("tune", __doc__, argv, _arguments, output="dispatch.csv")
    if setup is None:
        return 2
    import pandas as pd

    device, meta, out = setup
    path = os.path.join(out, "dispatch.csv")
    dispatch.use_table(path)  # auto, timed below, reads the table being written
    kept, dropped_before = measured_before(path, args.time_limit) if args.resume else ([], {})
    done = {tuple(r[k] for k in CELL) for r in kept}
    rows = []

    def table(extra=()):  # earlier rows keep their provenance; this run's get its own
        return pd.concat([pd.DataFrame(kept), pd.DataFrame(rows + list(extra)).assign(**meta)],
                         ignore_index=True)

    for dt in map(parse_dtype, args.dtypes):
        for batch in args.batches:
            for decay in (False, True):
                dropped = set(dropped_before.get((SHORT_NAMES[dt], batch, decay), ()))
                for n in args.seqlens or GRID_N.get(batch, GRID_N[16]):
                    if (SHORT_NAMES[dt], batch, decay, n) in done:
                        continue

                    def publish(row):  # the table grows as it is measured; auto reads this run's
                        table([row]).to_csv(path, index=False)
                        dispatch.clear_cache()
                    r = tune_cell(dt, batch, n, decay, candidates(dt), args.reps,
                                  args.time_limit, device, dropped, publish)
                    rows.append(r)
                    print(f"{r['dtype']} b{batch} {'decay' if decay else '0-1  '} N={n:6d} best "
                          f"{r['best']:8s} {r['best_s'] * 1e3:9.3f} ms | auto {r['auto']:8s} "
                          f"regret {r['regret'] * 100:+5.1f}%", flush=True)
    df = table()
    df.to_csv(path, index=False)
    print(f"wrote {path}: max regret of auto {df.regret.max() * 100:.1f}% "
          f"(median {df.regret.median() * 100:.1f}%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
