"""Serving: packed prefill, the decode step over a state pool, and generation in Tables 7-8's
models, beside flash-linear-attention, in one process.

``make bench-serve`` (``python -m leetrepro.bench.serve --out data/<gpu>``) writes

* ``serve.csv``: ``case`` = ``prefill_varlen`` (the 100 seeded prompts of ``data/prompts``,
  716,176 tokens packed with ``cu_seqlens``, heads 32, r = d = 128, decays 0.8…0.999, fp16 and
  bf16) or ``decode`` (one token per sequence, fp32 states in a pool of 2·batch slots, bf16 inputs,
  batch 1, 64, 256). ``ms``: median of CUDA-event timings after a warm-up, entries interleaved.
  ``floor_ms``: prefill (|B|+|C|+|V|+|O|)·bytes, decode the states read and written, ÷ the copy
  bandwidth measured in the same run. ``host_us``: wall time per call of 200 back-to-back calls
  (host and GPU overlapped: what a serving loop pays per step). Entries: ``auto`` and ``Chunk``
  (our packed head-major call, by the default method and by Chunk named), ``chunk_simple_gla``
  (our drop-in, fla's layout), ``Chunk_padded`` (the batch right-padded to the longest prompt),
  ``decode_step`` (eager) and ``decode_step_graph`` (the step
  captured in a CUDA graph, replayed), ``fla`` (flash-linear-attention: ``chunk_simple_gla`` with
  ``cu_seqlens``; ``fused_recurrent_simple_gla`` for a step, its states gathered from the pool
  before the timed call, as its kernel takes no slot ids) and ``fla_graph`` (fla's step captured
  and replayed). ``decode_step_graph8`` and ``fla_graph8``: eight steps, each over its own pool
  (eight layers' states), captured in one graph, ``ms`` and ``host_us`` per step: how a serving
  engine runs a step, the whole model's decode in one graph, where a one-step replay's time is
  mostly the graph's own launch. Compare eager with eager (``decode_step``, ``fla``) and graph
  with graph (``decode_step_graph``, ``fla_graph``; ``decode_step_graph8``, ``fla_graph8``).
  ``*_gates``: the same steps with per-token gates (each new token's own decay; fla's
  ``fused_recurrent_simple_gla(g=…)``), in every mode.
* ``generation.csv``: each model's first two layers (fp16), the prompts prefilled packed in groups
  of ``--group`` then 128 tokens generated per prompt by greedy steps: time to first token
  (``ttft_ms``: the group's prefill, median over groups), per-token latency (``step_ms``, median
  step) and ``tokens_per_s`` (sequences ÷ median step), per method: ``Chunk`` (packed prefill +
  ``decode_step``) and ``original`` (each model's own attention for the prefill, its recurrent form
  in PyTorch for the steps). ``mode``: ``batched`` (every prompt decoding together), ``batch1``
  (prompt by prompt, the first ``--batch1-prompts``, eager) and ``batch1_graph`` (the same, each
  step one replay of a CUDA graph of the whole step: what a serving engine does at batch 1, where
  eager Python is most of a step). ``host_us_per_layer``: the host time of one step with the GPU
  idle, per layer. ``timed`` says what each row's times are; every kernel variant the loop meets
  (prompt lengths, slots) is compiled by an untimed pass first. ``agree``: the share of generated
  tokens equal to Chunk's.
"""
from __future__ import annotations

import itertools
import os
import sys
import time

import torch

from .._dtypes import SHORT_NAMES
from ..api import causal_linear_decoder
from ..compat import chunk_simple_gla
from ..decode import decode_step
from .harness import (capture_graph, fla_chunk_simple_gla, gpu_main, host_seconds,
                      interleaved_medians, median, sync, time_calls, wall_per_call)
from .llm import load_prompts

HEADS, RANK, DIM = 32, 128, 128


def decays(device):
    return torch.linspace(0.8, 0.999, HEADS, dtype=torch.float64, device=device)


