"""transformers' Mamba-2 family trained and generating on this project's kernels
(:mod:`leetrepro.integrations.transformers`) against the same model on transformers' PyTorch
fallback and on mamba_ssm's Triton kernels.

``python -m leetrepro.bench.hf [--models zamba2 falcon_h1 granitemoehybrid] [--entries …]
[--out DIR]`` writes ``hf.csv`` (GPU), one row per model, entry and measurement, with provenance:

* ``train``: a training step (forward, backward, fused AdamW) of the model in bf16 with random
  weights on ``batch × seq`` tokens (:data:`TRAIN`): ms per step (median of each entry's steps,
  the entries taking turns on one model, after two warm-up rounds), tokens/s, peak memory;
* ``generate``: ``generate`` of :data:`NEW_TOKENS` tokens after a prompt of :data:`PROMPT`, at
  batch 1 and 64, greedy: new tokens/s (median of two, the entries in turn, after one of the
  same length each).

Entries: ``leetrepro`` (:func:`enable`), ``fallback`` (transformers' own functions: PyTorch where
mamba_ssm and causal-conv1d are not installed, as on the host measured), ``mamba_ssm`` (its
Triton chunk scan and state update from ``$LEETREPRO_PEERS``, see ``make bench-ssd``; its fused
split-conv-scan needs causal-conv1d's CUDA build, so it takes the unfused path with PyTorch's
convolution, as a user without causal-conv1d does). A failing cell is a row with its status.
"""
from __future__ import annotations

import importlib
import os
import sys
import time

import torch

from .harness import failed_status, gpu_main, median, sync

#: 0.8-1.9B configurations of three families (random weights; hidden 2048, 24 layers), the
#: field's hybrid shapes scaled down
MODELS = {
    "zamba2": lambda t: t.Zamba2Config(
        vocab_size=32000, hidden_size=2048, num_hidden_layers=24,
        layers_block_type=["mamba"] * 5 + ["hybrid"] + ["mamba"] * 5 + ["hybrid"] + ["mamba"] * 12,
        mamba_d_state=64, mamba_ngroups=1, mamba_expand=2, n_mamba_heads=64,
        num_attention_heads=32, num_key_value_heads=32, intermediate_size=4096,
        chunk_size=256, num_mem_blocks=1),
    "falcon_h1": lambda t: t.FalconH1Config(
        vocab_size=32000, hidden_size=2048, num_hidden_layers=24, mamba_d_ssm=3072,
        mamba_d_state=128, mamba_d_head=64, mamba_n_groups=1, mamba_expand=2, mamba_n_heads=48,
        num_attention_heads=16, num_key_value_heads=4, intermediate_size=4096,
        mamba_chunk_size=256),
    "granitemoehybrid": lambda t: t.GraniteMoeHybridConfig(
        vocab_size=32000, hidden_size=2048, num_hidden_layers=24, mamba_d_state=128,
        mamba_d_head=64, mamba_n_groups=1, mamba_expand=2, mamba_n_heads=64,
        num_attention_heads=16, num_key_value_heads=4, intermediate_size=4096,
        mamba_chunk_size=256, layer_types=(["mamba"] * 5 + ["attention"]) * 4,
        num_local_experts=1, num_experts_per_tok=1, shared_intermediate_size=4096),
}
ENTRIES = ("leetrepro", "fallback", "mamba_ssm")
TRAIN = dict(batch=2, seq=4096)
PROMPT, NEW_TOKENS, GENERATE_BATCHES = 128, 64, (1, 64)


def _mamba_ssm_functions(peers: str | None) -> dict | None:
    """The module attributes the mamba_ssm entry sets: its Triton chunk scan and state update."""
    from .harness import mamba_ssm_peer
    scan = mamba_ssm_peer(peers)
    if scan is None:
        return None
    update = importlib.import_module(
        "mamba_ssm.ops.triton.selective_state_update").selective_state_update
    return {"mamba2_chunk_scan": scan, "mamba2_selective_state_update": update}


