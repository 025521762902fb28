"""The full correctness matrix on a GPU: every registered method × dtype × mask × shape against the
float64 oracle, plus run-to-run determinism. ``make gpu-check`` (or ``python -m leetrepro.bench.gpu_check
--out data/<gpu>``) writes ``correctness.csv`` and exits non-zero if any case fails.

Shapes cover N = 1, odd N, r ≠ d, tiny r and d, r = d = 256, batch 16 × 32 heads, and N = 100000.
Gradients get rows of their own (``quantity`` dB, dC, dV, and dS0 for the methods with a state):
the backward of each method against float64 autograd through the oracle, on ``GRAD_SHAPES``, and
with every proper subset of the inputs requiring grad (``note`` names the gradients asked for),
and with time-major inputs (``TIME_MAJOR_GRAD_SHAPES``); O and every gradient in the layouts models
hand the operator (``LAYOUT_SHAPES``, :func:`check_layouts`). ``--heads-only`` checks only the head
shapes models use (``HEAD_SHAPES``: r, d ∈ {64, 128, 256}; Chunk's Hopper kernel also with its
fewest value columns a program, ``config``'s DC; with ``--chunk-kernel hopper`` the
Hopper kernel at each): O with both masks, the gradients with states in and out, time-major.
``--huge`` adds batch 16 × 32 heads × N = 100000 (int32 offsets overflow there), checked on its
first and last (batch, head) against the oracle. ``--fp16-range`` adds fp16 cases whose states
pass fp16's largest value (65504) while the outputs and gradients fit (``RANGE_CASES``): the
forward's and dB's state, or the reverse sweeps' (dV and dC), checked with O and every gradient.
The output buffer is poisoned with NaN before every call, so a kernel that leaves elements
unwritten fails.

Per-token gates (``g``; every method that takes them, :func:`check_gated`): O, the final state
and the gradients of B, C, V, g and the initial state against float64 autograd through the
oracle, gates alone and with γ, batched and packed (``cu_seqlens``), head-major and time-major
(``GATE_SHAPES``), the gates' gradient held to :data:`leetrepro.reference.GATE_GRAD_TOLERANCE`;
flash-linear-attention's simple_gla test cases through the drop-in (:func:`check_fla_cases`);
a hard reset and strong gates over 2²⁰ rows (:func:`check_gate_edges`); decode steps with gates.

Mamba-2 (``--mamba-only`` for these alone): mamba_ssm's ``mamba_chunk_scan_combined`` through the
drop-in against the float64 recurrence with every argument and gradient, 2²⁰ tokens, and
mamba_ssm's own packed test shape, mamba_ssm's Triton kernels' own errors beside ours where they
import (:func:`check_mamba`); B and C in groups read in place by Chunk (:func:`check_groups`).
"""
from __future__ import annotations

import functools
import itertools
import math
import os
import sys
import time
import typing

import torch

from .. import causal_linear_decoder, reference, rel_error
from .._dtypes import DTYPE_NAMES, parse_dtype
from ..methods import methods
from ..reference import GATE_GRAD_TF32_TOLERANCE, GATE_GRAD_TOLERANCE, TF32_TOLERANCE, TOLERANCE
from .harness import gpu_main, random_inputs, sync

# (batch, heads, N, r, d)
SHAPES = [(1, 1, 1, 16, 16), (2, 3, 37, 8, 5), (2, 4, 1000, 64, 48), (1, 2, 3001, 256, 256),
          (1, 32, 4097, 128, 128), (16, 32, 2048, 128, 128), (1, 4, 100000, 128, 128)]
HUGE = (16, 32, 100000, 128, 128)
#: gradient shapes: odd N and r ≠ d, blocks crossed; 32 heads at 4097; 2 heads × 10000 rows cut
#: into segments (the batch-1 path of the kernels)
GRAD_SHAPES = [(2, 3, 37, 8, 5), (2, 4, 1000, 64, 48), (1, 32, 4097, 128, 128),
               (1, 2, 10000, 128, 128)]
QUADRATIC_MAX_N = 16384          # Vanilla materialises N×N per (batch, head)
#: fp16 range: (label, factors of B, C, V, dO over the matrix's inputs) that put one state past
#: 65504 (|S| ~10⁵-10⁶ at N = 4097) while O and the gradients fit in fp16
RANGE_CASES = [("forward state past fp16", (1e-3, 64.0, 256.0, 1e-3)),
               ("backward state past fp16", (64.0, 1e-3, 1e-3, 256.0))]
RANGE_SHAPES = [(1, 32, 4097, 128, 128), (4, 32, 2048, 128, 128)]
#: gradients with time-major inputs ((batch, N, heads, ·) storage seen as (batch, heads, N, ·),
#: flash-linear-attention's layout): segments, and one pass per lane
TIME_MAJOR_GRAD_SHAPES = [(2, 8, 1000, 128, 128), (16, 32, 512, 128, 128)]
#: the layouts of a model (:func:`check_layouts`): odd N, r ≠ d, batch > 1, segments; r = d = 128
#: (the Hopper kernel's) one pass per lane and in segments; 64/64 and 128/256 (the heads models use)
LAYOUT_SHAPES = [(2, 3, 37, 8, 5), (2, 4, 1000, 64, 48), (2, 8, 1000, 128, 128),
                 (8, 32, 1024, 128, 128), (2, 16, 777, 64, 64), (2, 8, 600, 128, 256)]
#: the head shapes models use (r, d ∈ {64, 128, 256}, d ≠ r among them; ``--heads-only``): N cut
#: into segments at batch 1-2 (odd N: a short last chunk), one pass per lane at b8 × h32
HEAD_SHAPES = [(2, 4, 1000, 64, 64), (2, 4, 1000, 128, 64), (2, 4, 1000, 64, 128),
               (2, 3, 777, 128, 256), (2, 3, 777, 256, 128), (1, 2, 1500, 256, 256),
               (1, 2, 10000, 64, 64), (1, 2, 6001, 128, 256), (8, 32, 1024, 64, 64),
               (8, 16, 515, 128, 256)]
#: the quick matrix's head shapes for Chunk's Hopper kernel (``matrix(hopper_heads=True)``): N cut
#: into segments with a short last chunk, 64/64 and 128/128
QUICK_HOPPER_SHAPES = [(2, 4, 1000, 64, 64), (2, 4, 1000, 128, 128)]
#: the input dtypes of the matrix, in its order (``--dtypes`` takes a subset)
DTYPES = ("float32", "float16", "bfloat16")


def gammas(heads: int, seed: int) -> torch.Tensor:
    """Per-head decays: random in (0.5, 1), with λ = 1 exactly and λ = 1e-4 among them."""
    g = torch.Generator().manual_seed(seed)
    out = 0.5 + 0.5 * torch.rand(heads, generator=g, dtype=torch.float64)
    out[0] = 1.0
    if heads > 1:
        out[-1] = 1e-4
    return out


def inputs(shape, dtype, seed, device):
    return random_inputs(*shape, dtype=dtype, device=device, seed=seed, scale_bc=True)


def poison(like: torch.Tensor) -> None:
    """Fill the allocator's next block of this size with NaN (empty_like will likely reuse it)."""
    torch.full_like(like, float("nan"))


#: the fp32-exact products every method with an fp32 precision switch is also checked through,
#: forward and gradients: (label, options, tolerance), the fp32 contract
TF32X3 = ("tf32x3", {"fp32_precision": "tf32x3"}, 1e-5)


def fp32_switch(m, dtype) -> bool:
    """Whether ``m`` runs ``dtype`` through products of a chosen precision (fp32 on a kernel
    with ``fp32_precision``: tf32 by default)."""
    return "fp32_precision" in m.options and dtype == torch.float32


def default_tolerance(m, dtype) -> float:
    """The tolerance of ``m`` on ``dtype`` with its default products (tf32's where it has the
    switch, :func:`fp32_switch`)."""
    return TF32_TOLERANCE if fp32_switch(m, dtype) else TOLERANCE[dtype]


def variants(m, dtype, n):
    """(label, options, tolerance) for one method and dtype: kernels with an fp32 precision switch
    run in fp32 with their default tf32 dots and with the fp32-exact modes (``ieee``, plain FMA
    and slow to compile and run, up to N = 4097 only)."""
    if fp32_switch(m, dtype):
        out = [("tf32", {}, TF32_TOLERANCE), TF32X3]
        return out + ([("ieee", {"fp32_precision": "ieee"}, TF32X3[2])] if n <= 4097 else [])
    return [("", {}, TOLERANCE[dtype])]


def exact_modes(m, dtype) -> tuple:
    """The gradient matrix's precisions: fp32 through a method's default tf32 products and, where
    it has them, its fp32-exact ones (``tf32x3``: ``ieee`` is the forward's only, slow to compile
    and run); any other dtype, as it is."""
    return (False, True) if fp32_switch(m, dtype) else (False,)


