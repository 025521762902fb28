"""Sequence-parallel scaling: :func:`leetrepro.distributed.causal_linear_decoder_sp` on G GPUs beside
the single-GPU kernel on one, against the distributed memory floor, in one ``torchrun`` job.

    torchrun --nproc-per-node=2 -m leetrepro.bench.sp --out data/h200x2      (make bench-sp)

Per total N (batch 1, heads 32, r = d = 128, ALiBi-style decays, Chunk on each slice: ``--method``): the
forward (``fwd``) and forward + backward to dB, dC, dV (``fwd_bwd``), each a median over
``--reps`` steps after a warm-up; a step's time is the slowest rank's (CUDA events around the
call, all ranks released together by a barrier). Columns:

* ``floor_ms``: the distributed floor per GPU, (6 or 15 tensor passes of this rank's slice) ÷ the
  copy bandwidth measured in the same run: forward = its state pass (C, V) + the pass from the
  gathered prefix (B, C, V, O); backward = its reverse state pass (B, dO) + the fused backward
  (B, C, V, dO read, dB, dC, dV written). ``gpus = 1`` rows: the single-GPU kernel, floor 4 / 11.
* ``exchange_ms``: the all-gather of one rank's state packet alone (median, same run);
  ``bytes_exchanged``: bytes a rank receives per step (forward: one packet from every other rank;
  forward + backward: the backward's packet too), beside ``kv_bytes``, what gathering K and V
  would move (softmax context parallelism: the others' K and V, and their gradients back).
* ``single_gpu_ms``: the single-GPU kernel on the whole N, where it fits one GPU.
* ``check_rel_err``: a correctness check before timing, at N = ``--check-n`` in fp32 with
  tf32x3 products: O and dB, dC, dV of the distributed run against the single-GPU run on rank 0.
* ``longest``: ``--longest`` adds a row for the longest N that trains (forward + backward) on
  the G GPUs, from a list of candidates whose memory estimate fits.
* ``layout``: the slices as a model hands them (``time-major``, the default: views
  ``(1, L, heads, ·).transpose(1, 2)`` of contiguous leaves, read in place) or ``head-major``.
* ``status``: ``ok``, or ``oom`` for a cell whose memory estimate (:func:`cell_bytes`) exceeds
  what the GPUs have free (on every rank, checked before the cell runs: a cell sized for a larger
  GPU is a row, never a crash), its time empty.

Rows are written to ``sp.csv`` as each cell completes (a run cut short keeps them); ``--resume``
keeps the measured rows already there that name this commit and runs only the cells they lack
(those that did not fit before are tried again).
"""
from __future__ import annotations

import argparse
import math
import os
import sys

import torch
import torch.distributed as dist

from .._dtypes import SHORT_NAMES, parse_dtype
from ..decay.per_head import alibi_gammas
from ..api import causal_linear_decoder
from ..distributed import _all_gather, causal_linear_decoder_sp
from ..ops import output_like as ops_output_like
from ..reference import rel_error
from .._device import gpu_tag
from .harness import (copy_bandwidth, interleaved_medians, median, provenance, random_inputs,
                      time_calls)

HEADS, RANK, DIM = 32, 128, 128
FWD_PASSES, FWD_BWD_PASSES = 6, 15          # per rank, sequence-parallel
SINGLE_FWD, SINGLE_FWD_BWD = 4, 11          # one GPU


