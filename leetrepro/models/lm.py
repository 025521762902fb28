"""A small byte-level causal language model built from the TransNormerLLM decoder layers of
Table 7, for training runs (``make train``): the attention method is swappable, the weights, data
and batches are seeded, so runs with different methods see the same numbers.

The corpus is text every machine with Python has: the source files of the standard library,
read in sorted order (nothing is downloaded). Tokens are bytes (vocabulary 256).
"""
from __future__ import annotations

import os
import sysconfig

import torch
from torch import nn

from .configs import config
from .mamba2 import Mamba2Block
from .mamba3 import Mamba3Block
from .transnormer import TransNormerLLM


class ByteLM(nn.Module):
    """TransNormerLLM layers (LRPE on the first, so r = 2·d_head there), tied byte embeddings.

    ``forward(ids (batch, N) int64, attention_method) -> logits (batch, N, 256)``."""

    def __init__(self, dim: int = 256, layers: int = 4, heads: int = 4, glu_dim: int | None = None):
        super().__init__()
        cfg = config("transnormer", dim=dim, layers=layers, total_layers=max(layers, 2),
                     heads=heads, glu_dim=glu_dim or 2 * dim, vocab=256)
        cfg["name"] = f"byte-level TransNormer, {layers} layers × {dim}"
        self.body = TransNormerLLM(cfg)
        self.cfg = cfg

    def forward(self, ids: torch.Tensor, attention_method="auto") -> torch.Tensor:
        return self.body(ids, attention_method) @ self.body.embed.weight.t()


class Mamba2ByteLM(nn.Module):
    """A byte-level Mamba-2 language model: tied byte embeddings, ``layers`` pre-norm residual
    Mamba-2 mixers (:class:`Mamba2Block`, expand 2, ``heads`` heads, d_state 64, the SSD through
    the operator with per-token gates), a final RMS norm. ``forward(ids, attention_method)``: the
    operator's method for the SSD (``"auto"``: Chunk on a GPU) -> logits (batch, N, 256).
    ``ssd``: the blocks' SSD replaced (:class:`Mamba2Block`'s ``ssd``: mamba_ssm's kernels)."""

    kind = "Mamba-2"

    def __init__(self, dim: int = 256, layers: int = 4, heads: int = 4, d_state: int = 64,
                 ssd=None):
        super().__init__()
        self.embed = nn.Embedding(256, dim)
        # (tied to the output: at PyTorch's N(0, 1) the first logits have a standard deviation
        # of √dim and the first loss is in the hundreds, not ln 256)
        nn.init.normal_(self.embed.weight, std=dim ** -0.5)
        self.blocks = nn.ModuleList(self.block(dim, d_state, 2 * dim // heads, ssd)
                                    for _ in range(layers))
        self.norms = nn.ModuleList(nn.RMSNorm(dim) for _ in range(layers + 1))
        self.cfg = dict(name=f"byte-level {self.kind}, {layers} layers × {dim}")

    @staticmethod
    def block(dim: int, d_state: int, headdim: int, peer) -> nn.Module:
        return Mamba2Block(dim, d_state=d_state, headdim=headdim, ssd=peer)

    def forward(self, ids: torch.Tensor, attention_method="auto") -> torch.Tensor:
        x = self.embed(ids)
        for norm, block in zip(self.norms, self.blocks):
            block.method = attention_method
            x = x + block(norm(x))
        return self.norms[-1](x) @ self.embed.weight.t()


class Mamba3ByteLM(Mamba2ByteLM):
    """:class:`Mamba2ByteLM` with Mamba-3 mixers (:class:`Mamba3Block`, SISO, the trapezoidal
    rule folded into the operator with per-token gates); ``ssd``: the blocks' recurrence
    replaced (:class:`Mamba3Block`'s ``siso``: mamba_ssm's kernels)."""

    kind = "Mamba-3"

    @staticmethod
    def block(dim: int, d_state: int, headdim: int, peer) -> nn.Module:
        return Mamba3Block(dim, d_state=d_state, headdim=headdim, siso=peer)


def corpus(max_bytes: int = 2 ** 24) -> torch.Tensor:
    """Up to ``max_bytes`` bytes of the standard library's ``.py`` files, as a uint8 tensor."""
    root = sysconfig.get_paths()["stdlib"]
    chunks, total = [], 0
    for folder, dirs, files in os.walk(root):
        dirs.sort()
        dirs[:] = [d for d in dirs if d not in ("site-packages", "dist-packages", "__pycache__")]
        for name in sorted(files):
            if name.endswith(".py"):
                with open(os.path.join(folder, name), "rb") as f:
                    chunks.append(f.read())
                total += len(chunks[-1])
                if total >= max_bytes:
                    data = b"".join(chunks)[:max_bytes]
                    return torch.frombuffer(bytearray(data), dtype=torch.uint8)
    return torch.frombuffer(bytearray(b"".join(chunks)), dtype=torch.uint8)


def batches(data: torch.Tensor, batch: int, seq_len: int, steps: int, seed: int = 0):
    """``steps`` batches of ``(batch, seq_len + 1)`` windows at seeded random offsets."""
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        starts = torch.randint(0, len(data) - seq_len - 1, (batch,), generator=gen)
        yield torch.stack([data[s:s + seq_len + 1] for s in starts.tolist()]).long()
