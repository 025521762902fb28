"""TransNormerLLM decoder layers (Qin et al., 2023), attention computation swappable.

Per layer: ``x + GLA(SRMSNorm(x))`` then ``x + SGLU(SRMSNorm(x))`` where
GLA (gated linear attention): q, k = swish(XW_q), swish(XW_k); v, u = XW_v, XW_u;
``O = SRMSNorm((q kᵀ ⊙ M) v) ⊙ u``, then W_o; M the per-head decay mask of λ_h.
The first layer's q and k carry LRPE (linear relative positional encoding): [x cos θi, x sin θi],
so there r = 2·d_head ≠ d. SGLU (simple GLU, no activation): ``(XW_1 ⊙ XW_2) W_3``.
Shapes: ``input_ids (batch, N)`` -> hidden states ``(batch, N, dim)``.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from ..decay.per_head import causal_mask, powers
from .attention import Float64Buffers, linear_attention
from ._generative import Generative


class SRMSNorm(nn.Module):
    """Simple RMSNorm: x / rms(x), no learned scale."""

    def __init__(self, eps: float = 1e-6):
        super().__init__()
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)


def alibi_slopes(heads: int) -> torch.Tensor:
    """s_h = 2^(-8(h+1)/H), h = 0..H-1 (Press et al., 2022; TransNormerLLM's decay rates)."""
    return torch.pow(2.0, -8.0 * torch.arange(1, heads + 1, dtype=torch.float64) / heads)


class GatedLinearAttention(Float64Buffers):
    float64_buffers = ("gamma",)

    def __init__(self, cfg: dict, layer: int):
        super().__init__()
        d, h = cfg["dim"], cfg["heads"]
        self.heads, self.head_dim = h, d // h
        self.qkvu = nn.Linear(d, 4 * d, bias=False)
        self.out = nn.Linear(d, d, bias=False)
        self.norm = SRMSNorm(cfg["eps"])
        depth = 1 - layer / (cfg["total_layers"] - 1) + 1e-5   # deeper layers decay less
        self.register_buffer("gamma", torch.exp(-alibi_slopes(h) * depth), persistent=False)
        self.lrpe = layer in cfg["lrpe_layers"]
        if self.lrpe:
            self.theta = nn.Parameter(10000 ** (-torch.arange(self.head_dim) / self.head_dim))

    def forward(self, x, method: str):
        q, k, v, u = self.project(x)
        gamma = self.gamma.to(x.device)
        o = original_blockwise(q, k, v, gamma) if method == "original" \
            else linear_attention(q, k, v, gamma, method)
        return self.finish(o, u)

    def project(self, x, positions=None):
        """q, k, v ``(b, heads, n, ·)`` and the gate u of x ``(b, n, dim)``; positions ``(n,)``
        (default 0..n-1) or ``(b, n)`` for LRPE."""
        b, n, d = x.shape
        q, k, v, u = self.qkvu(x).chunk(4, dim=-1)
        q, k = nn.functional.silu(q), nn.functional.silu(k)
        q, k, v = (t.view(b, n, self.heads, -1).transpose(1, 2) for t in (q, k, v))
        if self.lrpe:
            if positions is None:
                positions = torch.arange(n, device=x.device)
            # the angles in fp32 at least, whatever the model's dtype: positions past 256 are not
            # integers in bf16 (past 2048 in fp16), and an angle of thousands of radians loses
            # its phase
            at = torch.promote_types(x.dtype, torch.float32)
            angle = positions.to(at)[..., None] * self.theta.to(at)  # (…, n, head_dim)
            if angle.dim() == 3:
                angle = angle[:, None]
            cos, sin = angle.cos().to(x.dtype), angle.sin().to(x.dtype)
            q, k = (torch.cat([t * cos, t * sin], dim=-1) for t in (q, k))
        return q, k, v, u

    def mix(self, x, attend, positions=None):
        """The block with the attention computed by ``attend(q, k, v, gamma) -> o`` (generation)."""
        q, k, v, u = self.project(x, positions)
        return self.finish(attend(q, k, v, self.gamma.to(x.device)), u)

    def finish(self, o, u):
        b, _, n, _ = o.shape
        return self.out(self.norm(o.transpose(1, 2).reshape(b, n, -1)) * u)


def original_blockwise(q, k, v, gamma, block: int = 256):
    """TransNormerLLM's own prefill in PyTorch, as its paper describes lightning attention: a
    loop over blocks, quadratic with the decay mask inside a block, the r × d state carried
    between blocks (fp32 state)."""
    n = q.shape[2]
    lg = torch.log(gamma).view(-1, 1, 1)
    kw = dict(dtype=torch.float32, device=q.device)
    state = q.new_zeros(q.shape[0], q.shape[1], q.shape[3], v.shape[3], dtype=torch.float32)
    outs = []
    for s in range(0, n, block):
        qb, kb, vb = (t[:, :, s:s + block].float() for t in (q, k, v))
        m = qb.shape[2]
        o = (qb @ kb.transpose(-1, -2) * causal_mask(m, lg.float(), **kw)) @ vb
        o = o + (qb * powers(lg.float(), m, start=1, **kw)) @ state
        weighted = kb * powers(lg.float(), m, reverse=True, **kw)
        state = state * torch.exp(lg.float() * m) + weighted.transpose(-1, -2) @ vb
        outs.append(o.to(v.dtype))
    return torch.cat(outs, dim=2)


class SGLU(nn.Module):
    def __init__(self, d: int, hidden: int):
        super().__init__()
        self.w1, self.w2 = nn.Linear(d, hidden, bias=False), nn.Linear(d, hidden, bias=False)
        self.w3 = nn.Linear(hidden, d, bias=False)

    def forward(self, x):
        return self.w3(self.w1(x) * self.w2(x))


class TransNormerLayer(nn.Module):
    def __init__(self, cfg: dict, layer: int):
        super().__init__()
        self.norm1, self.norm2 = SRMSNorm(cfg["eps"]), SRMSNorm(cfg["eps"])
        self.attn = GatedLinearAttention(cfg, layer)
        self.glu = SGLU(cfg["dim"], cfg["glu_dim"])

    def forward(self, x, method: str):
        x = x + self.attn(self.norm1(x), method)
        return x + self.glu(self.norm2(x))

    def mixed(self, x, attend, positions=None):
        x = x + self.attn.mix(self.norm1(x), attend, positions)
        return x + self.glu(self.norm2(x))


class TransNormerLLM(Generative, nn.Module):
    """Embedding, ``cfg["layers"]`` TransNormer layers, final SRMSNorm -> hidden states."""

    def __init__(self, cfg: dict):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg["vocab"], cfg["dim"])
        nn.init.normal_(self.embed.weight, std=1 / math.sqrt(cfg["dim"]))
        self.layers = nn.ModuleList(TransNormerLayer(cfg, i) for i in range(cfg["layers"]))
        self.norm = SRMSNorm(cfg["eps"])

    def embed_tokens(self, input_ids):
        return self.embed(input_ids)

    def forward(self, input_ids, attention_method: str = "auto"):
        x = self.embed_tokens(input_ids)
        for layer in self.layers:
            x = layer(x, attention_method)
        return self.norm(x)
