"""What a model gets: a decoder language model's training step with its token mixer swapped.

``make bench-model`` (or ``python -m leetrepro.bench.model --out data/<gpu>``) builds
:class:`leetrepro.models.decoder.DecoderLM` (pre-norm blocks, RMSNorm, a fused q/k/v projection,
SwiGLU, untied embedding and head, vocabulary 32k; bf16 parameters, fused AdamW) at each size of
:data:`SIZES`, once per mixer of :data:`MIXERS`, and times a training step (forward, cross-entropy
in float32, backward, optimizer step) eager and with every block under ``torch.compile`` (the
blocks are alike, so they share one compilation), the modes' steps interleaved (medians of
``--reps`` CUDA-event timings after 2 warm-up steps each, which compile and autotune); with
``--modes ... graphs`` also under ``torch.compile(mode="reduce-overhead")`` (CUDA graphs). One model
is in memory at a time: mixers are timed one after another in one process, so compare mixers
within a size and mode; ``--together`` builds up to three mixers' models at once and interleaves
every mixer's and mode's steps (the fair comparison of two or three mixers).

Writes ``model.csv`` (with ``--keep``, beside the file's rows of the sizes, mixers and modes not
run: a few rows measured again at a later commit): per size, mixer and mode ``ms`` per step,
``tokens_per_s`` (batch · seq / step), ``peak_GiB`` (the most allocated during a step: weights,
optimizer state, activations), ``params``, ``vs_leetrepro`` (tokens/s over the ``leetrepro``
mixer's in the same size and mode; above 1: faster than it), and the operator's part of the step
from ``torch.profiler``: ``op_ms`` is the GPU time per step of the kernels that the mixer alone
launches (profiled on its own first, on inputs of the model's shapes; PyTorch's own ATen kernels,
the copies and casts around an op, and the matrix products of Mamba-2's projections are left out:
the operator's kernels, not its wrapper; for Mamba-2 the SSD, not its convolution), ``op_share``
that over all kernels' GPU time in the step. A mixer that fails is a row with its ``status``; the
others still run.

Mixers (time-major ``(batch, N, heads, d)`` views of the fused projection, as models hand them):

* ``leetrepro``: :func:`leetrepro.causal_linear_decoder` with the default ``method="auto"`` and
  per-head decays γ from 0.8 to 0.999 (the operator as this project's users call it);
* ``leetrepro chunk_simple_gla``: the drop-in :func:`leetrepro.compat.chunk_simple_gla` with
  ``g_gamma = log γ``, ``scale=1``;
* ``fla chunk_simple_gla``: flash-linear-attention's, the same arguments (optional ``fla-core``);
* ``softmax SDPA``: ``scaled_dot_product_attention(is_causal=True)``;
* ``leetrepro gated``, ``fla gated``: each ``chunk_simple_gla`` with per-token log gates
  ``g (batch, N, heads)`` from a rank-16 projection (GLA's), no fixed decay;
* ``Mamba-2 leetrepro``, ``Mamba-2 mamba_ssm``: a :class:`leetrepro.models.Mamba2Block` in the
  mixer's place (expand 2, headdim 64, the size's d_state and groups), its SSD this project's or
  mamba_ssm's Triton kernels (from ``$LEETREPRO_PEERS``, see ``make bench-ssd``);
* ``Mamba-3 leetrepro``, ``Mamba-3 mamba_ssm``: a :class:`leetrepro.models.Mamba3Block` (SISO)
  likewise, its recurrence this project's or mamba_ssm's ``mamba3_siso_combined``.
"""
from __future__ import annotations

import os
import re
import sys
from typing import Callable

import torch

from .harness import failed_status, fla_chunk_simple_gla, gpu_main, interleaved_medians, \
    mamba_ssm_peer, sync
from .layouts import decays

