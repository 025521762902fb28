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
from .._inputs import DTYPE_NAMES, parse_dtype
from ..methods import methods
from ..reference import TF32_TOLERANCE, TOLERANCE
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


def _narrow(dc: int) -> tuple:
    """``check_case``'s ``extra`` for the Hopper kernel at ``dc`` value columns a program."""
    return f"DC{dc}", dict(kernel="hopper", config={"DC": dc})


def _shape_id(shape) -> str:
    b, h, n, r, d = shape
    return f"B{b}-H{h}-N{n}-r{r}-d{d}"


def matrix(chosen, dtypes, device, *, quick=False, heads_only=False, layouts_only=False,
           grads_only=False, no_grads=False, huge=False, fp16_range=False,
           hopper_heads=False) -> list[Case]:
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
    cases = matrix(chosen, [parse_dtype(x) for x in args.dtypes], device, quick=args.quick,
                   heads_only=args.heads_only, layouts_only=args.layouts_only,
                   grads_only=args.grads_only, no_grads=args.no_grads, huge=args.huge,
                   fp16_range=args.fp16_range)
    rows = []
    for i, case in enumerate(cases):
        case.run(rows=rows, meta=meta)
        if i + 1 == len(cases) or cases[i + 1].group != case.group:
            pd.DataFrame(rows).to_csv(os.path.join(out, args.csv), index=False)  # a cut run keeps its rows
    if args.serving:
        for dtype in map(parse_dtype, args.dtypes):
            for decay in (False, True):
                check_serving(dtype, decay, device, rows, meta)
    df = pd.DataFrame(rows)
    df.to_csv(os.path.join(out, args.csv), index=False)
    failed = df[df.status.str.startswith("FAIL")]
    print(f"\n{len(df)} cases, {len(failed)} failed -> {out}/{args.csv}")
    if len(failed):
        print(failed[["abbr", "dtype", "precision", "quantity", "decay", "batch", "heads", "N", "r",
                      "d", "rel_err", "status"]].to_string())
    return 1 if len(failed) else 0


if __name__ == "__main__":
    sys.exit(main())
