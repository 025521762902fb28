"""Benchmark harness: the paper's Listing 1 (``benchmark_method``) and the timing primitives the
notebooks and ``python -m leetrepro.*`` scripts share.

Protocol (Section 5.1): inputs ``randn`` of shape (batch, heads, N, r|d), one warm-up call (Triton
compiles there; it is also the call checked against ``time_limit``), then ``reps`` timed calls.
On CUDA each call is timed with a pair of CUDA events and the device is synchronised once at the
end; when the inputs are small enough to sit in L2, several input sets are rotated so the cache
does not flatter the numbers. Out-of-memory cells read ``OOM``; a cell whose warm-up call takes
longer than ``time_limit`` seconds (a second call is timed when the first one compiled) reads
``>limit`` and the larger N of the sweep are not run.
"""
from __future__ import annotations

import datetime
import functools
import hashlib
import math
import os
import random
import statistics
import subprocess
import sys
import time
import warnings
from typing import Callable, Sequence

import torch

from .._device import device_name, gpu_tag
from .._dtypes import DTYPE_NAMES, parse_dtype
from ..decay.per_head import alibi_gammas
from .._paths import PACKAGE, ROOT

PAPER_SEQLENS = (128, 512, 2048, 8192, 12800, 25600, 100000)
ROTATE_BELOW_BYTES = 256 * 2 ** 20  # rotate input sets while one set is smaller than this


def git_commit() -> str:
    """The commit a measurement comes from (:func:`commit_and_origin`)."""
    return commit_and_origin()[0]


def commit_and_origin() -> tuple[str, str]:
    """``(commit, origin)``. ``$LEETREPRO_COMMIT`` set: that commit, origin ``"declared"`` (a copy
    of the tree whose own history is absent or stale, on a GPU host say; the source hash recorded
    beside it lets anyone check the claim). Else this checkout's short commit, origin ``"git"``,
    and with uncommitted changes ``<commit>-dirty-<hash of the diff>``, so a row measured on a
    modified tree says so and which modification it was. Only a repository whose top level is
    this package's own root counts: a copy exported into another repository must not take that
    repository's commit (``"unknown"``)."""
    if os.environ.get("LEETREPRO_COMMIT"):
        return os.environ["LEETREPRO_COMMIT"], "declared"
    try:
        top = subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True,
                             text=True, timeout=10, cwd=ROOT)
        if top.returncode != 0 or os.path.realpath(top.stdout.strip()) != os.path.realpath(ROOT):
            return "unknown", "unknown"
        head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], capture_output=True,
                              text=True, timeout=10, cwd=ROOT)
        if head.returncode != 0:
            return "unknown", "unknown"
        diff = subprocess.run(["git", "diff", "HEAD"], capture_output=True, timeout=30, cwd=ROOT)
        if diff.stdout.strip():
            digest = hashlib.sha256(diff.stdout).hexdigest()[:8]
            return f"{head.stdout.strip()}-dirty-{digest}", "git"
        return head.stdout.strip(), "git"
    except (OSError, subprocess.SubprocessError):
        return "unknown", "unknown"


@functools.lru_cache(maxsize=1)
def source_hash() -> str:
    """sha256 (12 hex digits) of the package's source and kernel files as they are on disk: the
    same at every copy of one commit, so a row whose commit was declared can be checked."""
    digest = hashlib.sha256()
    for label, folder in (("leetrepro", PACKAGE),):
        for dirpath, dirnames, files in os.walk(folder):
            dirnames[:] = sorted(d for d in dirnames if d not in ("__pycache__", "data"))
            for name in sorted(files):
                if name.endswith((".py", ".cu", ".cpp", ".cuh")):
                    path = os.path.join(dirpath, name)
                    digest.update(f"{label}/{os.path.relpath(path, folder)}".encode())
                    with open(path, "rb") as f:
                        digest.update(f.read())
    return digest.hexdigest()[:12]