def frozen_subsets(m) -> list[str]:
    """Every non-empty proper subset of the inputs that can require grad (B, C, V, and S0 for a
    method with a state): a frozen embedding, LoRA, a probe that wants only dV."""
    names = "BCVS" if m.state else "BCV"
    return ["".join(s) for k in range(1, len(names)) for s in itertools.combinations(names, k)]


def narrow_hopper_columns(m, shape, dtype, device) -> int | None:
    """The fewest value columns a program the Hopper kernel takes for a case (``config``'s DC:
    32 in half precision, 64 in fp32) where that is fewer than its widest and it can run the
    case (Chunk on an sm_90 GPU); else None."""
    if m.name != "chunk-scan":
        return None
    from ..methods.chunk import hopper_tiles, hopper_unfit
    b, h, n, r, d = shape
    probe = torch.empty(1, 1, 64, r, dtype=dtype, device=device)
    if hopper_unfit(probe, probe, torch.empty(1, 1, 64, d, dtype=dtype, device=device), None):
        return None
    narrow = 64 if dtype == torch.float32 else 32
    return narrow if narrow < hopper_tiles(r, d, dtype, False)[0] else None


def _failed(exc: BaseException) -> str:
    """A case's status when its call raised: FAIL, the error's type and its message's first line."""
    return f"FAIL {type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:160]}"


def check_case(m, shape, dtype, decay, device, seed, rows, meta, extra=None):
    """Rows O of one case against float64, in each of the method's :func:`variants`; ``extra``:
    ``(label, options)`` run instead of them (a setting of one kernel)."""
    B, C, V = inputs(shape, dtype, seed, device)
    g = gammas(shape[1], seed).to(device) if decay else None
    ref = reference(B, C, V, g)
    cases = variants(m, dtype, shape[2])
    if extra is not None:
        cases = [(f"{label}{'+' if label else ''}{extra[0]}", dict(opts, **extra[1]), tol)
                 for label, opts, tol in cases[:1]]
    for label, opts, tol in cases:
        row = dict(meta, method=m.name, abbr=m.abbr, language=m.language, dtype=DTYPE_NAMES[dtype],
                   precision=label, quantity="O", decay=decay, batch=shape[0], heads=shape[1],
                   N=shape[2], r=shape[3], d=shape[4], tol=tol, rel_err=math.nan,
                   max_abs_err=math.nan, deterministic="", seconds=math.nan)
        try:
            poison(V)
            t0 = time.perf_counter()
            out = causal_linear_decoder(B, C, V, g, method=m.name, **opts)
            torch.cuda.synchronize()
            row["seconds"] = time.perf_counter() - t0
            err = rel_error(out, ref)
            row.update(rel_err=err, max_abs_err=(out.double() - ref).abs().max().item())
            if m.language != "torch":
                poison(V)
                again = causal_linear_decoder(B, C, V, g, method=m.name, **opts)
                row["deterministic"] = bool(torch.equal(out, again))
            ok = err <= tol
            if m.unsafe:
                row["status"] = "unsafe (reported, not judged)"
            else:
                row["status"] = "pass" if ok and row["deterministic"] is not False else "FAIL"
        except Exception as exc:  # a failing case is recorded, the matrix goes on
            row["status"] = _failed(exc)
        rows.append(row)
        print(f"{row['status'][:30]:30s} {m.abbr:12s} {row['dtype']:9s} {label:6s} "
              f"decay={decay!s:5s} {shape} err={row['rel_err']:.2e}", flush=True)
    del B, C, V, ref
    torch.cuda.empty_cache()


def check_grads(m, shape, dtype, decay, device, seed, rows, meta, wanted="BCVS", magnitudes=None,
                time_major=False, exact=False):
    """Rows dB, dC, dV (and dS0 with a state) of one case against float64 autograd; ``wanted``:
    the inputs that require grad (the others are frozen: no gradient may come back for them).
    ``exact``: fp32 through the method's fp32-exact products (:data:`TF32X3`), at its tolerance.
    ``magnitudes``: a :data:`RANGE_CASES` entry: B, C, V, dO scaled by its factors, no state, and
    a row for O too. ``time_major``: B, C, V stored (batch, N, heads, ·), read through strides."""
    b, h, n, r, d = shape
    B, C, V = inputs(shape, dtype, seed, device)
    g = gammas(h, seed).to(device) if decay else None
    gen = torch.Generator(device=device).manual_seed(seed + 1)
    state = m.state and magnitudes is None
    S0 = torch.randn(b, h, r, d, device=device, generator=gen) if state else None
    dO = torch.randn(b, h, n, d, device=device, generator=gen, dtype=torch.float64)
    dS = torch.randn(b, h, r, d, device=device, generator=gen, dtype=torch.float64) if state else None
    if magnitudes is not None:
        fb, fc, fv, fo = magnitudes[1]
        B, C, V = ((t.float() * f).to(dtype) for t, f in ((B, fb), (C, fc), (V, fv)))
        dO = dO * fo
    if time_major:  # the same values in (batch, N, heads, ·) storage
        B, C, V = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (B, C, V))
    leaves = [t.detach().requires_grad_(n in wanted)
              for n, t in zip("BCVS", (B, C, V) + ((S0,) if state else ()))]
    wide = [t.detach().double().requires_grad_(t.requires_grad) for t in leaves]
    names = [q for q, t in zip(["dB", "dC", "dV", "dS0"], leaves) if t.requires_grad]
    asked = [t for t in leaves if t.requires_grad]
    label, opts, tol = TF32X3 if exact else \
        ("", {}, default_tolerance(m, dtype))

    def loss(x, fn):
        res = fn(*x[:3], g, initial_state=x[3] if state else None, output_final_state=state)
        o, s = res if state else (res, None)
        return (o.double() * dO).sum() + ((s.double() * dS).sum() if state else 0)

    base = dict(meta, method=m.name, abbr=m.abbr, language=m.language, dtype=DTYPE_NAMES[dtype],
                precision=label, decay=decay, batch=b, heads=h, N=n, r=r, d=d,
                tol=tol, deterministic="", note="vs float64 autograd through the oracle"
                + (", with initial and final state" if state else "")
                + ("" if len(asked) == len(leaves) else f"; only {', '.join(names)} asked for")
                + ("" if magnitudes is None else f"; {magnitudes[0]}")
                + ("; time-major inputs" if time_major else ""))
    try:
        if magnitudes is not None:  # the forward too: its state may be the one past fp16
            ref, ref_state = reference(*(t.double() for t in (B, C, V)), g,
                                       output_final_state=True)
            out = causal_linear_decoder(B, C, V, g, method=m.name)
            err = rel_error(out, ref)
            rows.append(dict(base, quantity="O", rel_err=err, max_state=ref_state.abs().max().item(),
                             max_abs_err=(out.double() - ref).abs().max().item(),
                             status="pass" if err <= tol else "FAIL"))
            names = ["O"] + names
        want = torch.autograd.grad(loss(wide, reference), [t for t in wide if t.requires_grad])
        t0 = time.perf_counter()
        got = torch.autograd.grad(loss(leaves, lambda *a, **k: causal_linear_decoder(
            *a, method=m.name, **k, **opts)), asked)
        sync(device)
        seconds = time.perf_counter() - t0
        for q, a, w in zip(names[len(names) - len(got):], got, want):
            err = rel_error(a, w)
            rows.append(dict(base, quantity=q, rel_err=err, seconds=seconds,
                             max_abs_err=(a.double() - w).abs().max().item(),
                             status="pass" if err <= tol else "FAIL"))
    except Exception as exc:
        rows.append(dict(base, quantity="grads", rel_err=math.nan,
                         status=_failed(exc)))
    print(f"{'grads':30s} {m.abbr:12s} {DTYPE_NAMES[dtype]:9s} {base['precision']:6s} "
          f"decay={decay!s:5s} {shape} "
          + " ".join(f"{r['quantity']}={r['rel_err']:.1e}:{r['status'][:4]}"
                     for r in rows[-len(names):]), flush=True)
    del B, C, V, leaves, wide
    torch.cuda.empty_cache()