#: name -> the model (vocab, dim, layers, heads, mlp), one GPU's micro-batch (batch × seq), and
#: the Mamba-2 mixer's state (headdim, d_state, ngroups)
SIZES = {
    "125M": dict(vocab=32000, dim=768, layers=12, heads=12, mlp=2048, batch=4, seq=4096,
                 mamba=dict(headdim=64, d_state=64, ngroups=1)),
    "1.3B": dict(vocab=32000, dim=2048, layers=24, heads=16, mlp=5632, batch=2, seq=4096,
                 mamba=dict(headdim=64, d_state=128, ngroups=8)),
}
MIXERS = ("leetrepro", "leetrepro chunk_simple_gla", "fla chunk_simple_gla", "softmax SDPA",
          "leetrepro gated", "Mamba-2 leetrepro", "Mamba-2 mamba_ssm", "fla gated",
          "Mamba-3 leetrepro", "Mamba-3 mamba_ssm")
#: the modes timed by default; ``graphs`` (the blocks under ``torch.compile(mode=
#: "reduce-overhead")``: inductor's code replayed from CUDA graphs) on request
MODES = ("eager", "compile")
ALL_MODES = MODES + ("graphs",)
#: kernel names that are not an op's own: PyTorch's ATen kernels (copies, casts, fills,
#: reductions around a call), copies and fills by the driver, matrix-product libraries (Mamba-2's
#: projections) and convolutions (its causal conv): left out of the operator's share. Matched on
#: the kernel's own name, not its template arguments (FlashAttention's name cutlass types), and
#: not cuDNN as a whole (its fused attention is softmax SDPA's kernel on Hopper).
_NOT_THE_OP = re.compile(r"^(void )?(at::native::|at::cuda::|cutlass::|cublas)|"
                         r"^(sm\d+_xmma|nvjet|ampere_|Memcpy|Memset)|gemm|conv", re.I)


def mixer(name: str, cfg: dict, device, peer=None) -> Callable[[], torch.nn.Module] | None:
    """``make_mixer()`` for :class:`DecoderLM` (each call a new sub-layer), or None where its
    peer is not installed."""
    from .. import causal_linear_decoder
    from ..compat import chunk_simple_gla
    from ..models.decoder import AttentionMixer
    from ..models.mamba2 import Mamba2Block
    dim, heads = cfg["dim"], cfg["heads"]
    if name.startswith("Mamba-2"):
        if name.endswith("mamba_ssm") and peer is None:
            return None
        ssd = peer if name.endswith("mamba_ssm") else None
        return lambda: Mamba2Block(dim, ssd=ssd, **cfg["mamba"])
    if name.startswith("Mamba-3"):
        from ..models.mamba3 import Mamba3Block
        siso = None
        if name.endswith("mamba_ssm"):
            siso = mamba_ssm_peer(None, "ops.triton.mamba3.mamba3_siso_combined",
                                  "mamba3_siso_combined")
            if siso is None:
                return None
        return lambda: Mamba3Block(dim, siso=siso, **cfg["mamba"])
    gamma = decays(heads).to(device)
    log_gamma = gamma.log().float()
    fla = fla_chunk_simple_gla() if name.startswith("fla") else None
    if name.startswith("fla") and fla is None:
        return None
    if name == "leetrepro":
        def mix(q, k, v, g):
            return causal_linear_decoder(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                         gamma).transpose(1, 2)
    elif name == "softmax SDPA":
        def mix(q, k, v, g):
            return torch.nn.functional.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                is_causal=True).transpose(1, 2)
    elif name in ("leetrepro chunk_simple_gla", "fla chunk_simple_gla"):
        op = chunk_simple_gla if fla is None else fla

        def mix(q, k, v, g):
            return op(q, k, v, g_gamma=log_gamma, scale=1.0)[0]
    elif name in ("leetrepro gated", "fla gated"):
        op = chunk_simple_gla if fla is None else fla

        def mix(q, k, v, g):
            return op(q, k, v, g=g, scale=1.0)[0]
    else:
        raise ValueError(f"unknown mixer {name!r}; use one of {MIXERS}")
    gates = "head" if name.endswith("gated") else None
    return lambda: AttentionMixer(dim, heads, mix, gates=gates)


def kernel_times(fn: Callable, device, calls: int = 2) -> dict:
    """GPU microseconds per call of each kernel ``fn()`` launches (``torch.profiler``), by name
    (a trailing ``_<digits>``, which ``torch.compile`` appends to the kernels it wraps, removed)."""
    from torch.profiler import ProfilerActivity, profile
    sync(device)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        sync(device)
    out = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            name = re.sub(r"_\d+$", "", e.name)
            out[name] = out.get(name, 0.0) + e.time_range.elapsed_us() / calls
    return out


