"""What limits a cell of the floor grid: Nsight Compute over one call of Chunk as it ships; and
what each kernel of a backward or a forward call takes (:data:`BACKWARD`, :data:`FORWARD`: the
gated sweeps beside the per-head decay's).

``python -m leetrepro.probes.ncu [--cells f16_b16_01 ...] [--out data/<gpu>]`` profiles each cell
in a process of its own (``ncu --profile-from-start off``, the call between cudaProfilerStart and
Stop after three warm-ups; the launch table picks the kernel, as ``method="Chunk"`` ships) and
writes ``ncu_limits.txt``: for the call's longest kernel, its DRAM bytes against the floor's reads
(B, C, V) and writes (O), the achieved rate, how busy the issue slots are, and the stall reasons in
cycles per issued instruction. A backward cell (``--cells bf16_bwd_gates_mamba2 …``) profiles one
backward after its forward and writes ``ncu_backward.txt``: a line per kernel of 20 µs or more, in
launch order (its DRAM bytes, issue slots, tensor pipe, stalls); a forward cell
(:data:`FORWARD`: the gated forward beside γ's) one forward, likewise, into ``ncu_forward.txt``.
Bytes and stalls do not depend on
the clocks Nsight Compute locks (the SM clock is shown); the times do. Needs a GPU and ``ncu`` on
the PATH.
"""
from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import tempfile

#: label: (dtype, batch, N, decay, options); heads 32, r = d = 128
CELLS = {
    "f16_b16_01": ("float16", 16, 25600, False, {}),
    "bf16_b16_dec": ("bfloat16", 16, 25600, True, {}),
    "f16_b1_1e5_01": ("float16", 1, 100000, False, {}),
    "bf16_b1_1e5_dec": ("bfloat16", 1, 100000, True, {}),
    "f32_b1_1e5_01": ("float32", 1, 100000, False, {}),
    "f16_b1_8192_01": ("float16", 1, 8192, False, {}),
    "f32x3_b16_8192_01": ("float32", 16, 8192, False, {"fp32_precision": "tf32x3"}),
    # batch 1 on the Hopper kernel two ways: segments chained through the ring (C and V read
    # twice), and one pass with a lane's value columns split over four programs (DC = 32)
    "bf16_b1_1e5_dec_ring": ("bfloat16", 1, 100000, True, {"kernel": "hopper"}),
    "bf16_b1_1e5_dec_dc32": ("bfloat16", 1, 100000, True, {"kernel": "hopper",
                                                            "config": {"DC": 32}}),
}
HEADS, R, D = 32, 128, 128
#: cells at other head shapes models use (label: r, d, heads; b8 N = 8192, bf16, decay)
SHAPED = {"bf16_b8_8192_64x64": (64, 64, 64), "bf16_b8_8192_128x256": (128, 256, 16),
          "bf16_b8_8192_256x256": (256, 256, 16)}
CELLS.update({label: ("bfloat16", 8, 8192, True, {}) for label in SHAPED})


#: backward cells, bf16 (label: batch, heads, N, r, d, per-token gates or the per-head decay):
#: one backward of ``causal_linear_decoder`` (method "auto") after its forward, every kernel
BACKWARD = {"bf16_bwd_gates_mamba2": (2, 64, 8192, 128, 64, True),
            "bf16_bwd_gamma_mamba2": (2, 64, 8192, 128, 64, False),
            "bf16_bwd_gates_gla": (8, 32, 8192, 128, 128, True),
            "bf16_bwd_gamma_gla": (8, 32, 8192, 128, 128, False),
            "bf16_bwd_gates_mamba2_64": (2, 64, 8192, 64, 64, True)}
#: forward cells, as :data:`BACKWARD`'s: one forward of ``causal_linear_decoder`` (method "auto")
#: on inputs that want no gradient (``bench.gates``' forward entries), every kernel
FORWARD = {"bf16_fwd_gates_mamba2": (2, 64, 8192, 128, 64, True),
           "bf16_fwd_gamma_mamba2": (2, 64, 8192, 128, 64, False),
           "bf16_fwd_gates_mamba2_64": (2, 64, 8192, 64, 64, True),
           "bf16_fwd_gamma_mamba2_64": (2, 64, 8192, 64, 64, False)}
#: the cells whose every kernel is listed (:func:`summarize_kernels`): label -> shape
PASSES = {**BACKWARD, **FORWARD}


