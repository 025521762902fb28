"""Training a small byte-level language model (:mod:`leetrepro.models.lm`) once per attention
method: the same seeded weights, data and batches for every method, so their loss curves should
lie on each other; throughput in tokens per second. What ``make train`` (``notebooks/train.py``)
runs and plots. ``"mamba2"`` and ``"mamba3"`` train the Mamba-2 and Mamba-3 models instead
(:class:`Mamba2ByteLM`, :class:`Mamba3ByteLM`: other models, the same data and batches; the
operator by ``method="auto"``).
"""
from __future__ import annotations

import time

import torch

from ..models.lm import ByteLM, Mamba2ByteLM, Mamba3ByteLM, batches
from .harness import fla_chunk_simple_gla, provenance, sync


def fla_attention():
    """flash-linear-attention's ``chunk_simple_gla`` as an attention callable
    ``(B, C, V, gamma) -> O`` in this project's layout (its own forward and backward), or None
    when fla is not installed."""
    chunk_simple_gla = fla_chunk_simple_gla()
    if chunk_simple_gla is None:
        return None

    def attend(B, C, V, gamma):
        # fla takes one dtype, as causal_linear_decoder does: the autocast dtype under autocast
        dtype = torch.get_autocast_dtype(V.device.type) \
            if torch.is_autocast_enabled(V.device.type) else V.dtype
        q, k, v = (t.to(dtype).transpose(1, 2) for t in (B, C, V))
        o, _ = chunk_simple_gla(q, k, v, g_gamma=torch.log(gamma).float(), scale=1.0)
        return o.transpose(1, 2)
    return attend


def train(method, data: torch.Tensor, *, steps: int = 200, batch: int = 16, seq_len: int = 512,
          dim: int = 256, layers: int = 4, heads: int = 4, lr: float = 3e-3, seed: int = 0,
          device: str = "cuda", autocast: torch.dtype | None = torch.bfloat16, log_every: int = 10,
          label: str | None = None, ssd=None):
    """Train from seeded weights for ``steps`` AdamW steps; one row per logged step: the loss
    (mean of the steps since the last row) and tokens per second (wall clock, synchronised).
    ``ssd``: with ``"mamba2"`` or ``"mamba3"``, another recurrence in the blocks (mamba_ssm's
    kernels, to compare)."""
    import pandas as pd

    torch.manual_seed(seed)
    label = label or str(method)
    if method in ("mamba2", "mamba3"):  # (another model: Mamba mixers, by the default method)
        lm = Mamba2ByteLM if method == "mamba2" else Mamba3ByteLM
        model, method = lm(dim, layers, heads, ssd=ssd).to(device), "auto"
    else:
        model = ByteLM(dim, layers, heads).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps, pct_start=0.1)
    use_amp = autocast is not None and torch.device(device).type == "cuda"
    rows, losses = [], []
    sync(device)
    t0 = time.perf_counter()
    for step, ids in enumerate(batches(data, batch, seq_len, steps, seed), start=1):
        ids = ids.to(device, non_blocking=True)
        with torch.autocast(torch.device(device).type, dtype=autocast, enabled=use_amp):
            logits = model(ids[:, :-1], method)
        loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, 256),
                                                 ids[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.detach())
        if step % log_every == 0 or step == steps:
            sync(device)
            elapsed = time.perf_counter() - t0
            rows.append(dict(method=label, step=step,
                             loss=torch.stack(losses).mean().item(),
                             tokens_per_s=len(losses) * batch * seq_len / elapsed))
            losses = []
            t0 = time.perf_counter()
    meta = provenance(device)
    return pd.DataFrame(rows).assign(dim=dim, layers=layers, heads=heads, batch=batch,
                                     seq_len=seq_len, autocast=str(autocast) if use_amp else "none",
                                     **meta)