def provenance(device) -> dict:
    """Where a measurement comes from: device name, commit, UTC date, library versions. Every CSV
    written under data/ carries these columns."""
    from importlib import metadata

    def version(pkg):
        try:
            return metadata.version(pkg)
        except metadata.PackageNotFoundError:
            return "absent"

    commit, origin = commit_and_origin()
    return dict(gpu=device_name(device), commit=commit, commit_origin=origin, source=source_hash(),
                date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%MZ"),
                torch=torch.__version__, triton=version("triton"), cuda=torch.version.cuda or "",
                python=sys.version.split()[0])


def runs_of(tables) -> dict:
    """Where a derived table's rows come from (a claim judged on measured tables, say): the GPUs,
    commits and dates of ``tables`` (DataFrames or None), each a space-separated sorted list;
    "paper" where the tables carry none (the paper's own numbers), "none" where there are no
    tables (nothing measured); ``one_run``: at most one commit."""
    tables, out = [t for t in tables if t is not None], {}
    for col in ("gpu", "commit", "date"):
        vals = sorted({str(v) for df in tables if col in df for v in df[col].dropna().unique()})
        out[col + "s"] = (("; " if col == "gpu" else " ").join(vals) if vals else
                          "paper" if tables else "none")
    out["one_run"] = len(out["commits"].split()) <= 1
    return out


def gpu_script_setup(script: str, out: str | None):
    """What every GPU script starts with: (device, provenance, output folder), or None after
    saying why when there is no GPU. The folder defaults to ``data/<gpu tag>`` and is created."""
    if not torch.cuda.is_available():
        print(f"{script} needs a CUDA GPU", file=sys.stderr)
        return None
    device = torch.device("cuda")
    out = out or os.path.join("data", gpu_tag(device))
    os.makedirs(out, exist_ok=True)
    return device, provenance(device), out


def gpu_main(script: str, doc: str, argv, configure: Callable, *, output: str,
             bandwidth: bool = False):
    """What every GPU script's ``main`` starts with: its command line (``--out``, the folder for
    ``output``, plus what ``configure(parser)`` adds) parsed from ``argv``, then
    :func:`gpu_script_setup` (:func:`bench_setup` with ``bandwidth``). Returns ``(args, setup)``;
    ``setup`` is None without a GPU (said on stderr)."""
    import argparse
    p = argparse.ArgumentParser(description=doc.split("\n")[0])
    p.add_argument("--out", default=None, help=f"folder for {output} (default data/<gpu>)")
    configure(p)
    args = p.parse_args(argv)
    return args, (bench_setup if bandwidth else gpu_script_setup)(script, args.out)


def bench_setup(script: str, out: str | None):
    """``gpu_script_setup`` plus the copy bandwidth, measured and printed: (device, provenance,
    folder, bytes/s), or None without a GPU."""
    setup = gpu_script_setup(script, out)
    if setup is None:
        return None
    device, meta, out = setup
    bw = copy_bandwidth(device)
    print(f"{meta['gpu']}: device-to-device copy {bw / 1e12:.2f} TB/s", flush=True)
    return device, meta, out, bw


def copy_bandwidth(device, nbytes: int = 2 * 2 ** 30, reps: int = 20) -> float:
    """Bytes read + written per second by a device-to-device copy (the memory ceiling)."""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).uniform_()
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    times = time_calls(lambda: dst.copy_(src), [()], reps, device)
    return 2 * nbytes / median(times)