def cell_shape(label: str) -> tuple[int, int, int]:
    """(r, d, heads) of a cell: r = d = 128 with 32 heads unless :data:`SHAPED` names others."""
    return SHAPED.get(label, (R, D, HEADS))
SECTIONS = ("SpeedOfLight", "MemoryWorkloadAnalysis", "WarpStateStats", "Occupancy", "LaunchStats",
            "ComputeWorkloadAnalysis", "SchedulerStats")
METRICS = ("dram__bytes_read.sum,dram__bytes_write.sum,smsp__inst_executed.sum,"
           "smsp__sass_inst_executed_op_local_ld.sum,smsp__sass_inst_executed_op_local_st.sum")
_STALL = "smsp__average_warps_issue_stalled_"


def floor_bytes(label: str) -> tuple[int, int]:
    """The floor's bytes (:func:`complexity.io_bytes`) as read (B, C, V) and written (O)."""
    from .._dtypes import parse_dtype
    from ..complexity import io_bytes
    dtype, batch, n, _, _ = CELLS[label]
    r, d, heads = cell_shape(label)
    size = parse_dtype(dtype).itemsize
    written = batch * heads * n * d * size
    return io_bytes(n, r, d, batch=batch, heads=heads, itemsize=size) - written, written


def _num(v) -> float:
    return float(str(v).replace(",", ""))


def _raw_rows(raw_csv: str):
    """``ncu --csv --page raw``'s output as a table, a row per kernel (its ``==PROF==`` lines and
    the units row skipped)."""
    import pandas as pd
    body = "".join(line for line in io.StringIO(raw_csv) if not line.startswith("=="))
    return pd.read_csv(io.StringIO(body)).iloc[1:]  # row 0: the units


def _stats(d, r, top: int) -> tuple:
    """A kernel's (time in s, DRAM bytes read, written, the ``top`` stall reasons largest first,
    their sum over all reasons, the busiest tensor-core pipe's % or None) from its row ``r``."""
    stalls = {c[len(_STALL):].replace("_per_issue_active.ratio", ""): _num(r[c])
              for c in d.columns if c.startswith(_STALL) and c.endswith("_per_issue_active.ratio")}
    worst = sorted(stalls.items(), key=lambda kv: -kv[1])[:top]
    # the busiest tensor-core pipe (Hopper's wgmma: gmma), % of its peak while the SMs are active
    tensor = [_num(r[c]) for c in d.columns
              if "pipe_tensor" in c and c.endswith("pct_of_peak_sustained_active")]
    return (_num(r["gpu__time_duration.sum"]) * 1e-9, _num(r["dram__bytes_read.sum"]),
            _num(r["dram__bytes_write.sum"]), worst, sum(stalls.values()),
            max(tensor) if tensor else None)


def summarize(raw_csv: str, label: str, top: int = 5) -> str:
    """One line for a cell from ``ncu --csv --page raw``'s output: the longest kernel's name,
    time, SM clock, DRAM bytes × the floor's, the achieved rate, issue slots busy, warps active,
    and the ``top`` stall reasons."""
    d = _raw_rows(raw_csv)
    r = d.loc[d["gpu__time_duration.sum"].map(_num).idxmax()]
    t, read, write, worst, cycles, tensor = _stats(d, r, top)
    want_r, want_w = floor_bytes(label)
    return (f"{label:18s} {str(r['Kernel Name'])[:20]:20s} t={t * 1e3:.3f}ms  "
            f"SM {_num(r['gpc__cycles_elapsed.avg.per_second']) / 1e9:.2f} GHz  "
            f"DRAM read {read / want_r:.3f}x floor reads, write {write / want_w:.3f}x, "
            f"achieved {(read + write) / t / 1e12:.2f} TB/s; "
            f"issue active {_num(r['smsp__issue_active.avg.pct_of_peak_sustained_active']):.0f}%, "
            f"warps {_num(r['sm__warps_active.avg.pct_of_peak_sustained_active']):.1f}%, "
            + (f"tensor pipe {tensor:.0f}%, " if tensor is not None else "") +
            f"cycles/issue {cycles:.2f}: " + ", ".join(f"{k} {v:.2f}" for k, v in worst))