def prefill_rows(device, bw, reps, meta):
    lengths = load_prompts().length.tolist()
    cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32,
                      device=device)
    total = int(cu[-1])
    g = decays(device)
    g_gamma = torch.log(g).float()
    fla = fla_chunk_simple_gla()
    rows = []
    for dtype in (torch.float16, torch.bfloat16):
        gen = torch.Generator(device=device).manual_seed(0)
        # time-major storage (fla's layout); our head-major call gets contiguous copies
        q, k, v = (torch.randn(1, total, HEADS, RANK, device=device, dtype=dtype, generator=gen)
                   .mul_(RANK ** -0.5) for _ in range(3))
        B, C, V = (x.transpose(1, 2).contiguous() for x in (q, k, v))
        entries = {  # auto: the default a server gets, beside the method named
            "auto": lambda: causal_linear_decoder(B, C, V, g, cu_seqlens=cu),
            "Chunk": lambda: causal_linear_decoder(B, C, V, g, method="Chunk", cu_seqlens=cu),
            "chunk_simple_gla": lambda: chunk_simple_gla(q, k, v, g_gamma=g_gamma, scale=1.0,
                                                         cu_seqlens=cu),
        }
        if fla is not None:
            cu64 = cu.long()
            entries["fla"] = lambda: fla(q, k, v, g_gamma=g_gamma, scale=1.0, cu_seqlens=cu64)
        times = interleaved_medians(entries, [()], reps, device)
        hosts = {k: wall_per_call(fn, 5, device) * 1e6 for k, fn in entries.items()}
        B = C = V = None  # the memory freed before the next shape
        # the same prompts right-padded into batches of 16 (what a padded server computes)
        longest = max(lengths)
        # three tensors, as a server's B, C, V: one tensor read three times would be served from
        # L2 and time below the floor
        Bp, Cp, Vp = (torch.randn(16, HEADS, longest, RANK, device=device, dtype=dtype)
                      for _ in range(3))
        pad = time_calls(lambda: causal_linear_decoder(Bp, Cp, Vp, g, method="Chunk"), [()], reps,
                         device)
        groups = -(-len(lengths) // 16)
        times["Chunk_padded"] = median(pad) * groups
        hosts["Chunk_padded"] = float("nan")
        Bp = Cp = Vp = q = k = v = None  # the memory freed before the next shape
        torch.cuda.empty_cache()
        floor = 4 * total * HEADS * RANK * dtype.itemsize / bw
        for name, t in times.items():
            rows.append(dict(meta, case="prefill_varlen", method=name, dtype=SHORT_NAMES[dtype],
                             batch=len(lengths), tokens=total, ms=t * 1e3, floor_ms=floor * 1e3,
                             floor_ratio=t / floor, host_us=hosts[name]))
            print(f"prefill {SHORT_NAMES[dtype]} {name:18s} {t * 1e3:8.3f} ms  {t / floor:5.2f}x floor",
                  flush=True)
    return rows


#: steps (layers, each with its own pool) captured in one graph for the ``*_graph8`` entries
GRAPH_STEPS = 8


def decode_rows(device, bw, reps, meta):
    try:
        from fla.ops.simple_gla import fused_recurrent_simple_gla
    except ImportError:
        fused_recurrent_simple_gla = None
    g = decays(device)
    g_gamma = torch.log(g).float()
    rows = []
    dtype = torch.bfloat16
    for batch in (1, 64, 256):
        gen = torch.Generator(device=device).manual_seed(batch)
        B, C, V = (torch.randn(batch, HEADS, 1, RANK, device=device, dtype=dtype, generator=gen)
                   for _ in range(3))
        pools = [torch.randn(2 * batch, HEADS, RANK, DIM, device=device, generator=gen) * 0.01
                 for _ in range(GRAPH_STEPS)]
        slots = torch.arange(batch, device=device, dtype=torch.int32) * 2
        ours = [lambda p=p: decode_step(B, C, V, g, p, slots) for p in pools]
        # per-token gates: each new token's own decay (simple GLA's, Mamba-2's)
        gates = torch.nn.functional.logsigmoid(
            torch.randn(batch, HEADS, 1, device=device, generator=gen) + 3)
        gated = [lambda p=p: decode_step(B, C, V, None, p, slots, g=gates) for p in pools]
        entries = {"decode_step": ours[0], "decode_step_gates": gated[0]}
        theirs = theirs_gated = None
        if fused_recurrent_simple_gla is not None:
            q, k, v = (x.transpose(1, 2) for x in (B, C, V))
            theirs = [lambda h=p[slots.long()]: fused_recurrent_simple_gla(
                q, k, v, g_gamma=g_gamma, scale=1.0, initial_state=h, output_final_state=True)
                for p in pools]
            theirs_gated = [lambda h=p[slots.long()]: fused_recurrent_simple_gla(
                q, k, v, g=gates.transpose(1, 2), scale=1.0, initial_state=h,
                output_final_state=True) for p in pools]
            entries["fla"] = theirs[0]
            entries["fla_gates"] = theirs_gated[0]
        # the same steps in CUDA graphs (fixed shapes, slots on the device): one step a replay,
        # and GRAPH_STEPS steps over as many pools a replay (like with like: fla's the same way)
        for name, steps in (("decode_step", ours), ("fla", theirs),
                            ("decode_step_gates", gated), ("fla_gates", theirs_gated)):
            if steps is not None:
                entries[name + "_graph"] = capture_graph(steps[0], (), device).replay
                entries[f"{name}_graph{GRAPH_STEPS}"] = capture_graph(
                    lambda steps=steps: [step() for step in steps], (), device).replay
        per = {k: GRAPH_STEPS if k.endswith(f"_graph{GRAPH_STEPS}") else 1 for k in entries}
        times = interleaved_medians(entries, [()], reps, device)
        hosts = {k: wall_per_call(fn, 200, device) * 1e6 / per[k] for k, fn in entries.items()}
        floor = 2 * batch * HEADS * RANK * DIM * 4 / bw
        for name, t in times.items():
            t /= per[name]
            rows.append(dict(meta, case="decode", method=name, dtype=SHORT_NAMES[dtype], batch=batch,
                             tokens=batch, ms=t * 1e3, floor_ms=floor * 1e3, floor_ratio=t / floor,
                             host_us=hosts[name]))
            print(f"decode b{batch:<4d} {name:18s} {t * 1e3:8.4f} ms  {t / floor:5.2f}x floor  "
                  f"host {hosts[name]:6.1f} us/step", flush=True)
        del entries, pools
        torch.cuda.empty_cache()
    return rows


def _cu(lengths, device) -> torch.Tensor:
    return torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32, device=device)


