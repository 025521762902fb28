"""The other papers, measured: ECA against the standard products, the kernel paper's normalised
linear attention against its baselines, the blog's methods through the operator against their
direct forms. ``python -m leetrepro.bench.related --out DIR [--parts eca kernel blog]
[--device cpu|cuda]`` writes, with provenance on every row:

* ``eca.csv``: forward time (0-1 mask, fp32, medians of interleaved rounds) of ``ECA`` (depth 0
  and 1), ``standard`` (the lower-triangular products computed directly: the paper's
  ``L²d/2`` baseline, :func:`leetrepro.methods.eca.forward` at depth −1) and ``Vanilla`` (full
  products, the upper triangle masked: what ``torch.matmul(...).tril_()`` does) over N;
  ``eca_errors.csv``: ‖out − ref‖/‖ref‖ and the largest error against float64, per dtype, with the
  arithmetic in the method's accumulation dtype (``accumulate``) and in the dtype itself
  (``in-dtype``, the paper's Tables 3-4); ``eca_stages.csv`` (GPU): each stage alone at the
  paper's Table 1-2 shapes (L = 8192, d = 4096 and 8192, fp32) beside ``torch.matmul``.
* ``kernel_paper_layer.csv``: one attention layer's mixer (time-major ``(b, N, h, d)`` as a model
  hands it), forward and forward + backward, time (eager, ``median_s``, and on a GPU replayed
  from a CUDA graph, ``graph_s``: the GPU's work without the host's) and peak memory above
  the inputs: this
  project's ``normalized_linear_attention`` (1 + x, rows of q and k normalised inside),
  flash-linear-attention's ``chunk_gla`` (the paper's baseline, Gated Linear Attention) and
  ``chunk_linear_attn`` (its normalised linear attention), softmax attention
  (``scaled_dot_product_attention``, causal), this project's layer again with its forward as
  the operator and passes around it (``PASSES``; the ``passes`` column says what ran for each of
  this project's layers), and the same layer with the operator in place of normalised
  attention (``OPERATOR``, γ = 1: the time the normaliser's cost is judged against), and the
  blog's Linear Transformer on the same kernels (``LINEAR_TRANSFORMER``, ``elu + 1``: what fla's
  ``chunk_linear_attn`` entry computes);
  ``kernel_paper_lm.csv``: a training step (forward, backward, fused AdamW; bf16 parameters) of
  a decoder language model of the paper's 1.4B size with each mixer.
* ``related_methods.csv``: each reducible method of the blog through the operator against its
  own direct form (time and error against float64).
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

from .. import related
from ..api import causal_linear_decoder
from .._device import gpu_tag
from ..methods import eca
from ..models.decoder import DecoderLM
from ..reference import reference, rel_error
from .harness import (failed_status, interleaved_medians, peak_above, provenance, sync,
                      timed_entries)

SEQLENS = {"cuda": (1024, 2048, 4096, 8192, 16384), "cpu": (512, 1024, 2048, 4096)}
#: (batch, heads, head dim, N) of the kernel paper's layer cells, and its language model
LAYER_CELLS = ((2, 16, 128, 4096), (2, 16, 128, 16384))
LM = dict(vocab=32000, dim=2048, layers=24, heads=16, mlp=5632, batch=2, seq=4096)
MIXERS = ("leetrepro (1+x)", "fla chunk_gla", "fla chunk_linear_attn", "softmax (SDPA)")
#: the layer's entries: the mixers (this project's as users call it: its forward one sweep of
#: Chunk's portable kernel where ``methods.normalizer.IN_SWEEP`` allows, the default), this
#: project's layer with its forward as the operator and the passes around it (``IN_SWEEP`` off
#: for its calls; the ``passes`` column says what ran for each)
PASSES = "leetrepro (1+x) passes"
#: the same layer with the operator in place of normalised attention (rows of q and k
#: normalised, γ = 1, no denominator): what the normaliser's cost is judged against
OPERATOR = "leetrepro operator (γ = 1)"
#: the blog's Linear Transformer (``elu + 1`` features, c = 0) on the same kernels: what fla's
#: ``chunk_linear_attn`` entry computes
LINEAR_TRANSFORMER = "leetrepro linear transformer (elu+1)"
LAYER_ENTRIES = MIXERS + (PASSES, OPERATOR, LINEAR_TRANSFORMER)


def _timed(fns: dict, reps: int, device, seed: int = 0) -> dict:
    """Median seconds per entry, ``fns`` called in turn (each round its own order); an entry that
    raises gives its status instead and the others are still timed."""
    ok, status = {}, {}
    for k, fn in fns.items():
        try:
            fn()
            sync(device)
            ok[k] = fn
        except Exception as err:  # noqa: BLE001  (one failing entry is a row, never an abort)
            status[k] = failed_status(err)
            if device.type == "cuda":
                torch.cuda.empty_cache()
    times = interleaved_medians(ok, [()], reps, device, shuffle=True, seed=seed) if ok else {}
    return {k: (times.get(k), status.get(k, "ok")) for k in fns}


# ECA ----------------------------------------------------------------------------------------

def measure_eca(device, seqlens, heads: int = 1, r: int = 64, d: int = 64, reps: int = 5):
    rows = []
    for i, n in enumerate(seqlens):
        gen = torch.Generator(device=device).manual_seed(n)
        b, c, v = (torch.randn(1, heads, n, k, generator=gen, device=device) for k in (r, r, d))
        fns = {"ECA": lambda: eca.forward(b, c, v, None, 0),
               "ECA depth 1": lambda: eca.forward(b, c, v, None, 1),
               "standard": lambda: eca.forward(b, c, v, None, -1),
               "Vanilla": lambda: torch.tril(b @ c.transpose(-1, -2)) @ v}
        for entry, (t, status) in _timed(fns, reps, device, seed=i).items():
            rows.append(dict(entry=entry, N=n, heads=heads, r=r, d=d, dtype="fp32", reps=reps,
                             median_s=t, status=status))
        print(f"eca N={n}: " + ", ".join(f"{r['entry']} {r['median_s'] or float('nan'):.4g} s"
                                         for r in rows[-4:]), flush=True)
    return rows


def measure_eca_errors(device, n: int = 1024, heads: int = 4, r: int = 64, d: int = 64):
    """Error against float64 of ECA and of the standard product, per dtype, two ways."""
    from .harness import random_inputs
    rows = []
    b64, c64, v64 = random_inputs(1, heads, n, r, d, dtype=torch.float64, device=device, seed=1,
                                  scale_bc=True)
    ref = reference(b64, c64, v64)
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        b, c, v = (t.to(dtype) for t in (b64, c64, v64))
        cd = torch.float32
        cases = {("ECA", "accumulate"): lambda: eca.forward(b.to(cd), c.to(cd), v.to(cd), None, 0),
                 ("standard", "accumulate"): lambda: eca.forward(b.to(cd), c.to(cd), v.to(cd), None, -1),
                 ("ECA", "in-dtype"): lambda: eca.forward(b, c, v, None, 0),
                 ("standard", "in-dtype"): lambda: eca.forward(b, c, v, None, -1)}
        for (entry, arithmetic), fn in cases.items():
            try:
                out = fn().to(dtype)
                err = (out.double() - ref).abs()
                rows.append(dict(entry=entry, arithmetic=arithmetic, dtype=str(dtype)[6:], N=n,
                                 heads=heads, r=r, d=d, rel_error=rel_error(out, ref),
                                 max_abs_error=err.max().item(), mean_abs_error=err.mean().item(),
                                 status="ok"))
            except (RuntimeError, NotImplementedError) as e:  # a dtype a CPU cannot multiply
                rows.append(dict(entry=entry, arithmetic=arithmetic, dtype=str(dtype)[6:], N=n,
                                 heads=heads, r=r, d=d, status=failed_status(e)))
    return rows


#: (L, d) of the stage-level comparison: the paper's Tables 1-2 on a GPU, smaller on a CPU
STAGE_SHAPES = {"cuda": ((8192, 4096), (8192, 8192)), "cpu": ((2048, 2048), (4096, 4096))}


def measure_eca_stages(device, reps: int = 10):
    """Each stage alone against the standard lower-triangular product and ``torch.matmul`` (fp32,
    one matrix), at :data:`STAGE_SHAPES`:
    where d is large the block products are compute-bound, the regime the paper measured."""
    rows = []
    for i, (n, k) in enumerate(STAGE_SHAPES[device.type]):
        gen = torch.Generator(device=device).manual_seed(k)
        x, y, w = (torch.randn(n, k, generator=gen, device=device) for _ in range(3))
        p = torch.tril(torch.rand(n, n, generator=gen, device=device))
        fns = {("I", "ECA"): lambda: eca.stage1(x, y),
               ("I", "standard"): lambda: eca.tri_scores(x, y),
               ("I", "torch.matmul(Q, K.t()).tril_()"): lambda: torch.matmul(x, y.t()).tril_(),
               ("II", "ECA"): lambda: eca.stage2(p, w),
               ("II", "standard"): lambda: eca.tri_times(p, w),
               ("II", "torch.matmul(P, V)"): lambda: torch.matmul(p, w)}
        for (stage, entry), (t, status) in _timed(fns, reps, device, seed=i).items():
            rows.append(dict(stage=stage, entry=entry, L=n, d=k, dtype="fp32", reps=reps,
                             median_s=t, status=status))
        print(f"eca stages L={n} d={k} ({i + 1}/{len(STAGE_SHAPES[device.type])}): "
              + ", ".join(f"{r['stage']} {r['entry']} {r['median_s'] or float('nan'):.4g} s"
                          for r in rows[-len(fns):]), flush=True)
    return rows


# the kernel paper ---------------------------------------------------------------------------

def _fla(name):
    try:
        if name == "gla":
            from fla.ops.gla import chunk_gla
            return chunk_gla
        from fla.ops.linear_attn import chunk_linear_attn
        return chunk_linear_attn
    except ImportError:
        return None


def mixer(name: str):
    """``mix(q, k, v, g) -> o`` on time-major ``(b, N, h, d)`` tensors (g: GLA's log gates), or
    None where the peer is not installed."""
    def ours(q, k, v, g):
        o = related.normalized_linear_attention(q.transpose(1, 2), k.transpose(1, 2),
                                                v.transpose(1, 2), normalize_rows=True)
        return o.transpose(1, 2)

    def sdpa(q, k, v, g):
        o = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        return o.transpose(1, 2)

    if name == MIXERS[0]:
        return ours
    if name == PASSES:
        return _sweep(ours, False)
    if name == LINEAR_TRANSFORMER:
        return lambda q, k, v, g: related.linear_transformer(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)).transpose(1, 2)
    if name == OPERATOR:
        return lambda q, k, v, g: causal_linear_decoder(
            related.normalize_rows(q).transpose(1, 2), related.normalize_rows(k).transpose(1, 2),
            v.transpose(1, 2)).transpose(1, 2)
    if name == MIXERS[3]:
        return sdpa
    fn = _fla("gla" if "gla" in name else "linear")
    if fn is None:
        return None
    if "gla" in name:
        return lambda q, k, v, g: fn(q, k, v, g, scale=q.shape[-1] ** -0.5)[0]
    phi = related.FEATURE_MAPS["elu+1"]
    return lambda q, k, v, g: fn(phi(q), phi(k), v, scale=1.0, normalize=True)[0]


def _sweep(fn, on: bool):
    """``fn`` called with the layer's forward as one sweep or not (``normalizer.IN_SWEEP``)."""
    from ..methods import normalizer

    def call(*args):
        old, normalizer.IN_SWEEP = normalizer.IN_SWEEP, on
        try:
            return fn(*args)
        finally:
            normalizer.IN_SWEEP = old
    return call


def passes(device, dtype=torch.bfloat16) -> str:
    """What computes the normaliser's passes around the operator for this project's entry on
    ``device``: ``kernels`` (:mod:`leetrepro.methods.normalizer`) or PyTorch's ``composition``
    (a row column, so that a verdict says what it judged)."""
    from ..methods.normalizer import on_kernels
    probe = torch.empty(1, 1, 1, 1, device=device, dtype=dtype)
    return "kernels" if on_kernels(probe, probe) else "composition"


def _passes_of(entry: str, device, dtype, layer: tuple | None = None) -> str | None:
    """What ran around (or instead of) the operator for this project's layer entries: the
    forward's ``sweep`` or :func:`passes`'s answer, and ``+sweeps`` where the backward ran in
    Chunk's sweeps too (:func:`leetrepro.methods.normalizer.grads_in_sweeps` of the layer's
    ``(q, k, v)``, time-major, as :func:`mixer` hands them over; the Linear Transformer's
    backward is the operator's)."""
    if entry not in (MIXERS[0], PASSES, LINEAR_TRANSFORMER):
        return None
    from ..methods import normalizer
    probe = torch.empty(1, 1, 1, 1, device=device, dtype=dtype)
    taken = _sweep(lambda: normalizer.in_sweep(probe, probe, probe, "auto", {}),
                   entry != PASSES)()
    forward = "sweep" if taken else passes(device, dtype)
    if layer is None or entry == LINEAR_TRANSFORMER:
        return forward
    q, k, v = layer
    rows = (related.normalize_rows(t.transpose(1, 2)) for t in (q, k))
    return forward + ("+sweeps" if normalizer.grads_in_sweeps(*rows, v.transpose(1, 2)) else "")


def measure_layer(device, cells=LAYER_CELLS, reps: int = 10, dtype=torch.bfloat16,
                  on_cell=None):
    """The kernel paper's attention layer at each of ``cells`` ``(batch, heads, head_dim, N)``
    (time-major ``dtype`` q, k, v; float32 per-key log gates for GLA): a row per entry of
    :data:`LAYER_ENTRIES` and pass (forward; forward + backward), eager and replayed from a CUDA
    graph, with its peak memory above the inputs. ``on_cell(rows so far)`` after each cell."""
    rows = []
    for i, (batch, heads, dh, n) in enumerate(cells):
        gen = torch.Generator(device=device).manual_seed(n)
        q, k, v = (torch.randn(batch, n, heads, dh, generator=gen, device=device, dtype=dtype)
                   .requires_grad_() for _ in range(3))
        g = torch.nn.functional.logsigmoid(torch.randn(batch, n, heads, dh, generator=gen,
                                                       device=device)).div(16).requires_grad_()
        do = torch.randn_like(v)
        fwd, step = {}, {}
        for name in LAYER_ENTRIES:
            mix = mixer(name)
            if mix is None:
                continue
            fwd[name] = lambda mix=mix: mix(q, k, v, g)
            step[name] = lambda mix=mix: torch.autograd.grad(mix(q, k, v, g), (q, k, v, g), do,
                                                             allow_unused=True)
        for mode, fns in (("fwd", fwd), ("fwd+bwd", step)):
            if any(name.startswith("fla") for name in fns):  # (minutes of silence otherwise)
                print(f"layer N={n} {mode}: timing {len(fns)} entries; fla autotunes its kernels "
                      "on their first call, several minutes a shape on a fresh host (kept on "
                      "disk for the host's later runs)", flush=True)
            for name, (t, graph, status, why) in _timed_eager_and_graph(fns, reps, device,
                                                                        i).items():
                peak = None
                if status == "ok" and device.type == "cuda":
                    peak = peak_above(fns[name], device)[1]
                rows.append(dict(entry=name, mode=mode, batch=batch, heads=heads, head_dim=dh, N=n,
                                 dtype=str(dtype)[6:], reps=reps, median_s=t, graph_s=graph,
                                 peak_bytes=peak, status=status, graph_status=why,
                                 passes=_passes_of(name, device, dtype, (q, k, v))))
        print(f"layer b{batch} h{heads} d{dh} N={n} (eager / graph s): " + ", ".join(
            f"{r['entry']} {r['mode']} {r['median_s'] or float('nan'):.4g} / "
            f"{r['graph_s'] or float('nan'):.4g}" for r in rows[-2 * len(fwd):]), flush=True)
        if on_cell is not None:  # (the rows so far written: a run cut short keeps its cells)
            on_cell(rows)
    return rows


def _timed_eager_and_graph(fns: dict, reps: int, device, seed: int) -> dict:
    """``{entry: (eager median s, CUDA-graph median s, status, the graph's status)}``: on a GPU
    both (:func:`harness.timed_entries`; a capture that fails leaves its time None and says why
    in the last), elsewhere eager alone (no graph: both None)."""
    if device.type != "cuda":
        return {k: (t, None, status, None)
                for k, (t, status) in _timed(fns, reps, device, seed).items()}
    times, status = timed_entries(fns, (), reps, device, seed=seed)
    return {k: (times["eager"].get(k), times["graph"].get(k), status.get(k, "ok"),
                status.get(k + "/graph")) for k in fns}


def measure_lm(device, config=LM, steps: int = 5, warmup: int = 2, mixers=MIXERS):
    """ms per training step and its peak memory, one model per mixer of ``mixers`` (built,
    timed, freed)."""
    rows = []
    gen = torch.Generator(device=device).manual_seed(0)
    ids = torch.randint(0, config["vocab"], (config["batch"], config["seq"] + 1), generator=gen,
                        device=device)
    for name in mixers:
        inner = mixer(name)
        if inner is None:
            continue
        seen = []  # (the first layer call's q, k, v: what its label is asked of)

        def mix(q, k, v, g, inner=inner, seen=seen):
            if not seen:
                seen.append((q.detach(), k.detach(), v.detach()))
            return inner(q, k, v, g)
        model = opt = None
        try:
            torch.manual_seed(0)
            with torch.device(device):  # (initialised in place: 1.4B parameters on a host are slow)
                model = DecoderLM(mix, gates="key" if "gla" in name else None,
                                  **config).to(torch.bfloat16)
            opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")
            params = sum(p.numel() for p in model.parameters())

            def step():
                logits = model(ids[:, :-1])
                loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1),
                                                         ids[:, 1:].flatten())
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
            for _ in range(warmup):
                step()
            peak = peak_above(step, device)[1] if device.type == "cuda" else None
            times = interleaved_medians({name: step}, [()], steps, device, warmup=0)
            rows.append(dict(entry=name, params=params, median_s=times[name], peak_bytes=peak,
                             status="ok",
                             passes=_passes_of(name, device, torch.bfloat16, seen[0])))
            seen.clear()
        except Exception as err:  # noqa: BLE001  (a peer that fails is a row)
            rows.append(dict(entry=name, status=failed_status(err)))
        finally:
            model = opt = None  # (freed before the next mixer's model is built)
            if device.type == "cuda":
                torch.cuda.empty_cache()
        print(f"lm {name}: {rows[-1].get('median_s')} s, {rows[-1]['status'][:60]}", flush=True)
    return [dict(r, **{k: v for k, v in config.items()}, steps=steps) for r in rows]