def _instructions(r) -> str:
    """A kernel's warp instructions and, of them, its local-memory loads and stores (spills'
    reloads wait on the long scoreboard), where the row has them."""
    names = ("smsp__inst_executed.sum", "smsp__sass_inst_executed_op_local_ld.sum",
             "smsp__sass_inst_executed_op_local_st.sum")
    if not all(n in r.index for n in names):
        return ""
    total, ld, st = (_num(r[n]) for n in names)
    return f"{total / 1e6:.1f} M warp instructions (local ld {ld / 1e6:.2f} M, st {st / 1e6:.2f} M), "


def summarize_kernels(raw_csv: str, label: str, top: int = 3, least_us: float = 20.0) -> list:
    """A backward cell's lines from ``ncu --csv --page raw``'s output: each kernel of at least
    ``least_us`` microseconds in launch order, its name, time, DRAM bytes read and written (MB),
    issue slots busy, the tensor pipe and the ``top`` stall reasons; then the call's total time
    (every kernel's)."""
    d = _raw_rows(raw_csv)
    lines, total = [], 0.0
    for _, r in d.iterrows():
        t, read, write, worst, cycles, tensor = _stats(d, r, top)
        total += t
        if t * 1e6 < least_us:
            continue
        lines.append(
            f"{label:24s} {str(r['Kernel Name'])[:24]:24s} t={t * 1e3:.3f}ms  "
            f"DRAM read {read / 1e6:.0f} MB, write {write / 1e6:.0f} MB; issue active "
            f"{_num(r['smsp__issue_active.avg.pct_of_peak_sustained_active']):.0f}%, "
            + (f"tensor pipe {tensor:.0f}%, " if tensor is not None else "") +
            _instructions(r) +
            f"cycles/issue {cycles:.2f}: " + ", ".join(f"{k} {v:.2f}" for k, v in worst))
    lines.append(f"{label:24s} every kernel: {len(d)} launches, t={total * 1e3:.3f}ms")
    return lines


def profiled_call(label: str) -> None:
    """The child: a cell's inputs, three warm-up calls, then one call inside the profiler range."""
    import torch

    from .. import causal_linear_decoder
    from .._dtypes import parse_dtype
    from ..decay.per_head import alibi_gammas
    from ..bench.harness import random_inputs
    dtype, batch, n, decay, options = CELLS[label]
    r, d, heads = cell_shape(label)
    gen = torch.Generator(device="cuda").manual_seed(0)
    B, C, V = random_inputs(batch, heads, n, r, d, dtype=parse_dtype(dtype), device="cuda",
                            generator=gen)
    g = alibi_gammas(heads).to("cuda") if decay else None
    for _ in range(3):
        causal_linear_decoder(B, C, V, g, method="Chunk", **options)
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    causal_linear_decoder(B, C, V, g, method="Chunk", **options)
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


def backward_cell(label: str, device="cuda", dtype=None, shape: tuple | None = None) -> tuple:
    """``(forward, leaves, dO)`` of a backward cell (:data:`BACKWARD`, or ``shape = (batch,
    heads, N, r, d, gated)``; bf16 unless ``dtype``): ``forward()`` calls
    ``causal_linear_decoder`` on the leaves (B, C, V requiring grad, and the gates g where the
    cell is gated, else ALiBi's per-head decays), dO the output's gradient to pass."""
    import torch

    from .. import causal_linear_decoder
    from ..decay.per_head import alibi_gammas
    from ..bench.harness import random_inputs
    dtype = dtype or torch.bfloat16
    batch, heads, n, r, d, gated = shape or PASSES[label]
    gen = torch.Generator(device=device).manual_seed(0)
    leaves = list(random_inputs(batch, heads, n, r, d, dtype=dtype, device=device, generator=gen,
                                scale_bc=True))
    gamma = None
    if gated:
        leaves.append(torch.nn.functional.logsigmoid(
            torch.randn(batch, heads, n, generator=gen, device=device) * 2.0))
    else:
        gamma = alibi_gammas(heads).to(device)
    for t in leaves:
        t.requires_grad_()
    dO = torch.randn(batch, heads, n, d, generator=gen, device=device, dtype=dtype)

    def forward():
        return causal_linear_decoder(*leaves[:3], gamma, g=leaves[3] if gated else None)
    return forward, leaves, dO


def profiled_pass(label: str) -> None:
    """The child of a backward cell (its inputs, three forward + backward warm-ups, a forward,
    then one backward inside the profiler range) or of a forward cell (three forwards, then one
    inside the range, no gradient wanted)."""
    import torch
    forward, leaves, dO = backward_cell(label)

    def ready():
        """The profiled pass as a call, what it needs done first (a backward's forward)."""
        if label in FORWARD:
            return lambda: torch.no_grad()(forward)()
        o = forward()
        return lambda: torch.autograd.grad(o, leaves, dO)
    for _ in range(3):
        ready()()
    call = ready()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    call()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