def check_layouts(m, shape, dtype, device, seed, rows, meta):
    """Rows O, dB, dC, dV of one case in each layout a model hands the operator
    (:data:`leetrepro.bench.layouts.LAYOUTS` but head-major: time-major views of separate
    projections, the drop-in's time-major leaves, one fused projection), per-head decays, against
    float64 autograd through the oracle on the same views; each gradient is taken to the
    layout's own leaves (the fused projection's compared slice by slice)."""
    from ..projection import split_projection
    from .layouts import LAYOUTS, entry, make_layout
    b, h, n, r, d = shape
    g = gammas(h, seed).to(device)
    tol = default_tolerance(m, dtype)
    for layout in LAYOUTS[1:]:
        x, bcv, dO = make_layout(layout, b, h, n, r, d, dtype=dtype, device=device, seed=seed)
        wide = [t.detach().double().requires_grad_() for t in x]
        fn = entry(layout, g, method=m.name)
        base = dict(meta, method=m.name, abbr=m.abbr, language=m.language,
                    dtype=DTYPE_NAMES[dtype], precision="", decay=True, batch=b, heads=h, N=n,
                    r=r, d=d, tol=tol, deterministic="",
                    note=f"vs float64 autograd through the oracle; {layout} layout")
        try:
            ref = reference(*bcv(*wide), g)
            if layout == "drop-in":  # O (b, N, h, d), scale 1
                ref = ref.transpose(1, 2)
            want = torch.autograd.grad(ref, wide, dO.double())
            out = fn(x, bcv)
            got = torch.autograd.grad(out, x, dO)
            if layout == "fused":  # dy's slices, as dB, dC, dV
                got, want = split_projection(got[0], h, r, d), split_projection(want[0], h, r, d)
            for q, a, w in zip(("O", "dB", "dC", "dV"), (out,) + tuple(got), (ref,) + tuple(want)):
                err = rel_error(a, w)
                rows.append(dict(base, quantity=q, rel_err=err,
                                 max_abs_err=(a.double() - w).abs().max().item(),
                                 status="pass" if err <= tol else "FAIL"))
        except Exception as exc:
            rows.append(dict(base, quantity="layout", rel_err=math.nan, status=_failed(exc)))
        print(f"{layout:30s} {m.abbr:12s} {DTYPE_NAMES[dtype]:9s} {shape} " + " ".join(
            f"{r_['quantity']}={r_['rel_err']:.1e}:{r_['status'][:4]}" for r_ in rows[-4:]),
            flush=True)
        del x, wide
    torch.cuda.empty_cache()


def check_serving(dtype, decay, device, rows, meta):
    """Rows for packed prompts (``cu_seqlens``: O and the final states, each sequence against the
    oracle alone) and for the decode step (prefill N, then k steps over a state pool, against the
    prefill of N + k), by Chunk / ``decode_step``."""
    from ..decode import decode_step

    heads, r, d = 32, 128, 128
    lengths = [3000, 0, 1, 4097, 777, 64]
    cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32,
                      device=device)
    B, C, V = inputs((1, heads, sum(lengths), r, d), dtype, 900 + decay, device)
    g = gammas(heads, 900).to(device) if decay else None
    tol = TF32_TOLERANCE if dtype == torch.float32 else TOLERANCE[dtype]
    base = dict(meta, method="chunk-scan", abbr="Chunk", language="triton",
                dtype=DTYPE_NAMES[dtype], precision="", decay=decay, batch=1, heads=heads,
                N=sum(lengths), r=r, d=d, tol=tol, deterministic="", seconds=math.nan,
                max_abs_err=math.nan)
    try:
        S0 = torch.randn(len(lengths), heads, r, d, device=device)
        out, fin = causal_linear_decoder(B, C, V, g, method="Chunk", cu_seqlens=cu,
                                         initial_state=S0, output_final_state=True)
        errs_o, errs_s = [], []
        for i in range(len(lengths)):
            a, b = int(cu[i]), int(cu[i + 1])
            o, s = reference(B[:, :, a:b], C[:, :, a:b], V[:, :, a:b], g,
                             initial_state=S0[i:i + 1], output_final_state=True)
            if b > a:
                errs_o.append(rel_error(out[:, :, a:b], o))
            errs_s.append(rel_error(fin[i:i + 1], s))
        note = f"packed lengths {lengths}, initial states; worst sequence"
        for q, e in (("O_varlen", max(errs_o)), ("S_varlen", max(errs_s))):
            rows.append(dict(base, quantity=q, rel_err=e, note=note,
                             status="pass" if e <= tol else "FAIL"))
    except Exception as exc:
        rows.append(dict(base, quantity="varlen", rel_err=math.nan,
                         status=_failed(exc)))
    try:  # decode: batch 8, prefill 1000 rows, then 16 steps of one token
        n, k = 1000, 16
        B, C, V = inputs((8, heads, n + k, r, d), dtype, 950 + decay, device)
        exact = TF32X3[1] if dtype == torch.float32 else {}
        _, state = causal_linear_decoder(B[:, :, :n], C[:, :, :n], V[:, :, :n], g, method="Chunk",
                                         output_final_state=True, **exact)
        pool = torch.randn(20, heads, r, d, device=device)
        slots = torch.tensor([3, 1, 17, 0, 8, 11, 5, 19], dtype=torch.int32, device=device)
        pool[slots.long()] = state
        outs = [decode_step(B[:, :, t:t + 1], C[:, :, t:t + 1], V[:, :, t:t + 1], g, pool, slots)
                for t in range(n, n + k)]
        e = rel_error(torch.cat(outs, 2), reference(B, C, V, g)[:, :, n:])
        _, want_s = reference(B, C, V, g, output_final_state=True)
        es = rel_error(pool[slots.long()], want_s)
        note = ("prefill 1000 by Chunk (fp32: tf32x3), then 16 decode steps over a pool of 20 "
                "slots (batch 8)")
        base = dict(base, method="decode_step", abbr="decode_step", batch=8, N=n + k)
        for q, err, t in (("O_decode", e, TOLERANCE[dtype]), ("S_decode", es, TOLERANCE[dtype])):
            rows.append(dict(base, quantity=q, rel_err=err, tol=t, note=note,
                             status="pass" if err <= t else "FAIL"))
    except Exception as exc:
        rows.append(dict(base, quantity="decode", rel_err=math.nan,
                         status=_failed(exc)))
    rows.append(dict(base, method="decode_step", abbr="decode_step", batch=4, N=1, tol=0.0,
                     rel_err=math.nan, quantity="bad_slots", status=_bad_slots(dtype, g, device),
                     note="slots [0, -1, 20, 0] of a pool of 20 rows inside a larger buffer, no "
                          "host check: rows outside untouched, bad outputs NaN"))
    print(f"{'serving':30s} {DTYPE_NAMES[dtype]:9s} decay={decay!s:5s} "
          + " ".join(f"{r['quantity']}={r['rel_err']:.1e}:{r['status'][:4]}" for r in rows[-5:]),
          flush=True)
    torch.cuda.empty_cache()


def _bad_slots(dtype, g, device) -> str:
    """The decode kernel's device-side slot check (the graph path): 'pass' if a negative slot and
    one past the pool touch nothing outside it, a slot named twice has its row poisoned, and
    exactly the bad sequences' outputs are NaN."""
    from ..decode import decode_step
    try:
        heads, r, d = (1 if g is None else g.numel()), 128, 128
        B, C, V = inputs((4, heads, 1, r, d), dtype, 990, device)
        arena = torch.randn(40, heads, r, d, device=device)
        before = arena.clone()
        pool = arena[10:30]
        out = decode_step(B, C, V, g, pool, torch.tensor([0, -1, 20, 0], dtype=torch.int32,
                                                         device=device), check_slots=False)
        sync(device)
        outside = torch.equal(arena[:10], before[:10]) and torch.equal(arena[30:], before[30:])
        others = torch.equal(pool[1:], before[11:30])
        ok = outside and others and bool(torch.isnan(out).all()) and bool(torch.isnan(pool[0]).all())
        return "pass" if ok else (f"FAIL outside pool untouched={outside}, other rows untouched="
                                  f"{others}, outputs NaN={bool(torch.isnan(out).all())}")
    except Exception as exc:
        return _failed(exc)


def check_huge(m, dtype, device, rows, meta):
    """batch 16 × 32 heads × N = 100000: the first and last (batch, head) against the oracle."""
    b, h, n, r, d = HUGE
    row = dict(meta, method=m.name, abbr=m.abbr, language=m.language, dtype=DTYPE_NAMES[dtype],
               precision="", quantity="O", decay=True, batch=b, heads=h, N=n, r=r, d=d,
               tol=TOLERANCE[dtype],
               rel_err=math.nan, max_abs_err=math.nan, deterministic="", seconds=math.nan,
               note="checked on (batch, head) = (0, 0) and (15, 31)")
    try:
        B, C, V = inputs(HUGE, dtype, 7, device)
        g = gammas(h, 7).to(device)
        out = causal_linear_decoder(B, C, V, g, method=m.name)
        errs = []
        for bi, hi in ((0, 0), (b - 1, h - 1)):
            sl = (slice(bi, bi + 1), slice(hi, hi + 1))
            ref = reference(B[sl], C[sl], V[sl], g[hi:hi + 1])
            errs.append(rel_error(out[sl], ref))
        row.update(rel_err=max(errs), status="pass" if max(errs) <= TOLERANCE[dtype] else "FAIL")
    except Exception as exc:
        row["status"] = _failed(exc)
    rows.append(row)
    print(f"{row['status'][:30]:30s} {m.abbr:12s} {row['dtype']:9s} huge {HUGE} err={row['rel_err']:.2e}",
          flush=True)
    torch.cuda.empty_cache()