def random_inputs(batch: int, heads: int, n: int, r: int, d: int, *, dtype=torch.float32,
                  device="cpu", seed: int = 0, generator: torch.Generator | None = None,
                  scale_bc: bool = False) -> tuple:
    """B, C ``(batch, heads, n, r)`` and V ``(batch, heads, n, d)`` from ``randn``, drawn on the
    device in the target dtype (long sequences have no room for a float32 copy). ``scale_bc``
    divides B and C by sqrt(r), so that sums stay O(1) in half precision (the correctness checks)."""
    gen = generator or torch.Generator(device=device).manual_seed(seed)
    B, C = (torch.randn(batch, heads, n, r, generator=gen, device=device, dtype=dtype)
            for _ in range(2))
    if scale_bc:
        B, C = B.mul_(r ** -0.5), C.mul_(r ** -0.5)
    return B, C, torch.randn(batch, heads, n, d, generator=gen, device=device, dtype=dtype)


def fla_chunk_simple_gla():
    """flash-linear-attention's ``chunk_simple_gla`` (the optional peer ``fla-core``), or None after
    saying how to install it."""
    try:
        from fla.ops.simple_gla import chunk_simple_gla
    except ImportError as err:
        print(f"fla: not installed ({err}); `pip install fla-core` or `make wheelhouse`",
              file=sys.stderr)
        return None
    return chunk_simple_gla


def mamba_ssm_peer(path: str | None = None, module: str = "ops.triton.ssd_combined",
                   name: str = "mamba_chunk_scan_combined"):
    """mamba_ssm's SSD (its Triton kernels: ``ssd_combined.mamba_chunk_scan_combined``; another
    of its Triton entry points by ``module`` and ``name``, Mamba-3's
    ``ops.triton.mamba3.mamba3_siso_combined`` say), or None after saying why. From an
    installed ``mamba_ssm`` (``MAMBA_SKIP_CUDA_BUILD=TRUE pip install mamba_ssm --no-deps``:
    its Triton kernels need no CUDA build, only ``einops``), else from its
    public source at ``path`` (default ``$LEETREPRO_PEERS``): a folder holding ``mamba_ssm/`` and
    ``einops/``, never committed. Only the Triton kernels' modules are imported (the package's
    ``__init__`` pulls in its CUDA extensions and huggingface_hub)."""
    import importlib
    import os
    import types
    path = path or os.environ.get("LEETREPRO_PEERS")
    path = os.path.abspath(path) if path else None
    try:
        if path and "mamba_ssm" not in sys.modules:
            if path not in sys.path:
                sys.path.insert(0, path)
            pkg = types.ModuleType("mamba_ssm")  # (the package without its __init__)
            pkg.__path__ = [os.path.join(path, "mamba_ssm")]
            sys.modules["mamba_ssm"] = pkg
        mod = importlib.import_module(f"mamba_ssm.{module}")
    except ImportError as err:
        print(f"mamba_ssm: not importable ({err}); `MAMBA_SKIP_CUDA_BUILD=TRUE pip install "
              f"mamba_ssm einops` or its source in $LEETREPRO_PEERS", file=sys.stderr)
        return None
    return getattr(mod, name)


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def is_oom(err: BaseException) -> bool:
    return isinstance(err, torch.cuda.OutOfMemoryError) or (
        isinstance(err, (RuntimeError, MemoryError)) and "out of memory" in str(err).lower()) \
        or isinstance(err, MemoryError)


def failed_status(err: BaseException, width: int = 100) -> str:
    """A cell's ``status`` when its call raised: ``OOM``, or the error's type and the first
    ``width`` characters of its message (one failing cell is a row, never an abort)."""
    return "OOM" if is_oom(err) else f"error: {type(err).__name__}: {str(err)[:width]}"


def sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def time_calls(fn: Callable, arg_sets: Sequence[tuple], reps: int, device) -> list[float]:
    """Seconds per call of ``fn(*args)`` for ``reps`` calls, cycling through ``arg_sets``."""
    device = torch.device(device)
    if device.type == "cuda":
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(reps)]
        for i, (start, stop) in enumerate(events):
            args = arg_sets[i % len(arg_sets)]
            start.record()
            fn(*args)
            stop.record()
        torch.cuda.synchronize(device)
        return [start.elapsed_time(stop) / 1e3 for start, stop in events]
    times = []
    for i in range(reps):
        args = arg_sets[i % len(arg_sets)]
        t0 = time.perf_counter()
        fn(*args)
        times.append(time.perf_counter() - t0)
    return times