def _batched(model, ids, group, new_tokens, method, device):
    """Every prompt decoding together: ``(TTFT seconds per group, seconds per step, the generated
    tokens (prompts, new_tokens))``, the prefills timed after an untimed pass over the groups."""
    from ..models.generate import decode, prefill

    pools = model.state_pools(len(ids), device)
    slots = torch.arange(len(ids), dtype=torch.int32, device=device)
    groups = [(s, ids[s:s + group]) for s in range(0, len(ids), group)]

    def prefill_all():
        first, ttft = [], []
        for s, part in groups:
            cu = _cu([len(p) for p in part], device)
            sync(device)
            t0 = time.perf_counter()
            first.append(prefill(model, torch.cat(part)[None], cu, pools, slots[s:s + len(part)],
                                 method))
            sync(device)
            ttft.append(time.perf_counter() - t0)
        return torch.cat(first), ttft
    prefill_all()  # warm: each group's packed length is a kernel variant of its own
    tokens, ttft = prefill_all()
    positions = torch.tensor([len(p) for p in ids], device=device)
    warm = [p.clone() for p in pools]
    decode(model, tokens, positions, warm, slots, method)
    del warm
    out, steps = [tokens], []
    for _ in range(new_tokens - 1):
        steps.append(time_calls(lambda: out.append(
            decode(model, out[-1], positions, pools, slots, method)), [()], 1, device)[0])
        positions = positions + 1
    return ttft, steps, torch.stack(out, 1)