#: gated cases (batch, heads, N, r, d): odd N, r ≠ d, segments at batch 1, the model head shapes
GATE_SHAPES = [(2, 3, 37, 8, 5), (2, 4, 1000, 64, 48), (1, 8, 4097, 128, 128),
               (2, 16, 2048, 128, 64), (1, 2, 10000, 64, 64)]


def _gate_inputs(shape, dtype, seed, device, packed):
    b, h, n, r, d = shape
    B, C, V = inputs(shape, dtype, seed, device)
    gen = torch.Generator(device=device).manual_seed(seed + 3)
    logits = torch.randn(b, h, n, device=device, generator=gen) + 2.0
    g = torch.nn.functional.logsigmoid(logits)
    cu = None
    if packed:  # (batch 1: the rows of all the batch's sequences and an empty one, packed)
        B, C, V = (t.transpose(0, 1).reshape(1, h, b * n, -1) for t in (B, C, V))
        g = g.transpose(0, 1).reshape(1, h, b * n)
        cu = torch.tensor([0, n, n] + [n * (i + 1) for i in range(1, b)], dtype=torch.int32,
                          device=device)
    count = b + 1 if packed else b
    S0 = torch.randn(count, h, r, d, device=device, generator=gen)
    return B, C, V, g, S0, cu


def check_gated(m, shape, dtype, with_gamma, device, seed, rows, meta, packed=False,
                time_major=False, forward_only=False):
    """Rows O, S_N, dB, dC, dV, dg, dS0 of one gated case against float64 autograd through the
    oracle (states in and out; ``packed``: the batch's sequences and an empty one packed along
    N of a batch of one; ``time_major``: B, C, V and g stored time-major; ``forward_only``: O
    alone, for the methods without a state)."""
    B, C, V, g, S0, cu = _gate_inputs(shape, dtype, seed, device, packed)
    if time_major:
        B, C, V = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (B, C, V))
        g = g.transpose(1, 2).contiguous().transpose(1, 2)
    gamma = gammas(shape[1], seed).to(device) if with_gamma else None
    label, opts, tol = ("", {}, default_tolerance(m, dtype))
    gate_tol = max(tol, GATE_GRAD_TOLERANCE[dtype])
    if fp32_switch(m, dtype):  # (tf32 dots: dg's own bound for them)
        gate_tol = GATE_GRAD_TF32_TOLERANCE
    base = dict(meta, method=m.name, abbr=m.abbr, language=m.language, dtype=DTYPE_NAMES[dtype],
                precision=label, decay=with_gamma, batch=shape[0], heads=shape[1], N=shape[2],
                r=shape[3], d=shape[4], deterministic="",
                note="per-token gates" + (" and γ" if with_gamma else "")
                + ("; packed sequences" if packed else "") + ("; time-major" if time_major else "")
                + ("" if forward_only else "; states in and out, vs float64 autograd"))
    names = ["O"] if forward_only else ["O", "S_N", "dB", "dC", "dV", "dg", "dS0"]
    try:
        if forward_only:
            out = causal_linear_decoder(B, C, V, gamma, g=g, method=m.name, cu_seqlens=cu, **opts)
            want = reference(B, C, V, gamma, g=g, cu_seqlens=cu)
            got, want = [out], [want]
        else:
            leaves = [t.detach().requires_grad_() for t in (B, C, V, g, S0)]
            wide = [t.detach().double().requires_grad_() for t in (B, C, V, g, S0)]
            o, s = causal_linear_decoder(*leaves[:3], gamma, g=leaves[3], initial_state=leaves[4],
                                         output_final_state=True, cu_seqlens=cu, method=m.name,
                                         **opts)
            wo, ws = reference(*wide[:3], gamma, g=wide[3], initial_state=wide[4],
                               output_final_state=True, cu_seqlens=cu)
            gen = torch.Generator(device=device).manual_seed(seed + 9)
            dO = torch.randn(wo.shape, device=device, generator=gen, dtype=torch.float64)
            dS = torch.randn(ws.shape, device=device, generator=gen, dtype=torch.float64)
            got = [o, s] + list(torch.autograd.grad((o.double() * dO).sum() + (s.double() * dS).sum(),
                                                    leaves))
            want = [wo, ws] + list(torch.autograd.grad((wo * dO).sum() + (ws * dS).sum(), wide))
        for q, a, w in zip(names, got, want):
            err = rel_error(a, w)
            t = gate_tol if q == "dg" else tol
            rows.append(dict(base, quantity=q, rel_err=err, tol=t,
                             max_abs_err=(a.double() - w).abs().max().item(),
                             status="pass" if err <= t else "FAIL"))
    except Exception as exc:
        rows.append(dict(base, quantity="gated", rel_err=math.nan, status=_failed(exc)))
        names = ["gated"]
    print(f"{'gates':30s} {m.abbr:12s} {DTYPE_NAMES[dtype]:9s} gamma={with_gamma!s:5s} "
          f"packed={packed!s:5s} tm={time_major!s:5s} {shape} "
          + " ".join(f"{r['quantity']}={r['rel_err']:.1e}:{r['status'][:4]}"
                     for r in rows[-len(names):]), flush=True)
    torch.cuda.empty_cache()


#: flash-linear-attention's simple_gla test cases (B, T, H, D, gate_logit_normalizer): T from 1
#: to 300, D not a power of two among them; and its packed offsets
FLA_CASES = [(2, 1, 2, 64, 1.0), (2, 15, 4, 60, 0.1), (2, 63, 4, 128, 1.0), (2, 300, 4, 100, 10.0),
             (2, 500, 4, 128, 1.0)]
FLA_PACKED = [0, 15, 100, 300, 1200, 2000]


def check_fla_cases(dtype, device, rows, meta):
    """flash-linear-attention's ``chunk_simple_gla`` test cases through the drop-in, gates from
    logsigmoid(randn)/normalizer, scale and initial state, forward and every gradient, against
    float64 autograd through the oracle; its packed offsets too."""
    from ..compat import chunk_simple_gla
    tol = TOLERANCE[dtype] if dtype != torch.float32 else TF32_TOLERANCE
    for case in FLA_CASES + [("packed",)]:
        gen = torch.Generator(device=device).manual_seed(len(rows))
        if case[0] == "packed":
            b, H, D, norm = 1, 4, 64, 1.0
            T = FLA_PACKED[-1]
            cu = torch.tensor(FLA_PACKED, dtype=torch.int32, device=device)
            count = len(FLA_PACKED) - 1
        else:
            b, T, H, D, norm = case
            cu, count = None, b
        q, k, v = (torch.randn(b, T, H, D, device=device, generator=gen).to(dtype)
                   for _ in range(3))
        g = torch.nn.functional.logsigmoid(torch.randn(b, T, H, device=device, generator=gen)) / norm
        h0 = torch.randn(count, H, D, D, device=device, generator=gen)
        base = dict(meta, method="chunk_simple_gla", abbr="fla-drop-in", language="triton",
                    dtype=DTYPE_NAMES[dtype], precision="", decay=False, batch=b, heads=H, N=T,
                    r=D, d=D, deterministic="", note=f"flash-linear-attention's simple_gla case "
                    f"{case}" if case[0] != "packed" else f"packed {FLA_PACKED}")
        try:
            leaves = [t.detach().requires_grad_() for t in (q, k, v, g, h0)]
            o, ht = chunk_simple_gla(*leaves[:4], initial_state=leaves[4], output_final_state=True,
                                     cu_seqlens=cu, scale=D ** -0.5)
            wide = [t.detach().double().requires_grad_() for t in (q, k, v, g, h0)]
            B, C, V = (t.transpose(1, 2) for t in (wide[0] * D ** -0.5, wide[1], wide[2]))
            wo, ws = reference(B, C, V, g=wide[3].transpose(1, 2), initial_state=wide[4],
                               output_final_state=True, cu_seqlens=cu)
            dO = torch.randn(wo.shape, device=device, generator=gen, dtype=torch.float64)
            dS = torch.randn(ws.shape, device=device, generator=gen, dtype=torch.float64)
            got = [o.transpose(1, 2), ht] + list(torch.autograd.grad(
                (o.transpose(1, 2).double() * dO).sum() + (ht.double() * dS).sum(), leaves))
            want = [wo, ws] + list(torch.autograd.grad((wo * dO).sum() + (ws * dS).sum(), wide))
            for qn, a, w in zip(["o", "ht", "dq", "dk", "dv", "dg", "dh0"], got, want):
                err = rel_error(a, w)
                t = (GATE_GRAD_TF32_TOLERANCE if dtype == torch.float32 else
                     max(tol, GATE_GRAD_TOLERANCE[dtype])) if qn == "dg" else tol
                rows.append(dict(base, quantity=qn, rel_err=err, tol=t,
                                 status="pass" if err <= t else "FAIL"))
        except Exception as exc:
            rows.append(dict(base, quantity="fla-case", rel_err=math.nan, status=_failed(exc)))
        print(f"{'fla case':30s} {DTYPE_NAMES[dtype]:9s} {case} "
              + " ".join(f"{r['quantity']}={r['rel_err']:.1e}:{r['status'][:4]}"
                         for r in rows[-7:]), flush=True)


