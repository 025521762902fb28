"""RetNet decoder layers (Sun et al., 2023), as in the syncdoth/RetNet code toy-retnet-1.3B uses;
the retention computation swappable.

Per layer: ``x + MSR(LN(x))`` then ``x + FFN(LN(x))``. Multi-scale retention: q = XW_q,
k = XW_k / sqrt(d_k), both rotated by position (xPos-style, θ_i = 10000^(-i/(d_k/2)));
v = XW_v (d_v = value_factor · d / H), g = XW_g; γ_h = 1 - 2^(-5-h).
``"original"``: the parallel form with the decay matrix D normalised by the square root of its
row sums and the scores by their absolute row sums (clamped to [1, 5e4]), O(N²) memory.
Any other method: the bare operator with D's row normalisation folded into the rows of q
(s_i = (Σ_{j≤i} γ^(i-j))^(-1/2)); the score normalisation is a positive per-row scale that the
per-head group norm that follows removes, so both paths agree up to that norm's eps.
Then a per-head RMS group norm, ``swish(g) ⊙ O`` and W_o. FFN: fc1, gelu, LayerNorm (subln), fc2.
Shapes: ``input_ids (batch, N)`` -> hidden states ``(batch, N, dim)``.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from ..decay.per_head import causal_mask
from .attention import Float64Buffers, linear_attention
from ._generative import Generative


def _rotate(x, sin, cos):
    # pairs (x0, x1) -> (x0 cos - x1 sin, x1 cos + x0 sin)
    x1, x2 = x[..., ::2], x[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)


class MultiScaleRetention(Float64Buffers):
    float64_buffers = ("gamma", "freq")

    def __init__(self, cfg: dict):
        super().__init__()
        d, h = cfg["dim"], cfg["heads"]
        dv = d * cfg["value_factor"]
        self.heads, self.dk, self.dv = h, d // h, dv // h
        self.q, self.k = nn.Linear(d, d, bias=False), nn.Linear(d, d, bias=False)
        self.v, self.g = nn.Linear(d, dv, bias=False), nn.Linear(d, dv, bias=False)
        self.out = nn.Linear(dv, d, bias=False)
        self.eps = cfg["eps"]
        self.register_buffer("gamma", 1 - torch.pow(2.0, -5.0 - torch.arange(h, dtype=torch.float64)),
                             persistent=False)
        self.register_buffer("freq", 10000 ** (-torch.arange(self.dk // 2, dtype=torch.float64)
                                                 / (self.dk // 2)), persistent=False)

    def forward(self, x, method: str):
        q, k, v, g = self.project(x)
        gamma = self.gamma.to(x.device)
        if method == "original":
            o = self._parallel(q, k, v, gamma)
        else:
            n = x.shape[1]
            o = linear_attention(self.row_scaled(q, torch.arange(n, device=x.device)), k, v,
                                 gamma, method)
        return self.finish(o, g)

    def project(self, x, positions=None):
        """q, k (rotated by position), v ``(b, heads, n, ·)`` and the gate g of x ``(b, n, dim)``;
        positions ``(n,)`` (default 0..n-1) or ``(b, n)``."""
        b, n, _ = x.shape
        q, k, v, g = self.q(x), self.k(x) / math.sqrt(self.dk), self.v(x), self.g(x)
        q, k, v = (t.view(b, n, self.heads, -1).transpose(1, 2) for t in (q, k, v))
        if positions is None:
            positions = torch.arange(n, device=x.device)
        pos = positions.to(torch.float64)[..., None] * self.freq.to(x.device)
        if pos.dim() == 3:
            pos = pos[:, None]
        sin, cos = pos.sin().to(x.dtype), pos.cos().to(x.dtype)
        return _rotate(q, sin, cos), _rotate(k, sin, cos), v, g

    def row_scaled(self, q, positions):
        """q with D's row normalisation folded in: row i times (Σ_{j≤i} γ^(i-j))^(-1/2)."""
        # Σ_{j≤i} γ^(i-j) = (1 - γ^(i+1)) / (1 - γ), in float64 via expm1 (γ is close to 1)
        lg = torch.log(self.gamma.to(q.device)).view(-1, 1)               # (heads, 1)
        i1 = positions.to(torch.float64) + 1
        if i1.dim() == 2:                                                 # (b, n): per sequence
            rowsum = torch.expm1(lg[None] * i1[:, None]) / torch.expm1(lg)[None]
        else:
            rowsum = torch.expm1(lg * i1) / torch.expm1(lg)
        return q * rowsum.rsqrt().to(q.dtype).unsqueeze(-1)

    def mix(self, x, attend, positions=None):
        """The block with the retention computed by ``attend(q, k, v, gamma) -> o`` (generation:
        q carries D's row normalisation, as the non-original path does)."""
        q, k, v, g = self.project(x, positions)
        if positions is None:
            positions = torch.arange(x.shape[1], device=x.device)
        return self.finish(attend(self.row_scaled(q, positions), k, v, self.gamma.to(x.device)), g)

    def finish(self, o, g):
        b, _, n, _ = o.shape
        o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + self.eps)  # group norm, per head
        return self.out(nn.functional.silu(g) * o.transpose(1, 2).reshape(b, n, -1))

    @staticmethod
    def _parallel(q, k, v, gamma):
        d = causal_mask(q.shape[2], torch.log(gamma).view(-1, 1, 1), dtype=torch.float64,
                        device=q.device)
        d = (d / d.sum(-1, keepdim=True).sqrt()).to(q.dtype)
        s = q @ k.transpose(-1, -2) * d
        s = s / s.detach().abs().sum(-1, keepdim=True).clamp(min=1, max=5e4)
        return s @ v


