"""A decoder language model as people build them, its token mixer swappable: pre-norm residual
blocks (RMSNorm, a token mixer, RMSNorm, a SwiGLU MLP), untied input embedding and output head.

The mixer sub-layer is one of
* :class:`AttentionMixer`: a fused q/k/v projection whose time-major ``(batch, N, heads, d)``
  views go to ``mix(q, k, v, g)`` (any attention-like op: this project's operator, its drop-in,
  flash-linear-attention, softmax attention), then the out-projection; with ``gates``, also
  GLA's low-rank per-token log gates ``g`` (≤ 0): one per head and token ``(batch, N, heads)``
  (simple GLA, Mamba-2) or one per key channel ``(batch, N, heads, d)`` (GLA);
* :class:`~leetrepro.models.mamba2.Mamba2Block`: Mamba-2's mixer (in-projection, causal
  convolution, the SSD, gated norm, out-projection), as hybrid models interleave it with MLPs.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn


class AttentionMixer(nn.Module):
    """``forward(x (b, N, dim)) -> (b, N, dim)``: ``mix(q, k, v, g)`` on the views of one fused
    projection. ``gates``: None (``g`` None), ``"head"`` (``g`` ``(b, N, heads)``) or ``"key"``
    (``g`` ``(b, N, heads, dim / heads)``), float32, as GLA makes them: a rank-16 projection,
    log-sigmoid, divided by ``gate_temperature`` (16)."""

    def __init__(self, dim: int, heads: int, mix: Callable, *, gates: str | None = None,
                 gate_temperature: float = 16.0):
        super().__init__()
        if dim % heads:
            raise ValueError(f"dim {dim} must be a multiple of heads {heads}")
        if gates not in (None, "head", "key"):
            raise ValueError(f"gates must be None, 'head' or 'key', got {gates!r}")
        self.heads, self.mix, self.gates, self.gate_temperature = heads, mix, gates, gate_temperature
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.gate = None if gates is None else nn.Sequential(
            nn.Linear(dim, 16, bias=False), nn.Linear(16, heads if gates == "head" else dim))
        self.out = nn.Linear(dim, dim, bias=False)

    def inputs(self, x: torch.Tensor) -> tuple:
        """``(q, k, v, g)`` that ``mix`` takes: the projection's ``(b, N, heads, d)`` views and
        the gates (None without them)."""
        b, n, dim = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, dim // self.heads).unbind(2)
        g = None
        if self.gate is not None:
            g = nn.functional.logsigmoid(self.gate(x).float()) / self.gate_temperature
            g = g.view(b, n, self.heads, -1) if self.gates == "key" else g
        return q, k, v, g

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.mix(*self.inputs(x)).reshape(x.shape))


class Block(nn.Module):
    """``x + mixer(norm(x))``, then ``x + down(silu(gate) · up)`` of ``norm(x)`` (SwiGLU)."""

    def __init__(self, dim: int, mlp: int, mixer: nn.Module):
        super().__init__()
        self.norm1, self.norm2 = nn.RMSNorm(dim), nn.RMSNorm(dim)
        self.mixer = mixer
        self.up = nn.Linear(dim, 2 * mlp, bias=False)
        self.down = nn.Linear(mlp, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.mixer(self.norm1(x))
        a, c = self.up(self.norm2(x)).chunk(2, -1)
        return x + self.down(nn.functional.silu(a) * c)


class DecoderLM(nn.Module):
    """``forward(ids (b, N) int64) -> logits (b, N, vocab)``. ``make_mixer()`` builds each
    block's mixer (called ``layers`` times); ``mix`` is shorthand for
    ``AttentionMixer(dim, heads, mix, gates=gates)``.

    ``forward(ids, blocks=...)`` runs other modules over the same weights in the blocks' place
    (their ``torch.compile`` wrappers, say)."""

    def __init__(self, mix: Callable | None = None, *, vocab: int, dim: int, layers: int,
                 heads: int, mlp: int, gates: str | None = None,
                 make_mixer: Callable[[], nn.Module] | None = None, **_):
        super().__init__()
        if (mix is None) == (make_mixer is None):
            raise ValueError("give exactly one of mix (an attention-like op) and make_mixer")
        make_mixer = make_mixer or (lambda: AttentionMixer(dim, heads, mix, gates=gates))
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(Block(dim, mlp, make_mixer()) for _ in range(layers))
        self.norm = nn.RMSNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, ids: torch.Tensor, blocks=None) -> torch.Tensor:
        x = self.embed(ids)
        for block in self.blocks if blocks is None else blocks:
            x = block(x)
        return self.head(self.norm(x))