def _as_transformers_calls(fn):
    """``fn`` called as transformers' ``use_kernel_func_from_hub_with_fallback`` calls the
    implementation it resolved: the keyword arguments ``fn`` names, the rest dropped (the mixers
    hand on theirs, ``position_embeddings`` among them, which mamba_ssm's functions refuse)."""
    import functools
    import inspect
    names = frozenset(inspect.signature(fn).parameters)

    @functools.wraps(fn)
    def call(*args, **kwargs):
        return fn(*args, **{k: v for k, v in kwargs.items() if k in names})
    return call


def _route(family: str, entry: str, peer_functions: dict | None) -> bool:
    """Point the family's module at the entry's functions; False where the entry is missing.

    transformers resolves each name once, when the modeling module is imported: to mamba_ssm's
    kernels wherever ``mamba_ssm`` imports then (the peer's source registered by this bench
    counts), else to its PyTorch reference. So ``fallback`` and ``mamba_ssm`` set every name
    themselves, whatever was resolved: the PyTorch references (transformers' own functions
    under its wrapper) for ``fallback``; mamba_ssm's chunk scan and state update, the rest
    PyTorch's, for ``mamba_ssm``; each called as transformers calls what it resolved."""
    import inspect

    from ..integrations import transformers as lt
    lt.disable()
    if entry == "leetrepro":
        lt.enable(family)
        return True
    if entry == "mamba_ssm" and peer_functions is None:
        return False
    mod = lt._module(family)
    chosen = peer_functions if entry == "mamba_ssm" else {}
    for name in lt.NAMES:
        own = getattr(mod, name)
        lt._SAVED.setdefault((family, name), own)
        setattr(mod, name, _as_transformers_calls(chosen.get(name) or inspect.unwrap(own)))
    return True