class FFN(nn.Module):
    def __init__(self, d: int, hidden: int, eps: float):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d, hidden), nn.Linear(hidden, d)
        self.norm = nn.LayerNorm(hidden, eps=eps)

    def forward(self, x):
        return self.fc2(self.norm(nn.functional.gelu(self.fc1(x))))


class RetNetLayer(nn.Module):
    def __init__(self, cfg: dict):
        super().__init__()
        self.norm1 = nn.LayerNorm(cfg["dim"], eps=cfg["eps"])
        self.norm2 = nn.LayerNorm(cfg["dim"], eps=cfg["eps"])
        self.msr = MultiScaleRetention(cfg)
        self.ffn = FFN(cfg["dim"], cfg["ffn_dim"], cfg["eps"])

    def forward(self, x, method: str):
        x = x + self.msr(self.norm1(x), method)
        return x + self.ffn(self.norm2(x))

    def mixed(self, x, attend, positions=None):
        x = x + self.msr.mix(self.norm1(x), attend, positions)
        return x + self.ffn(self.norm2(x))


class RetNet(Generative, nn.Module):
    """Embedding (× sqrt(dim), LayerNorm), ``cfg["layers"]`` RetNet layers, final LayerNorm."""

    def __init__(self, cfg: dict):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg["vocab"], cfg["dim"])
        nn.init.normal_(self.embed.weight, std=1 / math.sqrt(cfg["dim"]))
        self.embed_norm = nn.LayerNorm(cfg["dim"], eps=cfg["eps"])
        self.layers = nn.ModuleList(RetNetLayer(cfg) for _ in range(cfg["layers"]))
        self.norm = nn.LayerNorm(cfg["dim"], eps=cfg["eps"])

    def embed_tokens(self, input_ids):
        return self.embed_norm(self.embed(input_ids) * math.sqrt(self.cfg["dim"]))

    def forward(self, input_ids, attention_method: str = "auto"):
        x = self.embed_tokens(input_ids)
        for layer in self.layers:
            x = layer(x, attention_method)
        return self.norm(x)
