"""Mamba-2's state-space dual (SSD) on this operator against mamba_ssm's own Triton kernels and
flash-linear-attention's gated path, in one process: ``make bench-ssd`` (or ``python -m
leetrepro.bench.ssd --out data/<gpu>``).

Per cell (a Mamba-2 shape × pass × mode), bf16 x, B, C and fp32 dt, A, D, dt_bias as a Mamba-2
layer hands them (mamba_ssm's layouts: ``(batch, seqlen, heads, headdim)``, B and C ``(batch,
seqlen, ngroups, dstate)``, raw dt with ``dt_bias`` and softplus, the skip ``D``), the entries

* ``ours``: :func:`leetrepro.compat.mamba_chunk_scan_combined` (groups read in place);
* ``mamba_ssm``: mamba_ssm's ``mamba_chunk_scan_combined`` (its Triton kernels, chunk 256; from
  an install or its public source in ``$LEETREPRO_PEERS``, :func:`harness.mamba_ssm_peer`);
* ``fla``: flash-linear-attention's ``chunk_simple_gla`` on the same computation (B and C expanded
  to the heads, ``v = dt·x``, ``g = dt·A``, then ``+ D·x``), forward only: its gated backward
  refuses Triton 3.4–3.7.0 on Hopper;

are timed interleaved (CUDA events, median of ``--reps``) for the forward (``fwd``) and the
forward with its backward (``fwd+bwd``: the gradients of x, dt, A, B, C, D and dt_bias), eager
and captured in a CUDA graph. ``floor_ms``: the bytes a pass must move at least over the
measured copy bandwidth (fwd: x, B, C, dt read, y written; fwd+bwd: that, then x, B, C, dt, dy
read and dx, dB, dC, ddt written). ``vs_peer``: ours over mamba_ssm's in the same cell and mode.

``--block``: a whole Mamba-2 block (:class:`leetrepro.models.Mamba2Block`: in-projection,
depthwise convolution, SSD, gated RMS norm, out-projection) at the Codestral shape, forward +
backward, with our SSD and with mamba_ssm's on the same weights (``block`` rows). ``--lm``: the
byte-level Mamba-2 LM (:class:`leetrepro.models.lm.Mamba2ByteLM`) trained 50 steps from the same
weights on the same batches with each SSD: tokens/s and the loss curves (``ssd_lm.csv``).
``--mamba3``: Mamba-3's SISO recurrence, :func:`leetrepro.compat.mamba3_siso_combined` against
mamba_ssm's ``mamba3_siso_combined`` (its Triton kernels) at :data:`MAMBA3_SHAPES` (``mamba3``
rows: ``headdim`` is V's, ``dstate`` q's and k's, ``ngroups`` the q/k heads), the gradients of
Q, K, V, ADT, DT, Trap, the biases, the angles, D and Z; and its decode step over a pool of
states at :data:`MAMBA3_DECODE_SHAPES` (``pass`` "step", ours only). Writes ``ssd.csv``.
"""
from __future__ import annotations

import os
import sys

import torch

from .harness import fla_chunk_simple_gla, gpu_main, mamba_ssm_peer, timed_entries

#: (label, batch, seqlen, heads, headdim, dstate, ngroups): Codestral-Mamba / Nemotron-H's
#: mixer, Zamba2's, a Falcon-H1-like one (d_state 256), and a short-sequence micro-batch (8 ×
#: 2048 rows, 48 heads, one group)
SHAPES = [("codestral", 2, 8192, 128, 64, 128, 8), ("zamba2", 4, 4096, 80, 64, 64, 1),
          ("falcon-h1", 2, 8192, 64, 64, 256, 1), ("8x2048", 8, 2048, 48, 64, 128, 1)]
CHUNK = 256  # mamba_ssm's chunk (ours takes its tiles from its own tables)
#: (label, batch, seqlen, heads, headdim_v, headdim_qk, q/k heads): mamba_ssm's own test shape
#: (GQA 4) and a 2048-wide model's training micro-batch (64 heads of 64, d_state 128, one group)
MAMBA3_SHAPES = [("mamba_ssm-test", 1, 2345, 32, 64, 128, 8),
                 ("train-2048", 4, 4096, 64, 64, 128, 1)]