def header(meta: dict) -> list[str]:
    return [f"# Nsight Compute, {meta['gpu']}, {meta['date']}: Chunk as it ships at commit {meta['commit']} "
            f"(source {meta['source']}),",
            '# method="Chunk" (f32x3: fp32_precision="tf32x3"), heads 32, r = d = 128 (a cell ending rxd: '
            "those, b8 N = 8192), randn inputs, "
            "ALiBi decays;",
            "# one call after three warm-ups, the call's longest kernel; clocks locked by ncu (SM "
            "clock shown).",
            "# DRAM bytes against the floor's reads (B, C, V) and writes (O); stall reasons in cycles "
            "per issued",
            f"# instruction ({_STALL}*_per_issue_active), the five largest.",
            f"# Command: ncu --profile-from-start off --section {' --section '.join(SECTIONS)}",
            f"#   --metrics {METRICS} --csv --page raw python -m leetrepro.probes.ncu --call <cell>",
            "# Cells: f16/bf16/f32 = fp16/bf16/fp32 (tf32 products), f32x3 = fp32 exact; b16 = batch "
            "16 N = 25600",
            "#   unless named; b1_1e5 = batch 1 N = 100000; b1_8192 = batch 1 N = 8192; 01 = 0-1 mask, "
            "dec = decay;",
            '#   _ring: kernel="hopper" (segments); _dc32: kernel="hopper", config={"DC": 32} (one pass, '
            "four programs a lane)."]


def main(argv=None) -> int:
    import argparse
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--cells", nargs="*", default=list(CELLS), choices=list(CELLS) + list(PASSES),
                   help="floor cells (default: all of them), backward and forward cells")
    p.add_argument("--out", default=None, help="folder for ncu_limits.txt (default data/<gpu>)")
    p.add_argument("--call", choices=list(CELLS) + list(PASSES),
                   help=argparse.SUPPRESS)  # the profiled child
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per cell")
    args = p.parse_args(argv)
    if args.call:
        (profiled_pass if args.call in PASSES else profiled_call)(args.call)
        return 0
    from ..bench.harness import gpu_script_setup, provenance
    setup = gpu_script_setup("ncu", args.out)
    if setup is None:
        return 2
    if shutil.which("ncu") is None:
        print("ncu (Nsight Compute) is not on the PATH", file=sys.stderr)
        return 2
    device, meta, out = setup
    lines = header(provenance(device))
    def per_kernel(what):
        return [f"# Nsight Compute, {meta['gpu']}, {meta['date']}, commit {meta['commit']}: one "
                f"{what} of causal_linear_decoder (method auto, bf16); a line per kernel of 20 µs "
                "or more, in launch order (clocks locked by ncu)"]
    backward = per_kernel("backward, after its forward,")
    forward = per_kernel("forward, no gradient wanted,")
    logs = tempfile.mkdtemp(prefix="ncu_")
    for label in args.cells:
        into = backward if label in BACKWARD else forward if label in FORWARD else lines
        log = os.path.join(logs, f"{label}.csv")
        cmd = ["ncu", "--profile-from-start", "off", *[a for s in SECTIONS for a in ("--section", s)],
               "--metrics", METRICS, "--csv", "--page", "raw", "--log-file", log,
               sys.executable, "-m", "leetrepro.probes.ncu", "--call", label]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
        if done.returncode or not os.path.exists(log):
            into.append(f"{label:18s} not profiled: ncu exited {done.returncode}: "
                        f"{done.stderr.strip()[-200:]}")
            print(into[-1], flush=True)
            continue
        with open(log) as f:
            found = summarize_kernels(f.read(), label) if label in PASSES else \
                [summarize(f.read(), label)]
        into.extend(found)
        print("\n".join(found), flush=True)
    for name, text in (("ncu_limits.txt", lines), ("ncu_backward.txt", backward),
                       ("ncu_forward.txt", forward)):
        if len(text) > (len(header(meta)) if name == "ncu_limits.txt" else 1):
            with open(os.path.join(out, name), "w") as f:
                f.write("\n".join(text) + "\n")
            print(f"-> {out}/{name} (Nsight Compute's raw pages: {logs})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