def check_gate_edges(dtype, device, rows, meta):
    """A hard reset (gate −1e4) gives exact zeros across it and no NaN; gates of about −3 a
    token over 2²⁰ rows stay finite and exact on their last rows; decode steps with gates
    continue a gated prefill."""
    from .. import decode_step
    tol = default_tolerance(methods()[0], dtype) if dtype != torch.float32 else TF32_TOLERANCE
    base = dict(meta, method="chunk-scan", abbr="Chunk", language="triton",
                dtype=DTYPE_NAMES[dtype], precision="", decay=False, deterministic="")
    B, C, V = inputs((1, 4, 4096, 128, 128), dtype, 77, device)
    g = torch.nn.functional.logsigmoid(torch.randn(1, 4, 4096, device=device) + 2)
    g[..., 1000] = -1e4
    out = causal_linear_decoder(B, C, V, g=g, method="Chunk")
    after = causal_linear_decoder(B[:, :, 1000:], C[:, :, 1000:], V[:, :, 1000:], g=g[..., 1000:],
                                  method="Chunk")
    err = rel_error(out[:, :, 1000:], after.double())
    ok = bool(torch.isfinite(out).all()) and err <= tol
    rows.append(dict(base, quantity="O", batch=1, heads=4, N=4096, r=128, d=128, rel_err=err,
                     tol=tol, note="hard reset (gate -1e4) at row 1000: rows after it equal a "
                     "fresh start", status="pass" if ok else "FAIL"))
    n = 2 ** 20
    B, C, V = inputs((1, 2, n, 64, 64), dtype, 78, device)
    g = -3.0 + torch.nn.functional.logsigmoid(torch.randn(1, 2, n, device=device))
    out, s = causal_linear_decoder(B, C, V, g=g, method="Chunk", output_final_state=True)
    want = reference(B[:, :, -300:], C[:, :, -300:], V[:, :, -300:], g=g[..., -300:])
    err = rel_error(out[:, :, -280:], want[:, :, 20:])
    ok = bool(torch.isfinite(out).all() and torch.isfinite(s).all()) and err <= tol
    rows.append(dict(base, quantity="O", batch=1, heads=2, N=n, r=64, d=64, rel_err=err, tol=tol,
                     note="gates about -3 a token over 2^20 rows: finite, last rows exact",
                     status="pass" if ok else "FAIL"))
    B, C, V = inputs((2, 8, 300, 64, 64), dtype, 79, device)
    g = torch.nn.functional.logsigmoid(torch.randn(2, 8, 300, device=device) + 1)
    full = reference(B, C, V, 0.97, g=g)
    _, s = causal_linear_decoder(B[:, :, :290], C[:, :, :290], V[:, :, :290], 0.97,
                                 g=g[..., :290], output_final_state=True, method="Chunk")
    pool = torch.zeros(4, 8, 64, 64, device=device)
    slots = torch.tensor([3, 0], device=device)
    pool[slots] = s
    steps = [decode_step(B[:, :, t:t + 1], C[:, :, t:t + 1], V[:, :, t:t + 1], 0.97, pool, slots,
                         g=g[..., t:t + 1]) for t in range(290, 300)]
    err = rel_error(torch.cat(steps, 2), full[:, :, 290:])
    rows.append(dict(base, abbr="decode_step", quantity="O", batch=2, heads=8, N=300, r=64, d=64,
                     rel_err=err, tol=tol, note="10 decode steps with gates after a gated prefill",
                     status="pass" if err <= tol else "FAIL"))
    for r in rows[-3:]:
        print(f"{'gate edges':30s} {DTYPE_NAMES[dtype]:9s} {r['note'][:50]} err={r['rel_err']:.1e} "
              f"{r['status']}", flush=True)


#: Mamba-2 drop-in cases (label, batch, seqlen, heads, headdim, dstate, groups): every argument
#: at an odd length; the Codestral/Nemotron-H heads (the Hopper kernel's r = 128, d = 64), groups
#: of 16 heads read in place; groups of one head
MAMBA_CASES = [("everything", 2, 1000, 8, 64, 128, 2), ("codestral heads", 1, 2048, 128, 64, 128, 8),
               ("a group a head", 2, 777, 4, 64, 64, 4)]
#: the bound of the gradients of dt, A and dt_bias (see check_mamba)
SSD_PARAM_TOLERANCE = {torch.float32: 5e-3, torch.float16: 1e-2, torch.bfloat16: 1e-2}
#: mamba_ssm's own test shape (tests/ops/triton/test_ssd.py): 300 sequences of 1-199 tokens
#: packed, 64 heads of 64, d_state 32, its groups
MAMBA_SSM_GROUPS = (1, 2, 8, 64)


def _mamba_inputs(batch, length, heads, headdim, dstate, groups, dtype, device, seed):
    gen = torch.Generator(device=device).manual_seed(seed)

    def rnd(*shape, scale=1.0, shift=0.0):
        return torch.randn(*shape, device=device, generator=gen) * scale + shift
    return dict(x=rnd(batch, length, heads, headdim).to(dtype), dt=rnd(batch, length, heads, shift=-1.0),
                A=-torch.exp(torch.rand(heads, device=device, generator=gen)),
                B=rnd(batch, length, groups, dstate, scale=dstate ** -0.5).to(dtype),
                C=rnd(batch, length, groups, dstate, scale=dstate ** -0.5).to(dtype),
                D=rnd(heads), z=rnd(batch, length, heads, headdim).to(dtype),
                dt_bias=rnd(heads, scale=0.5),
                initial_states=rnd(batch, heads, headdim, dstate))