def _inputs(batch, n, heads, headdim, dstate, groups, device, grad):
    """The SSD's inputs as a layer hands them, drawn on the host (a failed capture leaves the
    GPU's generator unusable for the next cell)."""
    bf = dict(device=device, dtype=torch.bfloat16)
    x = torch.randn(batch, n, heads, headdim).to(**bf)
    dt = (torch.randn(batch, n, heads) - 2.0).to(device)
    A = -torch.exp(torch.rand(heads) * 2.7).to(device)
    B, C = ((torch.randn(batch, n, groups, dstate) * dstate ** -0.5).to(**bf) for _ in range(2))
    D = torch.ones(heads, device=device)
    dt_bias = (torch.rand(heads) * 0.5).to(device)
    leaves = dict(x=x, dt=dt, A=A, B=B, C=C, D=D, dt_bias=dt_bias)
    if grad:
        for t in leaves.values():
            t.requires_grad_()
    dy = torch.randn(batch, n, heads, headdim).to(**bf)
    return leaves, dy


def _entries(peer, fla, grad: bool) -> dict:
    """name -> fn(leaves, dy): one pass of the entry."""
    from ..compat import mamba_chunk_scan_combined

    def backward(y, leaves, dy):
        if grad:
            torch.autograd.grad(y, list(leaves.values()), dy)
        return y

    def ours(leaves, dy):
        return backward(mamba_chunk_scan_combined(**leaves, chunk_size=CHUNK, dt_softplus=True),
                        leaves, dy)
    out = {"ours": ours}
    if peer is not None:
        def mamba_ssm(leaves, dy):
            return backward(peer(**leaves, chunk_size=CHUNK, dt_softplus=True), leaves, dy)
        out["mamba_ssm"] = mamba_ssm
    if fla is not None and not grad:
        def flash_linear(leaves, dy):
            x, B, C, A = leaves["x"], leaves["B"], leaves["C"], leaves["A"]
            dt = torch.nn.functional.softplus(leaves["dt"] + leaves["dt_bias"])
            rep = x.shape[2] // B.shape[2]
            q, k = (t.repeat_interleave(rep, 2) for t in (C, B))
            o, _ = fla(q, k, x * dt.to(x.dtype)[..., None], g=dt * A, scale=1.0)
            return o + leaves["D"].to(x.dtype)[:, None] * x
        out["fla"] = flash_linear
    return out


def floor_bytes(batch, n, heads, headdim, dstate, groups, grad: bool) -> int:
    """The bytes a pass moves at least (bf16 x, B, C, y; fp32 dt)."""
    tokens = batch * n
    xy = tokens * heads * headdim * 2
    bc = tokens * groups * dstate * 2
    dt = tokens * heads * 4
    fwd = 2 * xy + 2 * bc + dt
    if not grad:
        return fwd
    return fwd + 3 * xy + 4 * bc + 2 * dt


def _rows(what, label, shape, pass_, times, status, floor_ms, meta) -> list[dict]:
    rows = []
    for mode, by_name in times.items():
        peer = by_name.get("mamba_ssm")
        for name in sorted(set(by_name) | {k.split("/")[0] for k in status}):
            t = by_name.get(name)
            row = dict(meta, what=what, shape=label, **shape, dtype="bf16", entry=name,
                       **{"pass": pass_}, mode=mode, median_ms=None if t is None else t * 1e3,
                       floor_ms=floor_ms,
                       status=status.get(f"{name}/graph" if mode == "graph" else name,
                                         status.get(name, "ok")))
            row["vs_floor"] = None if t is None or floor_ms is None else row["median_ms"] / floor_ms
            row["vs_peer"] = None if t is None or peer is None or name == "mamba_ssm" else t / peer
            rows.append(row)
            print(f"{what:5s} {label:10s} {pass_:8s} {mode:6s} {name:10s} "
                  f"{row['median_ms'] if t is not None else float('nan'):8.3f} ms"
                  f"  floor×{row['vs_floor'] or float('nan'):5.2f}"
                  f"  vs mamba_ssm {row['vs_peer'] or float('nan'):5.2f}  {row['status'][:60]}",
                  flush=True)
    return rows