#: bytes written between timed calls by ``interleaved_medians(flush=True)``: over twice the L2 of
#: the GPUs measured here (H100 50 MB, H200 60 MB)
L2_FLUSH_BYTES = 256 * 2 ** 20


def interleaved_medians(fns: dict, arg_sets: Sequence[tuple], reps: int, device,
                        warmup: int = 1, shuffle: bool = False, flush: bool = False,
                        seed: int = 0) -> dict:
    """Median seconds per call of each ``fns[k]`` (:func:`time_calls`), the entries called in turn
    so that drift and noise hit every one alike; round i passes ``arg_sets[i % len(arg_sets)]``.
    ``warmup`` untimed calls of each first (compiles, caches). ``shuffle``: each round calls the
    entries in its own order (seeded by ``seed`` and the round: give each cell of a sweep its
    own seed, or one entry takes the same places in every cell), so that no entry always follows
    the same other (what one call leaves in the GPU's caches or the host's favours whichever
    entry comes next: entries sharing inputs, say).
    ``flush`` (CUDA): :data:`L2_FLUSH_BYTES` written, and the GPU synchronised, before every timed
    call, so that none finds another's data in L2 and an eager call's host time stays exposed."""
    for fn in fns.values():
        for _ in range(warmup):
            fn(*arg_sets[0])
    device = torch.device(device)
    scrub = torch.empty(L2_FLUSH_BYTES // 4, dtype=torch.float32, device=device) \
        if flush and device.type == "cuda" else None
    keys = list(fns)
    times = {k: [] for k in keys}
    for i in range(reps):
        args = [arg_sets[i % len(arg_sets)]]
        for k in random.Random(seed * 7919 + i).sample(keys, len(keys)) if shuffle else keys:
            if scrub is not None:
                scrub.zero_()
                torch.cuda.synchronize(device)
            times[k] += time_calls(fns[k], args, 1, device)
    return {k: median(v) for k, v in times.items()}


def timed_entries(entries: dict, args: tuple, reps: int, device, seed: int = 0) -> tuple:
    """``({"eager": {name: s}, "graph": {name: s}}, status)``: the median seconds of each entry
    ``fn(*args)`` eager (interleaved, :func:`interleaved_medians`) and replayed from a CUDA graph
    (:func:`graph_seconds`), and why an entry has none (``status[name]`` for its first call,
    ``status[name + "/graph"]`` for its capture). Each entry is called once alone first, in
    ``entries``' order (put the peers last: a call that raises must leave nothing behind for a
    later capture)."""
    fns, status = {}, {}
    for name, fn in entries.items():
        try:
            fn(*args)
            sync(device)
            fns[name] = fn
        except Exception as err:  # (a peer's refusal, say: recorded, not hidden)
            status[name] = failed_status(err, 200)
    times = {"eager": interleaved_medians(fns, [args], reps, device, warmup=2, shuffle=True,
                                          seed=seed), "graph": {}}
    for name, fn in fns.items():
        try:
            times["graph"][name] = graph_seconds(fn, args, reps, device)
        except Exception as err:
            status[f"{name}/graph"] = failed_status(err, 200)
            sync(device)
    return times, status


def wall_per_call(fn: Callable, calls: int, device) -> float:
    """Wall seconds per call of ``calls`` back-to-back calls of ``fn()``, synchronised at the end:
    host and GPU overlapped, what a loop (a serving engine's steps) pays per call."""
    fn()
    sync(device)
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    sync(device)
    return (time.perf_counter() - t0) / calls


def peak_above(fn: Callable, device) -> tuple:
    """``(fn(), bytes)``: the call's result and the most it allocated on the GPU at once beyond
    what was allocated before it (what it returns included: subtract it where only the workspace
    counts)."""
    sync(device)
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    result = fn()
    sync(device)
    return result, torch.cuda.max_memory_allocated(device) - base


def host_seconds(fn: Callable, args: tuple, reps: int, device) -> float:
    """Median host time of ``fn(*args)``: the call alone, the GPU idle before each (what a
    caller's CPU spends to launch it, independent of the GPU's work)."""
    times = []
    for _ in range(reps):
        sync(device)
        t0 = time.perf_counter()
        fn(*args)
        times.append(time.perf_counter() - t0)
    sync(device)
    return median(times)


def capture_graph(fn: Callable, args: tuple, device) -> "torch.cuda.CUDAGraph":
    """``fn(*args)`` captured in a CUDA graph, after two warm-up calls on a side stream (what
    capture needs: kernels compiled, allocations made outside the graph). Raises where the call
    cannot be captured."""
    device = torch.device(device)
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(2):
            fn(*args)
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn(*args)
    return graph


def graph_seconds(fn: Callable, args: tuple, reps: int, device) -> float:
    """Median seconds per replay of ``fn(*args)`` captured once (:func:`capture_graph`): what a
    caller that captures its step pays per call, host launch cost included."""
    graph = capture_graph(fn, args, device)
    return median(time_calls(graph.replay, [()], reps, device))


def _progress(items, desc: str, enabled: bool):
    if not enabled:
        return items
    try:
        import importlib.util
        # tqdm.auto warns where Jupyter has no widgets (a GPU host, say): text bars there
        if importlib.util.find_spec("ipywidgets") is not None:
            from tqdm.auto import tqdm
        else:
            from tqdm import tqdm
        return tqdm(items, desc=desc, leave=False)
    except ImportError:  # pragma: no cover
        return items


def format_cell(mean: float, std: float) -> str:
    """The paper's way of printing a cell: mean ± std, three significant digits."""
    return f"{mean:.2e} ± {std:.1e}"


def benchmark_method(method, device: str = "cuda", dtype: str = "float32", batch_size: int = 1,
                     is_weight_decay: bool = False, gamma=None,
                     seqlens: Sequence[int] = PAPER_SEQLENS, heads: int = 32, rank: int = 128,
                     dim: int = 128, reps: int = 15, *, time_limit: float = 60.0, seed: int = 0,
                     progress: bool = True, options: dict | None = None,
                     max_cell_seconds: float | None = None):
    """Time ``method`` over ``seqlens`` (the paper's Listing 1).

    Args:
        method: a registered name/abbreviation, or any callable ``(B, C, V, gamma) -> O``.
        device, dtype: where and in what precision (``"float32"``, ``"fp16"``, ``torch.bfloat16``...).
        is_weight_decay: use the decaying mask; ``gamma`` then defaults to ALiBi-style per-head
            decays (:func:`leetrepro.decay.per_head.alibi_gammas`), shape ``(heads, 1)``.
        heads, rank, dim: H, r, d of the inputs; ``reps``: timed calls per N (paper: 15).
        time_limit: seconds one warm-up call may take before the cell reads ``>limit``.
        options: keyword options for a registered method (e.g. ``{"block_size": 128}``).
        max_cell_seconds: if set, a slow cell runs fewer than ``reps`` calls (at least 3) so that
            it takes about this long; the ``reps`` column says how many ran.

    Returns:
        pandas DataFrame, one row per N: ``mean_s``, ``std_s`` (sample), ``median_s``, ``min_s``,
        ``max_s``, ``reps``, ``peak_mem_GB`` (CUDA only), ``status`` (ok | OOM | >limit),
        ``cell`` (``"mean ± std"`` or the status), plus the run's configuration.

    Raises:
        ValueError: an unknown method, dtype or option value (before anything is timed); any
        error of the method other than running out of memory (a cell never hides a bug).
    """
    import pandas as pd

    from ..api import causal_linear_decoder

    torch_dtype = parse_dtype(dtype)
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device='cuda' but torch sees no GPU; pass device='cpu'")
    if is_weight_decay:
        g = alibi_gammas(heads).view(heads, 1) if gamma is None else gamma
        g = torch.as_tensor(g, dtype=torch.float32).to(device)
    else:
        if gamma is not None:
            warnings.warn("benchmark_method: gamma is ignored without is_weight_decay=True "
                          "(the 0-1 causal mask is timed)", stacklevel=2)
        g = None
    if callable(method):
        if options:
            raise ValueError("options apply to a registered method, not to a callable")
        name, fn = getattr(method, "__name__", repr(method)), (lambda B, C, V: method(B, C, V, g))
    else:
        from ..ops import check_options
        from ..registry import get
        m = get(method)  # an unknown name raises here, before anything is timed
        opts = check_options(m, options or {})
        name = m.abbr
        fn = (lambda B, C, V: causal_linear_decoder(B, C, V, g, method=m.name, **opts))
    base = dict(method=name, device=device_name(device), dtype=DTYPE_NAMES[torch_dtype],
                batch=batch_size, heads=heads, rank=rank, dim=dim, decay=bool(is_weight_decay))
    rows, over_limit_at = [], None
    gen = torch.Generator(device=device).manual_seed(seed)  # on the device: GBs at long N
    for n in _progress(list(seqlens), f"{name} {base['dtype']} b{batch_size}", progress):
        row = dict(base, N=int(n), mean_s=math.nan, std_s=math.nan, median_s=math.nan,
                   min_s=math.nan, max_s=math.nan, reps=0, peak_mem_GB=math.nan)
        if over_limit_at is not None:
            rows.append(dict(row, status=">limit", cell=">limit",
                             note=f"not run: N={over_limit_at} already exceeded {time_limit:g} s"))
            continue
        arg_sets = []
        try:
            if device.type == "cuda":
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats(device)
            one_set = batch_size * heads * n * (2 * rank + dim) * torch_dtype.itemsize
            n_sets = 3 if one_set < ROTATE_BELOW_BYTES else 1
            for _ in range(n_sets):
                arg_sets.append(random_inputs(batch_size, heads, n, rank, dim, dtype=torch_dtype,
                                              device=device, generator=gen))
            sync(device)
            t0 = time.perf_counter()
            fn(*arg_sets[0])
            sync(device)
            first = time.perf_counter() - t0
            if first > time_limit:  # the first call may have compiled (Triton JIT, CUDA build)
                t0 = time.perf_counter()
                fn(*arg_sets[0])
                sync(device)
                first = time.perf_counter() - t0
            if first > time_limit:
                over_limit_at = n
                rows.append(dict(row, status=">limit", cell=">limit",
                                 note=f"warm-up call took {first:.1f} s"))
                continue
            n_reps = reps if max_cell_seconds is None else \
                max(min(reps, 3), min(reps, int(max_cell_seconds / max(first, 1e-9))))
            times = time_calls(fn, arg_sets, n_reps, device)
            mean = statistics.fmean(times)
            std = statistics.stdev(times) if n_reps > 1 else 0.0
            row.update(mean_s=mean, std_s=std, median_s=statistics.median(times),
                       min_s=min(times), max_s=max(times), reps=n_reps, status="ok",
                       cell=format_cell(mean, std), note="")
            if device.type == "cuda":
                row["peak_mem_GB"] = torch.cuda.max_memory_allocated(device) / 1e9
        except Exception as err:  # out of memory is a result; any other error is a bug: raise
            if not is_oom(err):
                raise
            rows.append(dict(row, status="OOM", cell="OOM",
                             note=f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"))
            continue
        finally:
            del arg_sets
        rows.append(row)
    return pd.DataFrame(rows)