def op_share(step_kernels: dict, op_kernels: set) -> tuple[float, float]:
    """``(op_ms, op_share)``: the GPU time per step of the kernels named in ``op_kernels`` (the
    mixer's own, :data:`_NOT_THE_OP` left out) and its part of all kernels' time."""
    mine = {k for k in op_kernels if not _NOT_THE_OP.search(k)}
    total = sum(step_kernels.values())
    op = sum(t for k, t in step_kernels.items() if k in mine)
    return op / 1e3, (op / total if total else float("nan"))


def _mixer_alone(model, cfg: dict, device) -> Callable:
    """One forward + backward of the first block's mixer alone, on inputs of the model's shape."""
    layer = model.blocks[0].mixer
    x = torch.randn(cfg["batch"], cfg["seq"], cfg["dim"], device=device,
                    dtype=next(model.parameters()).dtype, requires_grad=True)
    if hasattr(layer, "mix"):  # (the op alone: not the projections around it)
        with torch.no_grad():
            q, k, v, g = layer.inputs(x)
        q, k, v = (t.requires_grad_() for t in torch.stack((q, k, v), 2).unbind(2))
        g = None if g is None else g.requires_grad_()

        def call():
            o = layer.mix(q, k, v, g)
            o.backward(torch.ones_like(o))
        return call

    def call():
        y = layer(x)
        y.backward(torch.ones_like(y))
    return call


#: the most mixers ``together`` times in one process: each adds a compiled graph a mode to the
#: blocks' one code object, and dynamo recompiles a code object at most 8 times
TOGETHER_MAX = 3


def _built(make, cfg: dict, modes, device, compile_backend: str, ids, seed: int) -> tuple:
    """One mixer's model (bf16), fused AdamW and ``{mode: step}``; ``(model, opt, steps,
    params)``. A step: forward, float32 cross-entropy, backward, optimizer step."""
    from ..models.decoder import DecoderLM
    torch.manual_seed(seed)
    with torch.device(device):  # (initialised in place: a 1.3B model on a host is slow)
        model = DecoderLM(make_mixer=make, **cfg).to(torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=torch.device(device).type == "cuda")
    compiled = {m: [_compiled(b, m, compile_backend) for b in model.blocks]
                for m in modes if m != "eager"}

    def step(blocks=None, graphs=False):
        if graphs:  # (a new iteration: cudagraph trees may reuse the last one's memory)
            torch.compiler.cudagraph_mark_step_begin()
        logits = model(ids[:, :-1], blocks)
        loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1),
                                                 ids[:, 1:].flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    steps = {m: (lambda c=compiled.get(m), g=m == "graphs": step(c, g)) for m in modes}
    return model, opt, steps, sum(p.numel() for p in model.parameters())


def _own_bytes(model, opt) -> int:
    """Bytes of a model's parameters and its optimizer's state (what stays between steps)."""
    held = list(model.parameters()) + [t for state in opt.state.values()
                                       for t in state.values() if torch.is_tensor(t)]
    return sum(t.numel() * t.element_size() for t in held)


def _mixer_rows(base: dict, name: str, built: tuple, times: dict, cfg: dict, reps: int, device,
                profile: bool) -> list[dict]:
    """One mixer's rows from its modes' median seconds ``times``: tokens/s, the peak of one more
    step, and the operator's share of a profiled step."""
    model, opt, steps, params = built
    cuda = torch.device(device).type == "cuda"
    op_kernels = set(kernel_times(_mixer_alone(model, cfg, device), device, 1)) \
        if profile and cuda else None
    opt.zero_grad(set_to_none=True)  # (what the mixer alone left in the weights' .grad)
    rows = []
    for m, t in times.items():
        row = dict(base, mixer=name, mode=m, params=params, reps=reps, ms=t * 1e3,
                   tokens_per_s=cfg["batch"] * cfg["seq"] / t, status="ok")
        if cuda:  # (its own weights and optimizer state, and what a step adds to them: the
            # other models of a ``together`` run are left out)
            sync(device)
            torch.cuda.reset_peak_memory_stats(device)
            before = torch.cuda.memory_allocated(device)
            steps[m]()
            sync(device)
            row["peak_GiB"] = (_own_bytes(model, opt) + torch.cuda.max_memory_allocated(device)
                               - before) / 2 ** 30
        if op_kernels is not None:
            row["op_ms"], row["op_share"] = op_share(kernel_times(steps[m], device), op_kernels)
        rows.append(row)
    return rows