def _measure_passes(what: str, shape, device, bw, reps: int, meta: dict, inputs, entries,
                    floor_of):
    """The rows of one shape ``(label, batch, seqlen, heads, headdim, dstate, ngroups)``, the
    forward's and then forward + backward's, yielded a pass at a time (a run cut short keeps
    what it measured): ``inputs(*dims, device, grad)``, ``entries(grad)`` and
    ``floor_of(*dims, grad)`` (bytes) of the recurrence measured."""
    label, *dims = shape
    named = dict(zip(("batch", "seqlen", "heads", "headdim", "dstate", "ngroups"), dims))
    for grad in (False, True):
        leaves, dy = inputs(*dims, device, grad)
        times, status = timed_entries(entries(grad), (leaves, dy), reps, device,
                                      seed=hash((label, grad)) % 1000)
        floor = floor_of(*dims, grad) / bw * 1e3
        del leaves, dy
        torch.cuda.empty_cache()
        yield _rows(what, label, named, "fwd+bwd" if grad else "fwd", times, status, floor, meta)


def measure(shape, device, bw, reps: int, meta: dict, peer, fla):
    """Mamba-2's SSD rows at ``shape``, a pass at a time."""
    return _measure_passes("ssd", shape, device, bw, reps, meta, _inputs,
                           lambda grad: _entries(peer, fla, grad), floor_bytes)