def measure(family: str, config, entries, device, *, reps: int = 5, train=TRAIN,
            prompt: int = PROMPT, new_tokens: int = NEW_TOKENS, batches=GENERATE_BATCHES,
            dtype=torch.bfloat16, peer_functions=None, on_row=None) -> list[dict]:
    """The rows of one model (module docstring); ``config`` a transformers config. One model and
    one optimizer serve every entry: the entries take turns, step by step and ``generate`` by
    ``generate`` (each routed in before its call, :func:`_route`), so that they are compared on
    the same weights and the same host and GPU state, interleaved; each is warmed up first
    (two training steps; a ``generate`` of the timed length, whose first calls build the
    attention layers' plans for each new cache length). Rows in ``entries``' order."""
    import transformers

    from ..integrations import transformers as lt
    rows = []
    cuda = torch.device(device).type == "cuda"
    gen = torch.Generator(device=device).manual_seed(0)
    ids = torch.randint(0, config.vocab_size, (train["batch"], train["seq"] + 1), generator=gen,
                        device=device)
    base = dict(model=family, layers=config.num_hidden_layers, hidden=config.hidden_size,
                dtype=str(dtype)[6:])

    def add(row):
        rows.append(dict(base, **row))
        print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                       for k, v in rows[-1].items()), flush=True)
        if on_row is not None:
            on_row(rows)
    present = [e for e in entries if _route(family, e, peer_functions)]
    lt.disable()
    model = opt = None
    failed = {}

    def timed(entry, fn) -> float | None:
        """Seconds of ``fn()`` with ``entry`` routed in; None (and the entry dropped) where it
        raises."""
        if entry in failed:
            return None
        try:
            _route(family, entry, peer_functions)
            sync(device)
            t0 = time.perf_counter()
            fn()
            sync(device)
            return time.perf_counter() - t0
        except Exception as err:  # noqa: BLE001  (a failing entry is a row)
            failed[entry] = failed_status(err, 200)
            return None
    try:
        if present:
            torch.manual_seed(0)
            with torch.device(device):
                model = transformers.AutoModelForCausalLM.from_config(config).to(dtype)
            model.train()
            opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=cuda)

        def step():
            opt.zero_grad(set_to_none=True)  # (also after an entry that raised midway)
            model(ids[:, :-1], labels=ids[:, 1:]).loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        steps = {e: [] for e in present}
        for i in range(reps + 2):  # (the first two rounds: compilation and autotuning)
            for e in present:
                t = timed(e, step)
                if t is not None and i >= 2:
                    steps[e].append(t)
        for e in entries:
            if e not in present:
                add(dict(entry=e, what="train", status="not installed"))
                continue
            if e in failed:
                add(dict(entry=e, what="train", batch=train["batch"], tokens=train["seq"],
                         status=failed[e]))
                continue
            peak = None
            if cuda:
                torch.cuda.reset_peak_memory_stats(device)
                if timed(e, step) is not None:  # (a step that raised has no peak to tell)
                    peak = torch.cuda.max_memory_allocated(device) / 2 ** 30
            t = median(steps[e])
            add(dict(entry=e, what="train", batch=train["batch"], tokens=train["seq"],
                     ms=t * 1e3, tokens_per_s=train["batch"] * train["seq"] / t,
                     peak_GiB=peak, status="ok"))
        opt = None
        if model is not None:
            model.eval()
        kw = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                  pad_token_id=0)
        for batch in batches:
            # (each batch a cell of its own: an entry whose training step raised, or whose
            # generate did at another batch, still generates; transformers' fallback runs out
            # of memory training these models at 4096 tokens on some releases, not generating)
            failed.clear()
            if cuda:
                torch.cuda.empty_cache()
            prompt_ids = ids[:1, :prompt].expand(batch, -1).contiguous()
            calls = {e: [] for e in present if e not in failed}
            with torch.no_grad():
                # (round 0 warms each entry up at the timed length; then as many rounds as
                # training's: a batch-1 call is the host's time, which two rounds left noisy)
                for i in range(reps + 1):
                    for e in calls:
                        t = timed(e, lambda: model.generate(prompt_ids, **kw))
                        if t is not None and i:
                            calls[e].append(t)
            for e, ts in calls.items():
                if e in failed:
                    add(dict(entry=e, what="generate", batch=batch, status=failed[e]))
                    continue
                t = median(ts)
                add(dict(entry=e, what="generate", batch=batch, tokens=new_tokens,
                         ms=t * 1e3, tokens_per_s=batch * new_tokens / t, status="ok"))
    except Exception as err:  # noqa: BLE001  (the model itself failed: a row says so)
        add(dict(entry="+".join(present), what="train", status=failed_status(err, 200)))
    finally:
        model = opt = None
        lt.disable()
        if cuda:
            torch.cuda.empty_cache()
    order = {e: i for i, e in enumerate(entries)}
    rows.sort(key=lambda r: (order.get(r["entry"], len(order)), r["what"] != "train"))
    if on_row is not None and rows:
        on_row(rows)
    return rows


def _arguments(p) -> None:
    p.add_argument("--models", nargs="*", default=list(MODELS), choices=list(MODELS))
    p.add_argument("--entries", nargs="*", default=list(ENTRIES), choices=list(ENTRIES))
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--peers", default=None,
                   help="folder with mamba_ssm's public source (default $LEETREPRO_PEERS)")


def main(argv=None) -> int:
    import pandas as pd
    import transformers

    args, setup = gpu_main("bench.hf", __doc__, argv, _arguments, output="hf.csv")
    if setup is None:
        return 2
    device, meta, out = setup
    peer = _mamba_ssm_functions(args.peers) if "mamba_ssm" in args.entries else None
    done = []
    meta = dict(meta, transformers=transformers.__version__)

    def write(rows):
        pd.DataFrame(done + rows).assign(**meta).to_csv(os.path.join(out, "hf.csv"), index=False)
    for family in args.models:
        done += measure(family, MODELS[family](transformers), args.entries, device,
                        reps=args.reps, peer_functions=peer, on_row=write)
    print(f"wrote {os.path.join(out, 'hf.csv')} ({len(done)} rows)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