def _step(fn, device):
    """Seconds of ``fn()`` on the slowest rank: all ranks start together (barrier)."""
    dist.barrier()
    t = torch.tensor(time_calls(fn, [()], 1, device)[0], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def _timed(fn, reps, device, warmup=2):
    for _ in range(warmup):
        _step(fn, device)
    return median([_step(fn, device) for _ in range(reps)])


#: the memory a cell takes, in tensors of one rank's slice (batch · heads · L · 128 elements):
#: forward B, C, V, O and the workspace; forward + backward also dO, dB, dC, dV and the sweeps'
CELL_TENSORS = {"fwd": 4.3, "fwd_bwd": 8.3}


def cell_bytes(pass_: str, n: int, itemsize: int) -> int:
    """The memory estimate of a cell of ``n`` rows on one GPU (:data:`CELL_TENSORS`)."""
    return int(CELL_TENSORS[pass_] * n * HEADS * RANK * itemsize)


def cell_fits(pass_: str, n: int, itemsize: int, free: float) -> bool:
    """Whether a cell's estimate fits ``free`` bytes with 5 % to spare."""
    return cell_bytes(pass_, n, itemsize) <= 0.95 * free


def free_bytes(device, group_min: bool, cap: float = math.inf) -> float:
    """Bytes free on this GPU after the cache is emptied, at most ``cap`` (``group_min``: the
    least over the ranks, a collective call); on the CPU, ``cap``."""
    if device.type == "cuda":
        torch.cuda.empty_cache()
        cap = min(cap, float(torch.cuda.mem_get_info(device)[0]))
    free = torch.tensor(cap, device=device, dtype=torch.float64)
    if group_min:
        dist.all_reduce(free, op=dist.ReduceOp.MIN)
    return free.item()


def _make(n_local, dtype, device, seed, grad, layout="head-major"):
    """(the leaves, B, C, V as ``(1, heads, L, ·)``): time-major leaves ``(1, L, heads, ·)`` seen
    through ``transpose(1, 2)``, or head-major ones."""
    B, C, V = random_inputs(1, HEADS, n_local, RANK, DIM, dtype=dtype, device=device, seed=seed,
                            scale_bc=True)
    if layout == "time-major":
        B, C, V = (t.transpose(1, 2).contiguous() for t in (B, C, V))
    leaves = [t.requires_grad_(grad) for t in (B, C, V)]
    views = [t.transpose(1, 2) for t in leaves] if layout == "time-major" else leaves
    return leaves, views


def _fwd_bwd(call, leaves, views, dO):
    def step():
        for t in leaves:
            t.grad = None
        call(*views).backward(dO)
    return step


def check(n_total, device, rank, world, method):
    """O, dB, dC, dV of the distributed run against one GPU (rank 0), fp32 with tf32x3 products;
    every rank draws the whole input from the same seed and keeps its slice."""
    opts = dict(method=method, fp32_precision="tf32x3")
    g = alibi_gammas(HEADS).to(device)
    (B, C, V), _ = _make(n_total, torch.float32, device, 11, grad=True)
    dO = torch.randn(V.shape, device=device, generator=torch.Generator(device).manual_seed(12))
    per = n_total // world
    sl = slice(rank * per, (rank + 1) * per)
    parts = [t.detach()[:, :, sl].clone().requires_grad_() for t in (B, C, V)]
    out = causal_linear_decoder_sp(*parts, g, **opts)
    out.backward(dO[:, :, sl])
    if rank == 0:
        want = causal_linear_decoder(B, C, V, g, **opts)
        want.backward(dO)
        wants = [want.detach(), B.grad, C.grad, V.grad]
    errs = []
    for i, x in enumerate([out.detach()] + [t.grad for t in parts]):
        pieces = [torch.empty_like(x) for _ in range(world)]
        dist.all_gather(pieces, x.contiguous())
        if rank == 0:
            errs.append(rel_error(torch.cat(pieces, 2), wants[i]))
    err = torch.tensor(max(errs) if errs else 0.0, device=device)
    dist.broadcast(err, 0)
    return err.item()


def _measured(rows: list, gpus: int, n: int, pass_: str) -> float:
    """Seconds of a kept row (``--resume``), NaN where it was not run."""
    for r in rows:
        if (int(r["gpus"]), int(r["N"]), r["pass"]) == (gpus, n, pass_):
            ms = r.get("ms")
            return math.nan if ms is None or ms != ms else ms / 1e3
    return math.nan


def default_ns(world: int) -> list[int]:
    """Total N run by default: 1 Mi (strong scaling), then 512 Ki, 1 Mi and 2 Mi tokens per GPU
    (weak scaling compares the same per-GPU lengths at every host size)."""
    mi = 2 ** 20
    return sorted({mi, world * mi // 2, world * mi, 2 * world * mi})


def longest_candidates(world: int) -> list[int]:
    """Total N tried for the longest sequence that trains, largest first: 3 Mi down to 1/2 Mi
    tokens per GPU in steps of 1/8 Mi (the first whose estimate fits is run, so an 80 GB and a
    141 GB card each find theirs)."""
    return [world * 2 ** 20 * k // 8 for k in range(24, 3, -1)]


def main(argv=None) -> int:
    import pandas as pd

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=None, help="folder for sp.csv (default data/<gpu>x<G>)")
    p.add_argument("--ns", type=int, nargs="*", default=None,
                   help="total sequence lengths (default: 1 Mi for strong scaling, then 512 Ki, 1 Mi "
                        "and 2 Mi per GPU for weak scaling)")
    p.add_argument("--single-max-n", type=int, default=2 ** 22,
                   help="the single-GPU kernel runs the whole N up to this length")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--method", default="Chunk", help="the method that runs each slice")
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--check-n", type=int, default=65536)
    p.add_argument("--layout", choices=("time-major", "head-major"), default="time-major",
                   help="the slices as a model hands them (time-major views) or head-major")
    p.add_argument("--max-gib", type=float, default=math.inf,
                   help="memory a cell may take per GPU, GiB (default: what the GPU has free)")
    p.add_argument("--resume", action="store_true",
                   help="keep sp.csv's rows of this commit and measure only the cells they lack")
    p.add_argument("--longest", type=int, nargs="*", default=None,
                   help="candidate total N for the longest sequence that trains, largest first "
                        "(default on GPUs: 3 Mi down to 1/2 Mi per GPU, the first that fits; none "
                        "on the CPU)")
    args = p.parse_args(argv)
    if "RANK" not in os.environ:
        print("run it under torchrun: torchrun --nproc-per-node=G -m leetrepro.bench.sp", file=sys.stderr)
        return 2
    local = int(os.environ.get("LOCAL_RANK", 0))
    if torch.cuda.is_available():
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    else:  # a smoke test of the script on the CPU (gloo); its numbers mean nothing
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.ns is None:
        args.ns = default_ns(world)
    if args.longest is None:
        args.longest = longest_candidates(world) if device.type == "cuda" else []
    meta = provenance(device)
    bw = copy_bandwidth(device, nbytes=2 ** 30 if device.type == "cuda" else 2 ** 24)
    out_dir = args.out or os.path.join("data", f"{gpu_tag(device)}x{world}")
    if rank == 0:
        os.makedirs(out_dir, exist_ok=True)
        print(f"{world} × {meta['gpu']}: copy {bw / 1e12:.2f} TB/s", flush=True)
    dtype = parse_dtype(args.dtype)
    size = dtype.itemsize
    g = alibi_gammas(HEADS).to(device)

    err = check(args.check_n, device, rank, world, args.method)
    if rank == 0:
        print(f"check N={args.check_n} fp32 (tf32x3): max rel err of O, dB, dC, dV vs one GPU {err:.2e}",
              flush=True)
    state_bytes = HEADS * RANK * DIM * 4
    packet = torch.zeros(state_bytes // 4 + 2, device=device)
    exchange = _timed(lambda: _all_gather(packet, None), 20, device)

    path = os.path.join(out_dir, "sp.csv")
    cap = args.max_gib * 2 ** 30
    rows, done = [], set()
    if args.resume and os.path.exists(path):
        # (the commit as text: a hash of digits and one "e" reads as a float otherwise, 85379474e521
        # as inf, and no row would match)
        kept = pd.read_csv(path, dtype={"commit": str})
        # (cells that did not fit are judged again: the memory free may differ now)
        # (a file from before the status column: every row was measured)
        status = kept["status"] if "status" in kept else "ok"
        kept = kept[(kept.commit.astype(str) == str(meta["commit"])) & (status == "ok")]
        rows = kept.to_dict("records")
        done = {(int(r["gpus"]), int(r["N"]), r["pass"]) for r in rows}
        if rank == 0:
            print(f"resume: {len(rows)} rows of commit {meta['commit']} kept", flush=True)

    def row(**kw):
        base = dict(meta, gpus=world, dtype=SHORT_NAMES[dtype], batch=1, heads=HEADS, r=RANK, d=DIM,
                    decay=True, method=args.method, layout=args.layout, check_rel_err=err,
                    copy_TBps=bw / 1e12, status="ok")
        rows.append(base | kw)
        if rank == 0:
            print({k: (round(v, 3) if isinstance(v, float) else v) for k, v in kw.items()}, flush=True)
            # written as each cell completes: a run cut short keeps what it measured
            pd.DataFrame(rows).to_csv(path, index=False)

    def fits(pass_, n, gpus, group_min=True):
        """Whether the cell's estimate fits the free memory (a collective unless
        ``group_min`` is False); if not, its row says so (``status=oom``)."""
        free = free_bytes(device, group_min, cap)
        if cell_fits(pass_, n, size, free):
            return True
        need = cell_bytes(pass_, n, size)
        if rank == 0:
            row(gpus=gpus, N=n * (world if gpus > 1 else 1), n_per_gpu=n, **{"pass": pass_},
                status="oom", note=f"needs ~{need / 2 ** 30:.1f} GiB per GPU, "
                                   f"{free / 2 ** 30:.1f} GiB free: not run")
        return False

    call_sp = lambda B, C, V: causal_linear_decoder_sp(B, C, V, g, method=args.method)  # noqa: E731
    call_one = lambda B, C, V: causal_linear_decoder(B, C, V, g, method=args.method)  # noqa: E731
    for n_total in args.ns:
        n_local = n_total // world
        tensor_ms = n_local * HEADS * RANK * size / bw * 1e3
        # the single-GPU kernel on the whole N (rank 0 alone; the others wait at the barrier)
        single = {}
        if n_total <= args.single_max_n:
            for pas in ("fwd", "fwd_bwd"):
                if rank == 0 and (1, n_total, pas) not in done and \
                        fits(pas, n_total, 1, group_min=False):
                    leaves, views = _make(n_total, dtype, device, 1, pas == "fwd_bwd", args.layout)
                    if pas == "fwd":
                        with torch.no_grad():
                            t = interleaved_medians({0: lambda: call_one(*views)}, [()],
                                                    args.reps, device, warmup=2)[0]
                    else:
                        dO = ops_output_like(views[2])
                        t = interleaved_medians({0: _fwd_bwd(call_one, leaves, views, dO)}, [()],
                                                args.reps, device, warmup=2)[0]
                        del dO
                    leaves = views = None  # the memory freed before the next shape
                    torch.cuda.empty_cache()
                    single[pas] = t
                    floor = (SINGLE_FWD if pas == "fwd" else SINGLE_FWD_BWD) * tensor_ms * world / 1e3
                    row(gpus=1, N=n_total, n_per_gpu=n_total, **{"pass": pas}, ms=t * 1e3,
                        floor_ms=floor * 1e3, floor_ratio=t / floor, exchange_ms=0.0,
                        bytes_exchanged=0, kv_bytes=0, single_gpu_ms=t * 1e3)
                elif rank == 0 and (1, n_total, pas) in done:
                    single[pas] = _measured(rows, 1, n_total, pas)
                dist.barrier()
        for pas in ("fwd", "fwd_bwd"):
            if (world, n_total, pas) in done or not fits(pas, n_local, world):
                continue
            leaves, views = _make(n_local, dtype, device, 2 + rank, pas == "fwd_bwd", args.layout)
            if pas == "fwd":
                with torch.no_grad():
                    t = _timed(lambda: call_sp(*views), args.reps, device)
                passes, packets, kv = FWD_PASSES, 1, 1
            else:
                dO = ops_output_like(views[2])
                t = _timed(_fwd_bwd(call_sp, leaves, views, dO), args.reps, device)
                del dO
                passes, packets, kv = FWD_BWD_PASSES, 2, 2
            leaves = views = None  # the memory freed before the next shape
            torch.cuda.empty_cache()
            floor_ms = passes * tensor_ms
            single_ms = single.get(pas, math.nan) * 1e3
            row(N=n_total, n_per_gpu=n_local, **{"pass": pas}, ms=t * 1e3, floor_ms=floor_ms,
                floor_ratio=t * 1e3 / floor_ms, exchange_ms=exchange * 1e3 * packets,
                bytes_exchanged=(world - 1) * (packets * state_bytes + 8),
                kv_bytes=(world - 1) * n_local * HEADS * (RANK + DIM) * size * kv,
                single_gpu_ms=single_ms, speedup_vs_single=single_ms / (t * 1e3))
    free = free_bytes(device, True, cap) if args.longest else 0.0
    fitting = [n for n in args.longest if cell_fits("fwd_bwd", n // world, size, free)]
    if rank == 0 and args.longest:
        print(f"longest: {len(args.longest) - len(fitting)} of {len(args.longest)} candidates need more "
              f"than the {free / 2**30:.0f} GiB free per GPU", flush=True)
    if fitting and not any(k[0] == world and k[2] == "fwd_bwd_longest" for k in done):
        n_total = fitting[0]  # the longest that fits
        n_local = n_total // world
        leaves, views = _make(n_local, dtype, device, 3 + rank, True, args.layout)
        dO = ops_output_like(views[2])
        torch.cuda.reset_peak_memory_stats(device)
        t = _timed(_fwd_bwd(call_sp, leaves, views, dO), 3, device, warmup=1)
        peak = torch.cuda.max_memory_allocated(device) / 2 ** 30
        leaves = views = dO = None  # the memory freed before the next shape
        torch.cuda.empty_cache()
        tensor_ms = n_local * HEADS * RANK * size / bw * 1e3
        row(N=n_total, n_per_gpu=n_local, **{"pass": "fwd_bwd_longest"}, ms=t * 1e3,
            floor_ms=FWD_BWD_PASSES * tensor_ms, floor_ratio=t * 1e3 / (FWD_BWD_PASSES * tensor_ms),
            exchange_ms=exchange * 2e3, bytes_exchanged=(world - 1) * (2 * state_bytes + 8),
            kv_bytes=(world - 1) * n_local * HEADS * (RANK + DIM) * size * 2,
            single_gpu_ms=math.nan, peak_GiB=peak)
    if rank == 0:
        pd.DataFrame(rows).to_csv(path, index=False)
        print(f"-> {path}", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