class _Batch1:
    """Prompt by prompt through one slot of a pool: the prefill, then greedy steps, eager or one
    step captured in a CUDA graph (``graph=True``: the next token and position written in place
    by the graph, the host only replays)."""

    def __init__(self, model, method, device, slots):
        from ..models.generate import decode, prefill

        self.model, self.method, self.device = model, method, device
        self.pools = model.state_pools(slots, device)
        self.prefill_fn, self.decode_fn = prefill, decode
        # the one slot tensor every step names (a server's slot ids live in one device buffer)
        self.slot = torch.zeros(1, dtype=torch.int32, device=device)
        self.tok = torch.zeros(1, dtype=torch.long, device=device)
        self.pos = torch.zeros(1, dtype=torch.long, device=device)
        self.graph = None

    def step(self):
        nxt = self.decode_fn(self.model, self.tok, self.pos, self.pools, self.slot, self.method)
        self.tok.copy_(nxt)
        self.pos.add_(1)

    def capture(self):
        self.graph = capture_graph(self.step, (), self.device)

    def start(self, prompt, slot: int):
        """The prompt prefilled into ``slot``; its first token and position set for the steps."""
        self.slot.fill_(slot)
        cu = _cu([len(prompt)], self.device)
        first = self.prefill_fn(self.model, prompt[None], cu, self.pools, self.slot, self.method)
        self.tok.copy_(first)
        self.pos.fill_(len(prompt))

    def steps(self, count: int, graph: bool):
        run = self.graph.replay if graph else self.step
        for _ in range(count):
            run()

    def generate(self, prompt, count: int, graph: bool = False) -> torch.Tensor:
        """The prompt's first ``count`` generated tokens (slot 0)."""
        self.start(prompt, 0)
        out = [self.tok.clone()]
        for _ in range(count - 1):
            self.steps(1, graph)
            out.append(self.tok.clone())
        return torch.cat(out)


def _batch1_rows(model, ids, method, new_tokens, device):
    """``{mode: (TTFT seconds per prompt, step seconds per prompt, host seconds per step)}`` for
    ``batch1`` (eager) and ``batch1_graph``, after an untimed pass over the same prompts."""
    b1 = _Batch1(model, method, device, len(ids))
    for i, prompt in enumerate(ids):  # warm: every prompt length and slot the loop meets
        b1.start(prompt, i)
        b1.steps(2, graph=False)
    modes = [("batch1", False)]
    if torch.device(device).type == "cuda":
        b1.capture()
        modes.append(("batch1_graph", True))
    out = {}
    for mode, graph in modes:
        ttft, steps = [], []
        for i, prompt in enumerate(ids):
            sync(device)
            t0 = time.perf_counter()
            b1.start(prompt, i)
            sync(device)
            ttft.append(time.perf_counter() - t0)
            t0 = time.perf_counter()  # the steps back to back: the host runs ahead of the GPU
            b1.steps(new_tokens - 1, graph)
            sync(device)
            steps.append((time.perf_counter() - t0) / (new_tokens - 1))
        run = b1.graph.replay if graph else b1.step
        out[mode] = ttft, steps, host_seconds(run, (), 20, device)
    if b1.graph is not None:  # the graph's tokens are the eager steps' (a check, not timed)
        eager, captured = (b1.generate(ids[0], 8, graph) for graph in (False, True))
        if not torch.equal(eager, captured):
            raise RuntimeError(f"{method}: the captured step's tokens {captured.tolist()} differ "
                               f"from the eager step's {eager.tolist()}")
    return out


