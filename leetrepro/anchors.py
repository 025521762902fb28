"""The reference measurements of the original LeetDecoding code and flash-linear-attention on the
lent H100 (``data/anchors/``, see its README), and comparisons of our measurements with them."""
from __future__ import annotations

import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ANCHORS = os.path.join(ROOT, "data", "anchors", "h100-originals-and-fla.csv")

#: issue 3's targets: (method, dtype, batch, decay, N) cells where ours must not be slower than
#: the original code (the original FA is wrong everywhere, so its time is a bound, not a peer)
TARGET_CELLS = [(m, "fp32", b, dec, n) for m in ("LA", "Cdotp", "FA")
                for b, n in ((1, 100000), (16, 25600)) for dec in (False, True)]


def load_anchors():
    import pandas as pd
    return pd.read_csv(ANCHORS)


def versus_original(ours, cells=TARGET_CELLS):
    """One row per target cell: our median, the original's median and original/ours (> 1: we are
    faster). ``ours`` is a kernels.csv DataFrame (dtype spelled ``float32``/``float16``)."""
    import pandas as pd

    anchors = load_anchors()
    short = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}
    rows = []
    for method, dtype, batch, decay, n in cells:
        a = anchors[(anchors.method == method) & (anchors.dtype == dtype) & (anchors.batch == batch)
                    & (anchors.decay == decay) & (anchors.N == n)]
        o = ours[(ours.method == method) & (ours.dtype.map(short) == dtype) & (ours.batch == batch)
                 & (ours.decay == decay) & (ours.N == n)]
        orig = a.median_s.iloc[0] if len(a) and a.status.iloc[0] == "ok" else float("nan")
        mine = o.median_s.iloc[0] if len(o) and o.status.iloc[0] == "ok" else float("nan")
        rows.append(dict(method=method, dtype=dtype, batch=batch, decay=decay, N=n,
                         ours_ms=mine * 1e3, original_ms=orig * 1e3, speedup=orig / mine,
                         meets=bool(mine <= orig)))
    return pd.DataFrame(rows)


def versus_twins(ours, min_n: int = 2048):
    """Speed-up of each GPU kernel over its PyTorch twin per cell with N ≥ ``min_n`` (the paper's
    "2×–20×"); NaN where the twin was not run (>limit, OOM)."""
    import pandas as pd

    key = ["dtype", "batch", "decay", "N"]
    rows = []
    for gpu, twin in (("LA", "LA_torch"), ("FA", "FA_torch"), ("Cdotp", "Cdotp_torch")):
        g = ours[(ours.method == gpu) & (ours.N >= min_n)].set_index(key).median_s
        t = ours[(ours.method == twin) & (ours.N >= min_n)].set_index(key).median_s
        both = pd.concat([g.rename("kernel_s"), t.rename("twin_s")], axis=1).dropna()
        both["speedup"] = both.twin_s / both.kernel_s
        both["method"] = gpu
        rows.append(both.reset_index())
    return pd.concat(rows, ignore_index=True)