# the blog -----------------------------------------------------------------------------------

#: (batch, heads, N, head dim) of the attentions and (T, channels) of WKV and AFT in
#: :func:`measure_blog`, per device type
BLOG_SHAPES = {"cpu": ((1, 4, 1024, 32), (256, 64)), "cuda": ((2, 8, 2048, 64), (1024, 256))}


def measure_blog(device, reps: int = 5, shapes=None):
    """Each reducible method through the operator against its direct form: time, and error of
    each against the direct form in float64 (``shapes``: as :data:`BLOG_SHAPES`' values)."""
    (b, h, n, dh), (t, dim) = shapes or BLOG_SHAPES[device.type]
    gen = torch.Generator(device=device).manual_seed(0)

    def rnd(*shape):
        return torch.randn(*shape, generator=gen, device=device)
    unit = lambda x: x / x.norm(dim=-1, keepdim=True)  # noqa: E731
    qkv = (unit(rnd(b, h, n, dh)), unit(rnd(b, h, n, dh)), rnd(b, h, n, dh))
    w, u, kk, vv, qq = rnd(dim), rnd(dim), rnd(b, t, dim), rnd(b, t, dim), rnd(b, t, dim)
    cases = (
        ("normalised linear attention, f(x) = 1 + x (kernel paper)", "B = [1, q], C = [1, k], "
         "V = [v, 1], γ = 1 (split: op(q, k, v) + cumsum)", qkv,
         related.normalized_linear_attention, related.normalized_direct, "quadratic definition"),
        ("Linear Transformer / Performer (elu + 1 features)", "B = φ(q), C = φ(k), V = [v, 1], "
         "γ = 1", qkv, related.linear_transformer, related.linear_transformer_direct,
         "running sums of φ(k) vᵀ"),
        ("RWKV WKV", "per channel a head: B = 1, C = e^k, V = [v, 1], γ = exp(−e^w), r = 1; "
         "bonus e^(u+k) v elementwise", (w, u, kk, vv), related.wkv, related.wkv_quadratic,
         "parallel T × T form"),
        ("RWKV WKV", "(as above)", (w, u, kk, vv), related.wkv, related.wkv_direct,
         "recurrence, one step per token"),
        ("AFT-simple", "per channel a head: B = 1, C = e^k, V = [v, 1], γ = 1, r = 1",
         (qq, kk, vv), related.aft_simple, related.aft_simple_direct, "running sums"),
    )
    rows = []
    for i, (method, reduction, args, through, direct, direct_name) in enumerate(cases):
        ref = direct(*(a.double() for a in args))
        out = through(*args)
        err = rel_error(out, ref)
        direct_err = rel_error(direct(*args), ref)
        times = _timed({"operator": lambda: through(*args), "direct": lambda: direct(*args)},
                       reps, device, seed=i)
        shape = dict(batch=b, heads=h, N=n, head_dim=dh) if args is qkv else \
            dict(batch=b, N=t, channels=dim)
        for entry, (sec, status) in times.items():
            rows.append(dict(method=method, reduction=reduction, entry=entry,
                             form="operator (method='auto')" if entry == "operator" else direct_name,
                             rel_error=err if entry == "operator" else direct_err, dtype="fp32",
                             median_s=sec, status=status, reps=reps, **shape))
        print(f"blog {method} vs {direct_name}: error {err:.1e}, " + ", ".join(
            f"{k} {v[0] or float('nan'):.4g} s" for k, v in times.items()), flush=True)
    return rows