def generation_rows(device, meta, group: int, new_tokens: int, batch1_prompts: int):
    from ..models import build

    prompts = load_prompts()
    rows = []
    for name in ("transnormer", "retnet"):
        model = build(name).to(device=device, dtype=torch.float16).eval()
        layers = len(model.layers)
        vocab = model.cfg["vocab"]
        ids = [torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(int(s)))
               .to(device) for n, s in zip(prompts.length, prompts.token_seed)]
        reference_tokens = None
        for method in ("Chunk", "original"):
            ttft, steps, generated = _batched(model, ids, group, new_tokens, method, device)
            if generated.eq(0).all():
                raise RuntimeError(f"{name} {method}: every generated token is 0 (non-finite "
                                   "logits?)")
            if reference_tokens is None:
                reference_tokens = generated
            agree = (generated == reference_tokens).float().mean().item()
            rows.append(dict(meta, model=name, method=method, mode="batched", batch=len(ids),
                             prompts=len(ids), group=group, new_tokens=new_tokens,
                             ttft_ms=median(ttft) * 1e3, step_ms=median(steps) * 1e3,
                             tokens_per_s=len(ids) / median(steps), host_us_per_layer=float("nan"),
                             agree=agree, timed=TIMED["batched"]))
            print(f"generate {name} {method:8s} batched: TTFT {median(ttft) * 1e3:.1f} ms/group, "
                  f"step {median(steps) * 1e3:.2f} ms, {rows[-1]['tokens_per_s']:.0f} tok/s, "
                  f"agree {agree:.3f}", flush=True)
            for mode, (ttft1, steps1, host) in _batch1_rows(
                    model, ids[:batch1_prompts], method, new_tokens, device).items():
                rows.append(dict(meta, model=name, method=method, mode=mode, batch=1,
                                 prompts=len(ttft1), group=1, new_tokens=new_tokens,
                                 ttft_ms=median(ttft1) * 1e3, step_ms=median(steps1) * 1e3,
                                 tokens_per_s=1 / median(steps1),
                                 host_us_per_layer=host / layers * 1e6, agree=float("nan"),
                                 timed=TIMED[mode]))
                print(f"generate {name} {method:8s} {mode}: TTFT {median(ttft1) * 1e3:.1f} ms, "
                      f"step {median(steps1) * 1e3:.2f} ms, {1 / median(steps1):.0f} tok/s, host "
                      f"{host / layers * 1e6:.0f} us per layer", flush=True)
            torch.cuda.empty_cache()
        model = None  # the memory freed before the next model
        torch.cuda.empty_cache()
    return rows


#: what each generation row's times are (its ``timed`` column)
TIMED = {
    "batched": "after an untimed pass over the groups' prefills and one step; TTFT: wall per "
               "group, synchronised; step: GPU time (CUDA events) of each step",
    "batch1": "after an untimed pass over the same prompts (prefill + 2 steps each); TTFT: wall, "
              "synchronised; step: wall of the steps back to back per prompt, eager",
    "batch1_graph": "as batch1, each step one replay of a CUDA graph of the whole step (both "
                    "layers and the greedy choice)",
}


def _arguments(p) -> None:
    p.add_argument("--reps", type=int, default=15)
    p.add_argument("--parts", nargs="*", default=["prefill", "decode", "generation"])
    p.add_argument("--group", type=int, default=10, help="prompts per packed prefill (generation)")
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--batch1-prompts", type=int, default=20)


def main(argv=None) -> int:
    import pandas as pd

    args, setup = gpu_main("serve", __doc__, argv, _arguments, output="serve.csv and generation.csv", bandwidth=True)
    if setup is None:
        return 2
    device, meta, out, bw = setup
    rows = []
    if "prefill" in args.parts:
        rows += prefill_rows(device, bw, args.reps, meta)
    if "decode" in args.parts:
        rows += decode_rows(device, bw, args.reps, meta)
    if rows:
        pd.DataFrame(rows).to_csv(os.path.join(out, "serve.csv"), index=False)
    if "generation" in args.parts:
        gen = generation_rows(device, meta, args.group, args.new_tokens, args.batch1_prompts)
        pd.DataFrame(gen).to_csv(os.path.join(out, "generation.csv"), index=False)
    print(f"-> {out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