def check_mamba(dtype, device, rows, meta, peer=None, *, cases=MAMBA_CASES, long: int = 2 ** 20,
                sequences: int = 300):
    """mamba_ssm's ``mamba_chunk_scan_combined`` through the drop-in against the float64 SSD
    (``reference.ssd_reference``, its recurrence): every argument (dt_bias, softplus, D, z,
    initial and final states) with y and every gradient (x, dt, A, B, C, D, z, dt_bias,
    initial_states) on ``MAMBA_CASES``; then mamba_ssm's test shape (packed sequences, each
    one's final state) for each of its group counts against the float64 operator, mamba_ssm's
    own Triton kernels beside it where ``peer`` is given (their error in ``note``); ``long``
    tokens stay finite. ``cases``, ``long``, ``sequences``: smaller for the CPU's test."""
    from ..compat import mamba_chunk_scan_combined
    from ..reference import ssd_reference
    tol = TOLERANCE[dtype] if dtype != torch.float32 else TF32_TOLERANCE
    # dt, A and dt_bias: dA and ddt_bias sum dg times dt over every row, whose exact sum is
    # small: rounding is amplified ~10⁴× at 2048 rows (the inputs' own bf16 rounding moves the
    # float64 dA by ~2e-3; float32 arithmetic, 1.5e-3 at 128 heads × 2048 rows on the H200).
    # Over 54 draws of "a group a head" in bf16 on the H200, dA's error had a median of 3.1e-3
    # here and 2.5e-3 in mamba_ssm's kernels, and two draws here and one there above 1e-2
    # (notes/gates.md): a draw can miss this bound in either
    gate_tol = SSD_PARAM_TOLERANCE[dtype]
    base = dict(meta, method="chunk-scan", abbr="mamba_chunk_scan_combined", language="triton",
                dtype=DTYPE_NAMES[dtype], precision="", decay=False, deterministic="")
    for label, batch, length, heads, headdim, dstate, groups in cases:
        start = len(rows)
        kw = _mamba_inputs(batch, length, heads, headdim, dstate, groups, dtype, device, start)
        got = {k: v.detach().clone().requires_grad_() for k, v in kw.items()}
        wide = {k: v.detach().double() for k, v in kw.items()}
        for k in SUMMED_OVER_ROWS:  # (a row each: their float64 gradients are each row's term)
            wide[k] = wide[k][None, None].expand(batch, length, heads).clone()
        wide = {k: v.requires_grad_() for k, v in wide.items()}
        case = dict(base, batch=batch, heads=heads, N=length, r=dstate, d=headdim,
                    note=f"{label}: {groups} groups; dt_bias, softplus, D, z, initial and final "
                         f"states; vs the float64 recurrence")
        try:
            y, h = mamba_chunk_scan_combined(**got, chunk_size=256, dt_softplus=True,
                                             return_final_states=True)
            wy, wh = ssd_reference(**wide, dt_softplus=True)
            gen = torch.Generator(device=device).manual_seed(len(rows) + 1)
            dy = torch.randn(wy.shape, device=device, generator=gen, dtype=torch.float64)
            dh = torch.randn(wh.shape, device=device, generator=gen, dtype=torch.float64)
            ga = torch.autograd.grad((y.double() * dy).sum() + (h.double() * dh).sum(),
                                     list(got.values()))
            gw = torch.autograd.grad((wy * dy).sum() + (wh * dh).sum(), list(wide.values()))
            terms = {k: w for k, w in zip(wide, gw) if k in SUMMED_OVER_ROWS}
            gw = [w.sum((0, 1)) if k in terms else w for k, w in zip(wide, gw)]
            results = [("y", y, wy, tol), ("final state", h, wh, tol)] + [
                (f"d{k}", a, w, gate_tol if k in ("dt", "A", "dt_bias") else tol)
                for k, a, w in zip(got, ga, gw)]
            theirs = _peer_errors(peer, kw, dy, dh, [w for _, _, w, _ in results])
            for (q, a, w, t), p_err in zip(results, theirs):
                rows.append(_judged(case, q, a, w, t, peer_rel_err=p_err))
                if q[1:] in terms:
                    rows[-1]["note"] += _against_terms(a, w, terms[q[1:]])
        except Exception as exc:
            rows.append(dict(case, quantity="mamba", rel_err=math.nan, status=_failed(exc)))
        _print_rows(rows, start, label, dtype)
    # 2^20 tokens (int32 offsets and long running sums): finite, the last rows exact (the decay
    # over the 20 rows before them makes what came earlier vanish)
    start, n = len(rows), long
    kw = _mamba_inputs(1, n, 2, 64, 64, 1, dtype, device, 20)
    tail = min(n, 300)
    lead = 20 if tail < n else 0  # (the rows whose state the tail's recurrence starts without)
    case = dict(base, batch=1, heads=2, N=n, r=64, d=64,
                note=f"{n} tokens: finite, the last {tail - lead} rows against the float64 "
                     f"recurrence")
    try:
        y, h = mamba_chunk_scan_combined(**{k: kw[k] for k in ("x", "dt", "A", "B", "C")},
                                         chunk_size=256, dt_softplus=True,
                                         return_final_states=True)
        wy, _ = ssd_reference(**{k: kw[k][:, -tail:] for k in ("x", "dt", "B", "C")}, A=kw["A"],
                              dt_softplus=True)
        row = _judged(case, "y", y[:, n - tail + lead:], wy[:, lead:], tol)
        if not bool(torch.isfinite(y).all() and torch.isfinite(h).all()):
            row["status"] = "FAIL"
        rows.append(row)
    except Exception as exc:
        rows.append(dict(case, quantity="mamba", rel_err=math.nan, status=_failed(exc)))
    _print_rows(rows, start, f"{n} tokens", dtype)
    gen = torch.Generator(device="cpu").manual_seed(300)
    lengths = torch.randint(1, 200, (sequences,), generator=gen)
    cu = torch.nn.functional.pad(lengths.cumsum(0), (1, 0)).to(device=device, dtype=torch.int32)
    total = int(lengths.sum())
    seq_idx = torch.repeat_interleave(torch.arange(sequences, device=device, dtype=torch.int32),
                                      lengths.to(device))[None]
    for groups in MAMBA_SSM_GROUPS:
        start = len(rows)
        kw = _mamba_inputs(1, total, 64, 64, 32, groups, dtype, device, groups)
        kw.update(A=-0.1 * torch.rand(64, device=device), z=None, D=None, dt_bias=None,
                  initial_states=None)
        case = dict(base, batch=sequences, heads=64, N=total, r=32, d=64,
                    note=f"mamba_ssm's test shape: {sequences} packed sequences, {groups} groups; "
                         f"vs the float64 operator")
        try:
            y, states = mamba_chunk_scan_combined(**kw, chunk_size=64, cu_seqlens=cu,
                                                  seq_idx=seq_idx, dt_softplus=True,
                                                  return_varlen_states=True)
            dt = torch.nn.functional.softplus(kw["dt"].double())
            q, k = (kw[n].double().transpose(1, 2) for n in ("C", "B"))  # (the oracle's groups)
            wy, ws = reference(q, k, (kw["x"].double() * dt[..., None]).transpose(1, 2),
                               g=(dt * kw["A"].double()).transpose(1, 2), cu_seqlens=cu,
                               output_final_state=True)
            wy, ws = wy.transpose(1, 2), ws.transpose(-1, -2)
            peer_note = ""
            if peer is not None:
                py, pstates = peer(**{n: kw[n] for n in ("x", "dt", "A", "B", "C")},
                                   chunk_size=64, cu_seqlens=cu, seq_idx=seq_idx,
                                   dt_softplus=True, return_varlen_states=True)
                peer_note = (f"; mamba_ssm's Triton kernels: y {rel_error(py, wy):.1e}, states "
                             f"{rel_error(pstates, ws):.1e}")
            for q_, a, w in (("y", y, wy), ("varlen states", states, ws)):
                rows.append(_judged(case, q_, a, w, tol, note=case["note"] + peer_note))
        except Exception as exc:
            rows.append(dict(case, quantity="mamba", rel_err=math.nan, status=_failed(exc)))
        _print_rows(rows, start, f"mamba_ssm test, {groups} groups", dtype)
        torch.cuda.empty_cache()


#: the SSD's parameters whose gradients sum a term a row (dA_h = Σ dt·dg over the head's rows)
SUMMED_OVER_ROWS = ("A", "dt_bias")


def _against_terms(got, want, terms) -> str:
    """The note for a gradient summed over rows (:data:`SUMMED_OVER_ROWS`): its error against
    the root-sum-square of its terms (``terms`` ``(batch, seqlen, heads)``, float64), where
    ‖want‖ is not smaller. A sum of random-signed terms comes out small at some draws, and a
    rounding of each term then weighs more in ‖got − want‖/‖want‖ than it does in the terms;
    this says how large the error is against the terms themselves (it is reported, not judged)."""
    scale = max(want.norm().item(), terms.square().sum((0, 1)).sqrt().norm().item())
    err = (got.double() - want).norm().item() / scale if scale > 0 else math.inf
    return f"; {err:.1e} against its terms' root-sum-square"


def _peer_errors(peer, kw, dy, dh, wanted) -> list:
    """mamba_ssm's own errors against the same float64 values (y, final state, then each
    gradient in ``kw``'s order), or NaNs without the peer (or where it raises)."""
    if peer is None:
        return [math.nan] * len(wanted)
    try:
        got = {k: v.detach().clone().requires_grad_() for k, v in kw.items()}
        y, h = peer(**got, chunk_size=256, dt_softplus=True, return_final_states=True)
        grads = torch.autograd.grad((y.double() * dy).sum() + (h.double() * dh).sum(),
                                    list(got.values()))
        return [rel_error(a, w) for a, w in zip([y, h, *grads], wanted)]
    except Exception as exc:  # (its own limits: reported as missing, never as ours)
        print(f"mamba_ssm: {_failed(exc)[:120]}", flush=True)
        return [math.nan] * len(wanted)


#: grouped cases (batch, heads, N, r, d, groups): Mamba-2's head shape (the Hopper kernel's
#: r = 128, d = 64, 8 heads a group) and r = d = 64 with 4 heads a group at an odd N
GROUP_SHAPES = [(2, 16, 1000, 128, 64, 2), (1, 8, 2049, 64, 64, 2)]