def mamba3_inputs(batch, n, heads, dv, p, hqk, device, grad, dtype=torch.bfloat16):
    """Mamba-3's inputs as its block hands them (mamba_ssm's layouts; Q, K, V, Z in ``dtype``,
    the per-row scalars, biases, angles and D float32; rope fraction 0.5: p / 4 angles), drawn
    on the host, and the output's gradient."""
    f32 = dict(device=device, dtype=torch.float32)
    lo = dict(device=device, dtype=dtype)
    dt = torch.nn.functional.softplus(torch.randn(batch, heads, n) - 2)
    leaves = dict(Q=(torch.randn(batch, n, hqk, p) * p ** -0.5).to(**lo),
                  K=(torch.randn(batch, n, hqk, p) * p ** -0.5).to(**lo),
                  V=torch.randn(batch, n, heads, dv).to(**lo),
                  ADT=(-dt * torch.rand(heads)[None, :, None] * 4).to(**f32), DT=dt.to(**f32),
                  Trap=torch.randn(batch, heads, n).to(**f32),
                  Q_bias=(1 + torch.randn(heads, p) / 4).to(**f32),
                  K_bias=(1 + torch.randn(heads, p) / 4).to(**f32),
                  Angles=torch.randn(batch, n, heads, p // 4).to(**f32),
                  D=torch.ones(heads).to(**f32), Z=torch.randn(batch, n, heads, dv).to(**lo))
    if grad:
        for t in leaves.values():
            t.requires_grad_()
    return leaves, torch.randn(batch, n, heads, dv).to(**lo)


def mamba3_entries(peer, grad: bool) -> dict:
    """name -> fn(leaves, dy): one pass of Mamba-3's recurrence (ours, and mamba_ssm's where its
    source is at hand)."""
    from ..compat import mamba3_siso_combined

    def run(fn):
        def call(leaves, dy):
            y = fn(**leaves)
            if grad:
                torch.autograd.grad(y, list(leaves.values()), dy)
            return y
        return call
    out = {"ours": run(mamba3_siso_combined)}
    if peer is not None:
        out["mamba_ssm"] = run(peer)
    return out


def mamba3_floor_bytes(batch, n, heads, dv, p, hqk, grad: bool) -> int:
    """The bytes a pass moves at least: Q, K, V, Z read and y written (16-bit), ADT, DT, Trap and
    the angles (float32) read; the backward reads them and dy again and writes each gradient."""
    rows = batch * n
    big = rows * (2 * hqk * p + 3 * heads * dv) * 2 + rows * heads * (3 + p // 4) * 4
    if not grad:
        return big
    return 3 * big


def measure_mamba3(shape, device, bw, reps: int, meta: dict, peer):
    """Mamba-3's rows (``headdim`` V's, ``dstate`` q's and k's, ``ngroups`` the q/k heads), a
    pass at a time."""
    return _measure_passes("mamba3", shape, device, bw, reps, meta, mamba3_inputs,
                           lambda grad: mamba3_entries(peer, grad), mamba3_floor_bytes)


#: Mamba-3's decode step as timed: (label, batch, heads, headdim_v, headdim_qk, q/k heads),
#: mamba_ssm's test heads at the batch the issue's target names
MAMBA3_DECODE_SHAPES = [("decode-64", 64, 32, 64, 128, 8)]


def measure_mamba3_decode(shape, device, bw, reps: int, meta: dict) -> list[dict]:
    """Mamba-3's decode step (:func:`leetrepro.methods.mamba3_step.mamba3_step`) at ``shape``:
    one token per sequence, bf16 inputs, the states at distinct slots of pools twice the batch
    (float32 angles and SSM states, bf16 last key and value), eager and replayed from a graph,
    against the floor of the states read and written and the token's inputs and output. (mamba_ssm's
    own decode step is CuTe, which this bench does not run.)"""
    from ..methods.mamba3_step import mamba3_step
    label, batch, heads, dv, p, hqk = shape
    a = p // 4
    gen = torch.Generator().manual_seed(5)

    def r(*dims, dtype=torch.bfloat16):
        return torch.randn(*dims, generator=gen).to(device=device, dtype=dtype)
    f32 = dict(dtype=torch.float32)
    dt = torch.nn.functional.softplus(r(batch, heads, **f32) - 2)
    inputs = dict(Q=r(batch, hqk, p), K=r(batch, hqk, p), V=r(batch, heads, dv),
                  ADT=-dt * 0.5, DT=dt, Trap=r(batch, heads, **f32),
                  Q_bias=r(heads, p, **f32), K_bias=r(heads, p, **f32),
                  Angles=r(batch, heads, a, **f32), D=r(heads, **f32), Z=r(batch, heads, dv))
    slots_n = 2 * batch
    pools = (r(slots_n, heads, a, **f32), r(slots_n, heads, dv, p, **f32) / p,
             r(slots_n, heads, p), r(slots_n, heads, dv))
    slots = torch.randperm(slots_n, generator=gen)[:batch].to(device)
    state = heads * (a * 4 + dv * p * 4 + (p + dv) * 2)       # a sequence's states, once
    token = hqk * p * 2 * 2 + heads * (dv * 2 * 3 + 3 * 4 + a * 4)   # its inputs and output
    floor = batch * (2 * state + token) / bw * 1e3
    times, status = timed_entries({"ours": lambda: mamba3_step(**inputs, pools=pools,
                                                               slots=slots)},
                                  (), reps, device)
    named = dict(batch=batch, seqlen=1, heads=heads, headdim=dv, dstate=p, ngroups=hqk)
    return _rows("mamba3", label, named, "step", times, status, floor, meta)


def measure_block(device, reps: int, meta: dict, peer, batch: int = 2, n: int = 8192) -> list[dict]:
    """The Mamba-2 block at the Codestral shape (d_model 4096, 128 heads of 64, 8 groups, d_state
    128), bf16 weights, forward + backward (input and weight gradients), our SSD and mamba_ssm's
    on the same weights."""
    from ..models import Mamba2Block
    torch.manual_seed(0)
    kw = dict(d_state=128, headdim=64, expand=2, ngroups=8)
    blocks = {"ours": Mamba2Block(4096, **kw)}
    if peer is not None:
        blocks["mamba_ssm"] = Mamba2Block(4096, ssd=peer, **kw)
        blocks["mamba_ssm"].load_state_dict(blocks["ours"].state_dict())
    blocks = {k: b.to(device=device, dtype=torch.bfloat16) for k, b in blocks.items()}
    u = torch.randn(batch, n, 4096).to(device=device, dtype=torch.bfloat16).requires_grad_()
    du = torch.randn(batch, n, 4096).to(device=device, dtype=torch.bfloat16)

    def entry(block):
        params = [u] + list(block.parameters())

        def call(u, du):
            return torch.autograd.grad(block(u), params, du)
        return call
    times, status = timed_entries({k: entry(b) for k, b in blocks.items()}, (u, du), reps,
                                  device, 7)
    dims = dict(batch=batch, seqlen=n, heads=128, headdim=64, dstate=128, ngroups=8)
    return _rows("block", "codestral", dims, "fwd+bwd", times, status, None, meta)


def train_lm(device, meta: dict, peer, steps: int = 50):
    """The byte-level Mamba-2 LM trained ``steps`` steps with each SSD from the same weights on
    the same batches (bf16 autocast): the rows of :func:`leetrepro.bench.lm.train`."""
    import pandas as pd

    from ..models.lm import corpus
    from .lm import train
    data = corpus()
    kw = dict(steps=steps, batch=8, seq_len=2048, dim=1024, layers=4, heads=32, device=device,
              log_every=5)
    runs = [train("mamba2", data, label="ours", **kw)]
    if peer is not None:
        runs.append(train("mamba2", data, label="mamba_ssm", ssd=peer, **kw))
    df = pd.concat(runs).assign(**{k: v for k, v in meta.items() if k not in runs[0].columns})
    for label, part in df.groupby("method"):
        later = part[part.step > 10]  # (past the first steps' compilation and autotuning)
        print(f"lm {label:10s} tokens/s {later.tokens_per_s.median():10.0f}  final loss "
              f"{part.loss.iloc[-1]:.4f}", flush=True)
    return df


def _arguments(p) -> None:
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--shapes", nargs="*", default=[s[0] for s in SHAPES],
                   choices=[s[0] for s in SHAPES])
    p.add_argument("--fla-shapes", nargs="*", default=["codestral"],
                   choices=[s[0] for s in SHAPES],
                   help="the shapes flash-linear-attention runs at (it autotunes minutes a shape)")
    p.add_argument("--block", action="store_true", help="also the Mamba-2 block (Codestral)")
    p.add_argument("--lm", action="store_true", help="also the Mamba-2 LM's training run")
    p.add_argument("--mamba3", action="store_true",
                   help="also Mamba-3's recurrence against mamba_ssm's (MAMBA3_SHAPES)")
    p.add_argument("--only-mamba3", action="store_true", help="Mamba-3's rows alone")
    p.add_argument("--peers", default=None,
                   help="folder with mamba_ssm's public source (default $LEETREPRO_PEERS)")


def main(argv=None) -> int:
    import pandas as pd

    args, setup = gpu_main("bench.ssd", __doc__, argv, _arguments, output="ssd.csv",
                           bandwidth=True)
    if setup is None:
        return 2
    device, meta, out, bw = setup
    peer = mamba_ssm_peer(args.peers)
    fla = fla_chunk_simple_gla() if args.fla_shapes else None
    rows = []

    def write():
        pd.DataFrame(rows).to_csv(os.path.join(out, "ssd.csv"), index=False)
    for shape in SHAPES:
        if shape[0] in args.shapes and not args.only_mamba3:
            for part in measure(shape, device, bw, args.reps, meta, peer,
                                fla if shape[0] in args.fla_shapes else None):
                rows += part
                write()
    if args.block:
        rows += measure_block(device, args.reps, meta, peer)
        write()
    if args.mamba3 or args.only_mamba3:
        peer3 = mamba_ssm_peer(args.peers, "ops.triton.mamba3.mamba3_siso_combined",
                               "mamba3_siso_combined")
        for shape in MAMBA3_DECODE_SHAPES:
            rows += measure_mamba3_decode(shape, device, bw, args.reps, meta)
            write()
        for shape in MAMBA3_SHAPES:
            for part in measure_mamba3(shape, device, bw, args.reps, meta, peer3):
                rows += part
                write()
    if args.lm:
        train_lm(device, meta, peer).to_csv(os.path.join(out, "ssd_lm.csv"), index=False)
    print(f"-> {out}/ssd.csv")
    return 0


if __name__ == "__main__":
    sys.exit(main())