def measure(size: str, cfg: dict, mixers, modes, reps: int, device, *, peer=None,
            profile: bool = True, compile_backend: str = "inductor", seed: int = 0,
            on_mixer: Callable | None = None, together: bool = False) -> list[dict]:
    """The rows of one size: each mixer's model built, timed in each mode (the modes' steps
    interleaved), freed; ``on_mixer(rows so far)`` after each (to write them: a run cut short
    keeps its rows). ``together``: every mixer's model built at once (at most
    :data:`TOGETHER_MAX`) and every (mixer, mode) step interleaved with the others', so that
    mixers are compared in the same process state, step by step."""
    if together and len(mixers) > TOGETHER_MAX:
        raise ValueError(f"together: at most {TOGETHER_MAX} mixers (dynamo recompiles the "
                         f"blocks' code at most 8 times), not {len(mixers)}")
    cuda = torch.device(device).type == "cuda"
    gen = torch.Generator(device=device).manual_seed(seed)
    ids = torch.randint(0, cfg["vocab"], (cfg["batch"], cfg["seq"] + 1), generator=gen,
                        device=device)
    base = dict(size=size, **{k: v for k, v in cfg.items() if k != "mamba"})
    rows = []

    def failed(name, err):
        return [dict(base, mixer=name, mode=m, status=failed_status(err, 200)) for m in modes
                if not any(r["mixer"] == name and r["mode"] == m for r in rows)]

    def done(name):
        for r in [r for r in rows if r["mixer"] == name]:
            print(_line(r), flush=True)
        if on_mixer is not None:
            on_mixer(rows)
    groups = [list(mixers)] if together else [[name] for name in mixers]
    for group in groups:
        built = {}
        try:
            # (each group's blocks compile anew: the compiled code of one mixer cannot serve
            # another, and eight mixers' entries would reach dynamo's recompile limit)
            torch._dynamo.reset()
            for name in group:
                make = mixer(name, cfg, device, peer)
                if make is None:
                    rows += [dict(base, mixer=name, mode=m, status="not installed") for m in modes]
                    continue
                try:
                    built[name] = _built(make, cfg, modes, device, compile_backend, ids, seed)
                    for step in built[name][2].values():  # (a mixer that fails is left out)
                        step()
                except Exception as err:  # noqa: BLE001  (a mixer that fails is a row)
                    built.pop(name, None)
                    rows += failed(name, err)
            fns = {(name, m): fn for name, b in built.items() for m, fn in b[2].items()}
            times = interleaved_medians(fns, [()], reps, device, warmup=2, shuffle=True) \
                if fns else {}
            for name, b in built.items():
                try:
                    rows += _mixer_rows(base, name, b, {m: times[(name, m)] for m in modes},
                                        cfg, reps, device, profile)
                except Exception as err:  # noqa: BLE001
                    rows += failed(name, err)
        except Exception as err:  # noqa: BLE001  (the group's timing failed: each mixer a row)
            for name in built:
                rows += failed(name, err)
        finally:
            built = fns = None  # (freed before the next group's models)
            if cuda:
                torch.cuda.empty_cache()
        order = {name: i for i, name in enumerate(mixers)}
        rows.sort(key=lambda r: order[r["mixer"]])  # (the mixers' order, whatever failed first)
        for name in group:
            done(name)
    return compare(rows)


def compare(rows: list[dict]) -> list[dict]:
    """``vs_leetrepro`` on each row: its tokens/s over the ``leetrepro`` mixer's in the same size
    and mode (where both ran)."""
    for r in rows:
        ref = next((x for x in rows if x["mixer"] == "leetrepro" and x["mode"] == r["mode"]
                    and x["size"] == r["size"] and x.get("tokens_per_s")), None)
        if ref is not None and r.get("tokens_per_s"):
            r["vs_leetrepro"] = r["tokens_per_s"] / ref["tokens_per_s"]
    return rows