PARTS = ("eca", "kernel", "blog")


def frame(rows, device):
    """The rows as a DataFrame with the run's provenance (and, on a CPU, its thread count: a
    CPU's times depend on it)."""
    import pandas as pd
    df = pd.DataFrame(rows).assign(**provenance(device))
    return df.assign(threads=torch.get_num_threads()) if torch.device(device).type == "cpu" else df


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=None, help="folder for the CSVs (default data/<gpu or cpu>)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--parts", nargs="*", default=list(PARTS), choices=PARTS)
    p.add_argument("--reps", type=int, default=None, help="rounds per cell (GPU 21, CPU 3)")
    p.add_argument("--seqlens", type=int, nargs="*", default=None)
    p.add_argument("--no-lm", action="store_true",
                   help="kernel: the attention layer alone, not the 1.4B LM's training steps")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    out = args.out or os.path.join("data", gpu_tag(device))
    os.makedirs(out, exist_ok=True)
    cuda = device.type == "cuda"
    reps = args.reps or (21 if cuda else 3)

    def write(name, rows):
        path = os.path.join(out, name)
        frame(rows, device).to_csv(path, index=False)
        print(f"wrote {path} ({len(rows)} rows)", flush=True)
    if "eca" in args.parts:
        write("eca_errors.csv", measure_eca_errors(device))
        write("eca.csv", measure_eca(device, args.seqlens or SEQLENS[device.type], reps=reps))
        write("eca_stages.csv", measure_eca_stages(device, reps=min(reps, 10)))
    if "blog" in args.parts:
        write("related_methods.csv", measure_blog(device, reps=reps))
    if "kernel" in args.parts:
        if cuda:
            measure_layer(device, reps=reps,
                          on_cell=lambda rows: write("kernel_paper_layer.csv", rows))
            if not args.no_lm:
                write("kernel_paper_lm.csv", measure_lm(device))
        else:
            write("kernel_paper_layer.csv", measure_layer(device, cells=((1, 4, 64, 1024),),
                                                          reps=reps, dtype=torch.float32))
    return 0


if __name__ == "__main__":
    sys.exit(main())