def check_groups(dtype, device, rows, meta):
    """B and C shared by groups of heads, read in place by Chunk: O, the final state and every
    gradient (B's and C's summed over each group's heads) against float64 autograd through the
    oracle, with γ alone (the backward's sweeps in the inputs' dtype, on the Hopper kernel where
    it takes them) and with per-token gates too (the exact-dg backward), states in and out."""
    m = next(x for x in methods() if x.abbr == "Chunk")
    tol = default_tolerance(m, dtype)
    for shape, gated in itertools.product(GROUP_SHAPES, (False, True)):
        batch, heads, n, r, d, groups = shape
        gen = torch.Generator(device=device).manual_seed(len(rows))
        B, C = (torch.randn(batch, groups, n, r, device=device, generator=gen) * r ** -0.5
                for _ in range(2))
        V = torch.randn(batch, heads, n, d, device=device, generator=gen)
        g = torch.nn.functional.logsigmoid(
            torch.randn(batch, heads, n, device=device, generator=gen) + 2)
        S0 = torch.randn(batch, heads, r, d, device=device, generator=gen)
        gamma = gammas(heads, len(rows)).to(device)
        base = dict(meta, method=m.name, abbr="Chunk", language=m.language,
                    dtype=DTYPE_NAMES[dtype], precision="", decay=True, batch=batch, heads=heads,
                    N=n, r=r, d=d, deterministic="",
                    note=f"B and C in {groups} groups read in place; γ"
                         + (" and per-token gates" if gated else "") + "; states in and out")
        start = len(rows)
        names = ["O", "S_N", "dB", "dC", "dV", "dS0"] + (["dg"] if gated else [])
        try:
            inputs = [t.to(dtype) for t in (B, C, V)] + [S0] + ([g] if gated else [])
            leaves = [t.detach().requires_grad_() for t in inputs]
            wide = [t.detach().double().requires_grad_() for t in leaves]
            o, s = causal_linear_decoder(*leaves[:3], gamma, initial_state=leaves[3],
                                         g=leaves[4] if gated else None,
                                         output_final_state=True, method="Chunk")
            wo, ws = reference(*wide[:3], gamma, initial_state=wide[3],
                               g=wide[4] if gated else None, output_final_state=True)
            dO = torch.randn(wo.shape, device=device, generator=gen, dtype=torch.float64)
            dS = torch.randn(ws.shape, device=device, generator=gen, dtype=torch.float64)
            got = [o, s] + list(torch.autograd.grad(
                (o.double() * dO).sum() + (s.double() * dS).sum(), leaves))
            want = [wo, ws] + list(torch.autograd.grad((wo * dO).sum() + (ws * dS).sum(), wide))
            for q, a, w in zip(names, got, want):
                rows.append(_judged(base, q, a, w, GATE_GRAD_TOLERANCE[dtype] if q == "dg"
                                    else tol))
        except Exception as exc:
            rows.append(dict(base, quantity="groups", rel_err=math.nan, status=_failed(exc)))
        _print_rows(rows, start, f"{shape} gates={gated}", dtype, "groups")
        torch.cuda.empty_cache()


def _judged(base: dict, quantity: str, got, want, tol: float, **extra) -> dict:
    """A row of ``base`` for ``quantity``: ``got``'s error against ``want`` (float64), passing
    within ``tol`` and finite."""
    err = rel_error(got, want)
    ok = err <= tol and bool(torch.isfinite(got).all())
    return dict(base, quantity=quantity, rel_err=err, tol=tol,
                max_abs_err=(got.double() - want).abs().max().item(),
                status="pass" if ok else "FAIL", **extra)


def _print_rows(rows, start, label, dtype, kind: str = "mamba"):
    print(f"{kind:30s} {DTYPE_NAMES[dtype]:9s} {label[:28]:28s} "
          + " ".join(f"{r['quantity']}={r['rel_err']:.1e}:{r['status'][:4]}"
                     + (f"(peer {r['peer_rel_err']:.0e})" if r.get('peer_rel_err') == r.get('peer_rel_err')
                        and r.get('peer_rel_err') is not None else "") for r in rows[start:]),
          flush=True)


def _arguments(p) -> None:
    p.add_argument("--methods", nargs="*", default=None, help="abbreviations (default: all)")
    p.add_argument("--huge", action="store_true", help="also batch 16 × 32 heads × N = 100000")
    p.add_argument("--quick", action="store_true", help="small shapes only")
    p.add_argument("--no-grads", action="store_true", help="forward only (no gradient rows)")
    p.add_argument("--grads-only", action="store_true", help="gradient rows only (no forward rows)")
    p.add_argument("--layouts-only", action="store_true",
                   help="the layout rows only (O and gradients in a model's layouts)")
    p.add_argument("--heads-only", action="store_true",
                   help="only the head shapes models use (HEAD_SHAPES): O with both masks, the "
                        "gradients with states in and out, time-major inputs")
    p.add_argument("--fp16-range", action="store_true",
                   help="also fp16 states past 65504 where O and the gradients fit (RANGE_CASES)")
    p.add_argument("--serving", action="store_true",
                   help="also packed prompts (cu_seqlens) and the decode step (Chunk, decode_step)")
    p.add_argument("--dtypes", nargs="*", choices=DTYPES, default=list(DTYPES),
                   help="the input dtypes checked (default: all three)")
    p.add_argument("--gates-only", action="store_true",
                   help="only the per-token gate rows (check_gated, check_fla_cases, "
                        "check_gate_edges)")
    p.add_argument("--mamba-only", action="store_true",
                   help="only the Mamba-2 drop-in's rows (check_mamba; mamba_ssm's Triton kernels "
                        "beside it where importable: $LEETREPRO_PEERS)")
    p.add_argument("--csv", default="correctness.csv")
    p.add_argument("--chunk-kernel", choices=("auto", "portable", "hopper"), default="auto",
                   help="Chunk's forward kernel where both can run (hopper: the warp-specialised "
                        "sm_90 kernel for every call it takes; the rows say which)")


class Case(typing.NamedTuple):
    """One case of the matrix: ``run(rows, meta)`` checks it and appends its rows (``status``
    ``pass``, ``FAIL …`` or, for a method marked unsafe, ``unsafe (reported, not judged)``)."""
    id: str
    group: str   # the method and dtype: the CSV is written as each group completes
    run: typing.Callable  # a check_* function with every argument but rows and meta
    shape: tuple

    @property
    def large(self) -> bool:
        """Whether the case needs gigabytes of GPU memory (batch · heads · N ≥ 2¹⁷ rows: its
        oracle, Vanilla's N × N scores, the gradients' float64 autograd): ``pytest -m gpu`` in
        several processes runs these one at a time."""
        return self.shape[0] * self.shape[1] * self.shape[2] >= 2 ** 17


#: the quick matrix's gated shapes for Chunk's Hopper kernel (forced): Mamba-2's head shape and
#: 64 × 64 over 10000 rows
QUICK_GATED_HOPPER_SHAPES = [(2, 16, 2048, 128, 64), (1, 2, 10000, 64, 64)]


def _hopper_forced(check, *args, **kw):
    """``check(*args, **kw)`` with Chunk's Hopper kernel forced wherever it can run
    (:func:`leetrepro.methods.chunk.force_kernel`), the table followed again after."""
    from ..methods.chunk import force_kernel
    force_kernel("hopper")
    try:
        return check(*args, **kw)
    finally:
        force_kernel(None)


def _narrow(dc: int) -> tuple:
    """``check_case``'s ``extra`` for the Hopper kernel at ``dc`` value columns a program."""
    return f"DC{dc}", dict(kernel="hopper", config={"DC": dc})


def _shape_id(shape) -> str:
    b, h, n, r, d = shape
    return f"B{b}-H{h}-N{n}-r{r}-d{d}"