def written_rows(path: str) -> list[dict]:
    """The rows of a ``model.csv`` as they were written (the commit as text: read as a number,
    "801e919" is inf), none where there is no file."""
    import pandas as pd

    return pd.read_csv(path, dtype={"commit": str}).to_dict("records") \
        if os.path.exists(path) else []


def kept_rows(old: list[dict], rows: list[dict]) -> list[dict]:
    """``old``'s rows (:func:`written_rows`) for the sizes, mixers and modes ``rows`` did not
    measure, then ``rows``; ``vs_leetrepro`` taken again over them all (``--keep``)."""
    measured = {(r["size"], r["mixer"], r["mode"]) for r in rows}
    kept = [dict(r) for r in old if (r["size"], r["mixer"], r["mode"]) not in measured]
    for r in kept:
        r.pop("vs_leetrepro", None)
    return compare(kept + [dict(r) for r in rows])


def _compiled(block, mode: str, backend: str):
    """``block`` under ``torch.compile`` for ``mode`` (``graphs``: ``mode="reduce-overhead"``,
    which only inductor takes)."""
    if mode == "graphs" and backend == "inductor":
        return torch.compile(block, mode="reduce-overhead")
    return torch.compile(block, backend=backend)


def _line(r: dict) -> str:
    if r["status"] != "ok":
        return f"{r['size']:>5} {r['mixer']:28s} {r['mode']:8s} {r['status'][:100]}"
    share = f"  op {r['op_ms']:6.2f} ms ({r['op_share']:5.1%})" if "op_share" in r else ""
    peak = f"  peak {r['peak_GiB']:5.1f} GiB" if "peak_GiB" in r else ""
    return (f"{r['size']:>5} {r['mixer']:28s} {r['mode']:8s} {r['ms']:9.2f} ms/step "
            f"{r['tokens_per_s'] / 1e3:8.1f}k tokens/s{peak}{share}")


def _arguments(p) -> None:
    p.add_argument("--sizes", nargs="*", default=list(SIZES), choices=list(SIZES))
    p.add_argument("--mixers", nargs="*", default=list(MIXERS), choices=list(MIXERS))
    p.add_argument("--modes", nargs="*", default=list(MODES), choices=list(ALL_MODES),
                   help="eager, compile (torch.compile of each block) and graphs "
                        "(mode='reduce-overhead': CUDA graphs); default: eager, compile")
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--batch", type=int, default=None, help="replace each size's batch")
    p.add_argument("--seq", type=int, default=None, help="replace each size's sequence length")
    p.add_argument("--no-profile", action="store_true", help="skip the operator's share")
    p.add_argument("--peers", default=None,
                   help="folder with mamba_ssm's public source (default $LEETREPRO_PEERS)")
    p.add_argument("--together", action="store_true",
                   help=f"every mixer's model at once (at most {TOGETHER_MAX}), their steps "
                        "interleaved: mixers compared step by step in one process state")
    p.add_argument("--csv", default="model.csv")
    p.add_argument("--keep", action="store_true",
                   help="keep the file's rows of the sizes, mixers and modes not run here")


def main(argv=None) -> int:
    import pandas as pd

    args, setup = gpu_main("bench.model", __doc__, argv, _arguments, output="model.csv")
    if setup is None:
        return 2
    device, meta, out = setup
    peer = mamba_ssm_peer(args.peers) if "Mamba-2 mamba_ssm" in args.mixers else None
    done = []

    path = os.path.join(out, args.csv)
    old = written_rows(path) if args.keep else None  # (read once: each write rewrites the file)

    def write(rows):
        new = [dict(r, **meta) for r in done + rows]
        pd.DataFrame(compare(new) if old is None else kept_rows(old, new)).to_csv(path, index=False)
    for size in args.sizes:
        cfg = dict(SIZES[size])
        cfg.update({k: v for k, v in (("batch", args.batch), ("seq", args.seq)) if v})
        done += measure(size, cfg, args.mixers, args.modes, args.reps, device, peer=peer,
                        profile=not args.no_profile, on_mixer=write, together=args.together)
    print(f"wrote {path} ({len(done)} rows measured)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