def matrix(chosen, dtypes, device, *, quick=False, heads_only=False, layouts_only=False,
           grads_only=False, no_grads=False, huge=False, fp16_range=False,
           hopper_heads=False, gates_only=False) -> list[Case]:
    """The correctness matrix as a list of cases, in the order ``make gpu-check`` runs them (the
    command line's options by the same names); ``pytest -m gpu`` (``tests/test_gpu.py``) runs the
    same list. ``hopper_heads``: with ``quick``, Chunk's Hopper kernel (forced) at two head shapes
    models use, O both masks and its fewest value columns, so that a quick matrix reaches it."""
    P = functools.partial
    out = []

    def add(m, dtype, what, shape, fn, *args, **kw):
        out.append(Case(f"{m.abbr}-{DTYPE_NAMES[dtype]}-{what}-{_shape_id(shape)}",
                        f"{m.abbr}-{DTYPE_NAMES[dtype]}", P(fn, *args, **kw), tuple(shape)))

    shapes = SHAPES[:3] if quick else SHAPES
    for m in chosen:
        for dtype in dtypes:
            if not m.supports(dtype, device):
                continue
            if m.gates and not (heads_only or layouts_only) and not m.unsafe:
                _gated_cases(add, m, dtype, device, quick)
            if gates_only:
                continue
            if heads_only:
                if not m.unsafe:
                    for si, shape in enumerate(HEAD_SHAPES):
                        for decay in (False, True):
                            add(m, dtype, f"O-decay{decay:d}", shape, check_case, m, shape, dtype,
                                decay, device, 1100 + 10 * si + decay)
                        add(m, dtype, "grads", shape, check_grads, m, shape, dtype, True, device,
                            1200 + si)
                        add(m, dtype, "grads-time-major", shape, check_grads, m, shape, dtype, True,
                            device, 1300 + si, time_major=True)
                        narrow = narrow_hopper_columns(m, shape, dtype, device)
                        if narrow:  # the Hopper kernel with fewer value columns a program
                            add(m, dtype, f"O-DC{narrow}", shape, check_case, m, shape, dtype, True,
                                device, 1400 + si, extra=_narrow(narrow))
                continue
            if layouts_only:
                if not m.unsafe:
                    for si, shape in enumerate(LAYOUT_SHAPES):
                        add(m, dtype, "layouts", shape, check_layouts, m, shape, dtype, device,
                            970 + si)
                continue
            for si, shape in enumerate([] if grads_only else shapes):
                if m.name == "vanilla" and shape[2] > QUADRATIC_MAX_N:
                    continue  # O(N²) memory: not part of the matrix for this method
                for decay in (False, True):
                    add(m, dtype, f"O-decay{decay:d}", shape, check_case, m, shape, dtype, decay,
                        device, 100 * si + decay)
            if quick and hopper_heads and not grads_only:
                for si, shape in enumerate(QUICK_GATED_HOPPER_SHAPES):
                    if dtype != torch.float32 and narrow_hopper_columns(m, shape, dtype, device):
                        # (the gated backward's sweeps carrying dg's pieces on the Hopper kernel)
                        add(m, dtype, "gates-hopper", shape, _hopper_forced, check_gated, m,
                            shape, dtype, True, device, 2300 + si)
                for si, shape in enumerate(QUICK_HOPPER_SHAPES):
                    narrow = narrow_hopper_columns(m, shape, dtype, device)
                    if narrow is None:
                        continue  # not Chunk, or no sm_90 here
                    for decay in (False, True):
                        add(m, dtype, f"O-hopper-decay{decay:d}", shape, check_case, m, shape, dtype,
                            decay, device, 1500 + 10 * si + decay,
                            extra=("hopper", dict(kernel="hopper")))
                    add(m, dtype, f"O-DC{narrow}", shape, check_case, m, shape, dtype, True, device,
                        1550 + si, extra=_narrow(narrow))
            if huge and not grads_only and m.language in ("triton", "cuda") and not m.unsafe \
                    and dtype == torch.float16:
                add(m, dtype, "huge", HUGE, check_huge, m, dtype, device)
            if not no_grads and not m.unsafe:
                for si, shape in enumerate(GRAD_SHAPES[:2] if quick else GRAD_SHAPES):
                    if m.abbr == "Cdotp_torch" and shape[2] > 4097:
                        continue  # one Python step per token, three times: minutes per case
                    for decay, exact in itertools.product((False, True), exact_modes(m, dtype)):
                        add(m, dtype, f"grads-decay{decay:d}{'-exact' * exact}", shape, check_grads, m,
                            shape, dtype, decay, device, 500 + 10 * si + decay, exact=exact)
                for wanted in frozen_subsets(m):
                    add(m, dtype, f"grads-{wanted}", GRAD_SHAPES[1], check_grads, m, GRAD_SHAPES[1],
                        dtype, True, device, 900, wanted=wanted)
                for si, shape in enumerate([] if quick else TIME_MAJOR_GRAD_SHAPES):
                    add(m, dtype, "grads-time-major", shape, check_grads, m, shape, dtype, True,
                        device, 950 + si, time_major=True)
                for si, shape in enumerate(LAYOUT_SHAPES[:1] if quick else LAYOUT_SHAPES):
                    add(m, dtype, "layouts", shape, check_layouts, m, shape, dtype, device, 970 + si)
            if fp16_range and dtype == torch.float16 and m.language == "triton" and not m.unsafe:
                for (si, shape), case, decay in itertools.product(
                        enumerate(RANGE_SHAPES), RANGE_CASES, (False, True)):
                    add(m, dtype, f"range-{RANGE_CASES.index(case)}-decay{decay:d}", shape, check_grads,
                        m, shape, dtype, decay, device, 700 + 10 * si + decay, magnitudes=case)
    return out


def _gated_cases(add, m, dtype, device, quick: bool) -> None:
    """The gated rows of ``m`` (:func:`check_gated`): a method with a state every gradient,
    batched and packed, gates alone and with γ, time-major at the model shapes; the others O."""
    shapes = GATE_SHAPES[:2] if quick else GATE_SHAPES
    if m.name == "vanilla" or not m.state:
        for si, shape in enumerate(shapes[:2] if m.language == "torch" else shapes):
            add(m, dtype, "gates-O", shape, check_gated, m, shape, dtype, True, device,
                2000 + si, forward_only=True)
        return
    for si, shape in enumerate(shapes):
        if m.language == "torch" and shape[2] > 4097:
            continue  # (float64 autograd of a PyTorch method at 10⁴ rows: minutes)
        for with_gamma, packed in ((False, False), (True, False), (True, True)):
            add(m, dtype, f"gates-gamma{with_gamma:d}-packed{packed:d}", shape, check_gated, m,
                shape, dtype, with_gamma, device, 2100 + 10 * si + 2 * with_gamma + packed,
                packed=packed)
        if shape[3] >= 64 and not quick:
            add(m, dtype, "gates-time-major", shape, check_gated, m, shape, dtype, True, device,
                2200 + si, time_major=True)


def judged_failures(rows) -> list[dict]:
    """The rows that fail (``status`` starting ``FAIL``; an unsafe method's rows are reported,
    not judged)."""
    return [r for r in rows if str(r.get("status", "")).startswith("FAIL")]


def main(argv=None) -> int:
    import pandas as pd

    args, setup = gpu_main("gpu_check", __doc__, argv, _arguments, output="correctness.csv")
    if setup is None:
        return 2
    device, meta, out = setup
    if args.chunk_kernel != "auto":
        from ..methods import chunk
        chunk.force_kernel(args.chunk_kernel)
    meta = dict(meta, chunk_kernel=args.chunk_kernel)
    chosen = [m for m in methods() if args.methods is None or m.abbr in args.methods]
    def keep(rows):  # (a cut run keeps the rows of each group it completed)
        pd.DataFrame(rows).to_csv(os.path.join(out, args.csv), index=False)
    if args.mamba_only:
        from .harness import mamba_ssm_peer
        peer, rows = mamba_ssm_peer(), []
        for dtype in map(parse_dtype, args.dtypes):
            for check in (functools.partial(check_mamba, peer=peer), check_groups):
                t0 = time.perf_counter()
                check(dtype, device, rows, meta)
                keep(rows)  # (the long-sequence case alone can take minutes: keep what ran)
                print(f"({len(rows)} rows, {time.perf_counter() - t0:.0f} s)", flush=True)
        return _report(rows, out, args.csv)
    cases = matrix(chosen, [parse_dtype(x) for x in args.dtypes], device, quick=args.quick,
                   heads_only=args.heads_only, layouts_only=args.layouts_only,
                   grads_only=args.grads_only, no_grads=args.no_grads, huge=args.huge,
                   fp16_range=args.fp16_range, gates_only=args.gates_only)
    rows = []
    for i, case in enumerate(cases):
        case.run(rows=rows, meta=meta)
        if i + 1 == len(cases) or cases[i + 1].group != case.group:
            keep(rows)
    if not (args.heads_only or args.layouts_only):  # gates: the drop-ins' cases, the edges
        from .harness import mamba_ssm_peer
        peer = mamba_ssm_peer()
        for dtype in map(parse_dtype, args.dtypes):
            check_fla_cases(dtype, device, rows, meta)
            check_gate_edges(dtype, device, rows, meta)
            check_mamba(dtype, device, rows, meta, peer)
            check_groups(dtype, device, rows, meta)
            keep(rows)
    if args.serving:
        for dtype in map(parse_dtype, args.dtypes):
            for decay in (False, True):
                check_serving(dtype, decay, device, rows, meta)
            keep(rows)
    return _report(rows, out, args.csv)


def _report(rows, out, csv) -> int:
    """The rows written to ``out/csv``; the failures printed; the exit status."""
    import pandas as pd
    df = pd.DataFrame(rows)
    df.to_csv(os.path.join(out, csv), index=False)
    failed = df[df.status.str.startswith("FAIL")]
    print(f"\n{len(df)} cases, {len(failed)} failed -> {out}/{csv}")
    if len(failed):
        print(failed[["abbr", "dtype", "precision", "quantity", "decay", "batch", "heads", "N", "r",
                      "d", "rel_err", "status"]].to_string())
    return 1 if len(failed) else 0


if __name__ == "__main__":
    sys.exit(main())
