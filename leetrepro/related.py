"""Other papers' attention through the operator: which of their methods are ``(B Cᵀ ⊙ M) V``, and
how.

* **Normalised linear attention with f(x) = 1 + x** (arXiv 2510.21956,
  ``linear-attention-gpu-kernel.txt``): ``o_i = Σ_{j≤i} f(q_i·k_j) v_j / Σ_{j≤i} f(q_i·k_j)``.
  With ``f(x) = c + x`` both sums are the operator (0-1 mask): the numerator is
  ``c·cumsum(V) + op(Q, K, V)``, the denominator ``c·(i+1) + q_i·cumsum(K)_i``; in one call,
  ``B = [√c, Q]``, ``C = [√c, K]``, ``V = [V, 1]`` gives both (:func:`normalized_via_ones`).
  :func:`normalized_linear_attention` runs the numerator through the operator at r and d
  themselves and the denominator as a running sum (a ones column would make d + 1, which pads
  the kernels' tiles), saving only the inputs, the output and the N denominators per head;
  on a GPU its forward is one sweep of Chunk's portable kernel carrying the denominator, and
  its backward the operator's between two Triton passes (``methods/normalizer.py``).
  :func:`normalize_rows` is the paper's row normalisation of q and k, one pass each way.
* **Linear Transformer / Performer** (``fast-attention-blog.txt``): the same with ``c = 0`` and a
  feature map applied to Q and K first (``elu + 1``; Performer's random features likewise):
  :func:`linear_transformer`.
* **RWKV's WKV** (the blog's numerator/denominator recurrence with decay ``w`` and bonus ``u``):
  each channel is a head with r = 1, ``γ = exp(−exp(w))``, ``C = exp(k)``, ``V = [v, 1]``; the
  bonus term is elementwise: :func:`wkv`.
* **AFT-simple** reduces too, degenerately: γ = 1, r = d = 1 per channel, a running sum that the
  operator adds nothing to (:func:`aft_simple`). AFT-full's learned pairwise bias ``w[t, t']`` is
  an arbitrary T × T matrix, neither low-rank nor ``γ^(t−t')``: it reduces only where
  ``w[t, t'] = (t − t')·log γ`` (which is RWKV). Linformer projects along the sequence (not
  causal), memory-efficient and flash attention compute softmax attention, whose ``exp(q·k)``
  has no finite low-rank form: none of these is the operator.

Every function here takes the layout the API takes, ``(batch, heads, N, ·)`` (any strides), and a
``method`` for the operator (``"auto"`` by default). The direct forms the reductions are checked
against (``*_direct``) are written from the papers' equations, quadratic or recurrent, in the
inputs' dtype (float64 makes them oracles).
"""
from __future__ import annotations

import torch

from . import ops
from ._direct import apply, direct, refuse_transforms
from .api import causal_linear_decoder
from .methods import normalizer
from .methods.normalizer import (normalized_epilogue, normalized_output, normalized_prologue,
                                 on_kernels)


# (eager calls skip the dispatcher: leetrepro._direct)
_output, _prologue, _epilogue, _in_sweep, _rows, _rows_back, _in_sweeps, _prologue_rows = (
    direct(op) for op in (normalized_output, normalized_prologue, normalized_epilogue,
                          normalizer.normalized_in_sweep, normalizer.row_normalized,
                          normalizer.row_normalized_backward,
                          normalizer.normalized_grads_in_sweeps,
                          normalizer.normalized_prologue_rows))

#: rows a running sum takes in one piece (:func:`_cumsum`)
SCAN_BLOCK = 64


def _cumsum(x: torch.Tensor, reverse: bool = False) -> torch.Tensor:
    """Running sum along N (dim −2) in float32 or wider (a bf16 running sum of thousands of rows
    loses their low bits), in two levels: within blocks of :data:`SCAN_BLOCK` rows, then across
    the blocks' totals. (One scan along a dimension that is not the innermost keeps one GPU thread
    per column walking all N rows: 1.7 ms for b2 × 16 heads × 4096 × 128 on an H100, against
    tens of µs in blocks.)"""
    x = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    if reverse:
        x = x.flip(-2)
    n = x.shape[-2]
    if n <= SCAN_BLOCK:
        y = x.cumsum(-2)
    else:
        pad = (-n) % SCAN_BLOCK
        y = torch.nn.functional.pad(x, (0, 0, 0, pad)).unflatten(-2, (-1, SCAN_BLOCK)).cumsum(-2)
        ends = y[..., -1, :]
        y = (y + (ends.cumsum(-2) - ends).unsqueeze(-2)).flatten(-3, -2)[..., :n, :]
    return y.flip(-2) if reverse else y


def _positions(n: int, like: torch.Tensor) -> torch.Tensor:
    return torch.arange(1, n + 1, device=like.device, dtype=like.dtype).view(n, 1)


#: where a row's norm is clamped by :func:`normalize_rows` (``torch.nn.functional.normalize``'s)
ROW_EPS = 1e-12


def _unnormalized(g: torch.Tensor, y: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """x's gradient from y's (g), ``y = x / s`` by rows with s ``(…, N, 1)`` clamped at
    :data:`ROW_EPS` (PyTorch's composition of the epilogue's ``ROWS_NORMALIZED``)."""
    g32, y32 = g.to(s.dtype), y.to(s.dtype)
    along = torch.where(s > ROW_EPS, (g32 * y32).sum(-1, keepdim=True), 0.0)
    return ((g32 - y32 * along) / s).to(g.dtype)


class _Normalized(torch.autograd.Function):
    """``num / den`` with ``num = c·cumsum(V) + op(Q, K, V)``, ``den = c·(i+1) + q_i·cumsum(K)_i``;
    saves Q, K, V, O and den (N per head), and computes the operator's gradients without running
    its forward again (:func:`leetrepro.ops.gradients`). With ``rows`` (the passes' kernels
    only), Q and K are first normalised by rows here (:func:`normalize_rows`), their norms saved
    (N per head each) and the backward's last pass carries dq and dk back through it."""

    @staticmethod
    def forward(ctx, q, k, v, c, eps, rows, method, options):
        ctx.args = (c, method, options)
        norms = (None, None)
        if rows:
            (q, sq), (k, sk) = _rows(q, ROW_EPS), _rows(k, ROW_EPS)
            norms = (sq.unsqueeze(-1), sk.unsqueeze(-1))
        if normalizer.in_sweep(q, k, v, method, options):  # (one sweep, normaliser and all)
            o, den = _in_sweep(q, k, v, c, eps)
            ctx.save_for_backward(q, k, v, o, den.unsqueeze(-1), *norms)
            return o
        if on_kernels(q, k, v):  # (the running sums, the division and the casts: two passes)
            num = causal_linear_decoder(q, k, v, method=method, **options)
            o, den = _output(num, q, k, v, c, eps)
            ctx.save_for_backward(q, k, v, o, den.unsqueeze(-1), *norms)
            return o
        acc = torch.promote_types(v.dtype, torch.float32)
        num = causal_linear_decoder(q, k, v, method=method, **options).to(acc)
        if c:
            num = num + c * _cumsum(v)
        kc = _cumsum(k)
        den = (q.to(acc) * kc).sum(-1, keepdim=True) + eps
        if c:
            den = den + c * _positions(q.shape[-2], den)
        o = (num / den).to(v.dtype)
        ctx.save_for_backward(q, k, v, o, den, *norms)
        return o

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, do):
        q, k, v, o, den, sq, sk = ctx.saved_tensors
        c, method, options = ctx.args
        need = ctx.needs_input_grad[:3]
        if method == "auto" and not options and normalizer.grads_in_sweeps(q, k, v) and \
                on_kernels(do):
            # (one pass before three sweeps that carry the running sums' terms, then with rows
            # their normalisation's backward, a pass each)
            dnum, dden = _prologue_rows(do, o, den[..., 0])
            grads = list(_in_sweeps(dnum, dden, q, k, v, c, list(need)))
            for i, (y, s) in enumerate(((q, sq), (k, sk))):
                if s is not None and need[i]:
                    grads[i] = _rows_back(grads[i], y, s[..., 0], ROW_EPS)
            return (*(g if w else None for g, w in zip(grads, need)), None, None, None, None,
                    None)
        if on_kernels(q, k, v, do):  # (one pass before the operator's backward, one after)
            dnum, dden, sums = _prologue(do, o, den[..., 0], q, k)
            grads = ops.gradients(dnum, q, k, v, method=method, need=need, **options)
            del dnum  # (freed before the last pass, which adds its terms in place)
            grads = [g if w else None for g, w in zip(grads, need)]
            _epilogue(*grads, q, k, do, den[..., 0], dden, sums,
                      *(None if s is None else s[..., 0] for s in (sq, sk)), c, ROW_EPS)
            return (*grads, None, None, None, None, None)
        dnum = do.to(den.dtype) / den                                  # (…, N, d)
        dden = -(dnum * o.to(den.dtype)).sum(-1, keepdim=True)          # (…, N, 1)
        dq, dk, dv = ops.gradients(dnum.to(v.dtype), q, k, v, method=method, need=need, **options)
        if need[0]:
            dq = (dq.to(den.dtype) + dden * _cumsum(k)).to(q.dtype)
        if need[1]:
            dk = (dk.to(den.dtype) + _cumsum(dden * q.to(den.dtype), reverse=True)).to(k.dtype)
        if need[2] and c:
            dv = (dv.to(den.dtype) + c * _cumsum(dnum, reverse=True)).to(v.dtype)
        if sq is not None:
            dq = _unnormalized(dq, q, sq) if need[0] else dq
            dk = _unnormalized(dk, k, sk) if need[1] else dk
        return (dq if need[0] else None, dk if need[1] else None, dv if need[2] else None,
                None, None, None, None, None)


def normalized_linear_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
                                constant: float = 1.0, eps: float = 1e-6,
                                normalize_rows: bool = False, method: str = "auto",
                                **options) -> torch.Tensor:
    """Causal normalised linear attention with ``f(x) = constant + x`` (the kernel paper's
    ``1 + x`` by default): ``o_i = Σ_{j≤i} f(q_i·k_j) v_j / (Σ_{j≤i} f(q_i·k_j) + eps)``.

    q, k ``(batch, heads, N, r)``, v ``(batch, heads, N, d)``, one floating dtype; returns
    ``(batch, heads, N, d)`` in v's dtype. No scale is applied to q·k (the paper normalises the
    rows of q and k first, its Eq. 22, which also keeps every ``1 + q·k`` ≥ 0 and the
    denominators positive: ``normalize_rows=True`` does it inside the layer, as
    :func:`normalize_rows` of each would, with their backward folded into the layer's last pass
    on a GPU). Differentiable in q, k, v.
    Time O(N r d) through the operator (``method``, ``options``: as
    :func:`leetrepro.causal_linear_decoder`). On a GPU the forward is one sweep of Chunk's
    portable kernel that carries the normaliser (``method="auto"``, no options, r and d at most
    128: :data:`leetrepro.methods.normalizer.IN_SWEEP`), else the operator and two passes; the
    backward is the operator's backward between two passes, beside the chunks' small scans
    (:mod:`leetrepro.methods.normalizer`; PyTorch's composition elsewhere). Memory: the
    inputs (q and k normalised, where the layer normalises them), the output and N
    denominators per head are saved (and N norms per head for each of q and k where it
    normalises them), nothing of size N × N or N × r × d.
    Compiles into one graph (``torch.compile(fullgraph=True)``: the backward goes through the
    operator's backward op and the passes' custom ops)."""
    refuse_transforms("normalized_linear_attention")
    rows = normalize_rows and on_kernels(q, k, v)
    if normalize_rows and not rows:
        q, k = (torch.nn.functional.normalize(t, dim=-1, eps=ROW_EPS) for t in (q, k))
    return apply(_Normalized, q, k, v, float(constant), float(eps), rows, method, options)


class _RowNormalized(torch.autograd.Function):
    """x / max(‖x‖₂, eps) by rows, one pass each way; saves the output and one float32 norm a
    row (the output is what the layer after it saves too: no second copy)."""

    @staticmethod
    def forward(ctx, x, eps):
        y, s = _rows(x, eps)
        ctx.eps = eps
        ctx.save_for_backward(y, s)
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy):
        y, s = ctx.saved_tensors
        return _rows_back(dy, y, s, ctx.eps), None


def normalize_rows(x: torch.Tensor, eps: float = ROW_EPS) -> torch.Tensor:
    """``x / max(‖x‖₂, eps)`` over the last dimension, as ``torch.nn.functional.normalize(x,
    dim=-1, eps=eps)``: the kernel paper's row-normalised q and k (its Eq. 22), which keep every
    ``1 + q·k`` ≥ 0. Any shape ``(..., r)``, fp16/bf16/fp32; the result in x's dtype and layout.
    On a GPU one Triton pass forward and one backward (norms in float32; saved: the result and
    one float32 a row), where PyTorch's composition takes about eight passes, each strided
    where the norm is broadcast; elsewhere PyTorch's own. Differentiable once."""
    if normalizer.on_row_norm_kernels(x):
        refuse_transforms("normalize_rows")
        return apply(_RowNormalized, x, float(eps))
    return torch.nn.functional.normalize(x, dim=-1, eps=eps)


def normalized_via_ones(q, k, v, *, constant: float = 1.0, eps: float = 1e-6,
                        method: str = "auto", **options) -> torch.Tensor:
    """:func:`normalized_linear_attention` in one call of the operator, as the identity reads:
    ``B = [√c, q]``, ``C = [√c, k]`` (then ``B Cᵀ = c + q kᵀ``) and ``V = [v, 1]``, whose last
    output column is the denominator. Plain autograd through the operator (r + 1, d + 1)."""
    root = float(constant) ** 0.5
    ones = q.new_full((*q.shape[:-1], 1), root)
    out = causal_linear_decoder(torch.cat([ones, q], -1), torch.cat([ones, k], -1),
                                torch.cat([v, torch.ones_like(v[..., :1])], -1), method=method,
                                **options)
    return (out[..., :-1] / (out[..., -1:] + eps)).to(v.dtype)


def normalized_direct(q, k, v, *, constant: float = 1.0, eps: float = 1e-6) -> torch.Tensor:
    """The definition, quadratic: ``A = tril(constant + q kᵀ)``, ``o = A v / (A·1 + eps)``."""
    a = torch.tril(constant + q @ k.transpose(-1, -2))
    return (a @ v) / (a.sum(-1, keepdim=True) + eps)


#: the feature maps of the linear-transformer family (positive, so every denominator is)
FEATURE_MAPS = {"elu+1": lambda x: torch.nn.functional.elu(x) + 1,
                "relu": torch.relu,
                "exp": lambda x: torch.exp(x - x.amax(-1, keepdim=True).detach())}


def linear_transformer(q, k, v, *, feature_map: str = "elu+1", eps: float = 1e-6,
                       method: str = "auto", **options) -> torch.Tensor:
    """Causal linear attention of Katharopoulos et al. (and Performer with its features):
    ``o_i = φ(q_i) Σ_{j≤i} φ(k_j)ᵀ v_j / (φ(q_i) · Σ_{j≤i} φ(k_j) + eps)``, ``φ`` from
    :data:`FEATURE_MAPS`. Shapes and cost as :func:`normalized_linear_attention` (``c = 0``)."""
    phi = FEATURE_MAPS[feature_map]
    return normalized_linear_attention(phi(q), phi(k), v, constant=0.0, eps=eps, method=method,
                                       **options)


def linear_transformer_direct(q, k, v, *, feature_map: str = "elu+1",
                              eps: float = 1e-6) -> torch.Tensor:
    """The recurrent form of the blog's code: running sums of the outer products
    ``φ(k_j) v_jᵀ`` (N × r × d memory) and of ``φ(k_j)``."""
    phi = FEATURE_MAPS[feature_map]
    fq, fk = phi(q), phi(k)
    kv = torch.einsum("bhnr,bhnd->bhnrd", fk, v).cumsum(2)
    num = torch.einsum("bhnr,bhnrd->bhnd", fq, kv)
    den = (fq * fk.cumsum(2)).sum(-1, keepdim=True) + eps
    return num / den


def _per_channel(k: torch.Tensor, v: torch.Tensor, gamma, method: str, options: dict):
    """``Σ_{j≤i} γ^(i−j) e^{k_j − m} [v_j, 1]`` for every channel: the operator with one head per
    channel (r = 1, d = 2). k, v ``(batch, T, D)``; m the channel's largest k (a factor common to
    numerator and denominator, taken out so that nothing overflows). Returns the numerator,
    the denominator ``(batch, T, D)`` each, and m ``(batch, 1, D)``."""
    m = k.amax(1, keepdim=True).detach()
    ek = torch.exp(k - m)
    heads = lambda x: x.transpose(1, 2).unsqueeze(-1)  # noqa: E731  (batch, D, T, 1)
    V = torch.cat([heads(v), torch.ones_like(heads(v))], -1)
    out = causal_linear_decoder(torch.ones_like(heads(ek)), heads(ek), V, gamma, method=method,
                                **options)
    return out[..., 0].transpose(1, 2), out[..., 1].transpose(1, 2), m


def wkv(w: torch.Tensor, u: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
        method: str = "auto", **options) -> torch.Tensor:
    """RWKV's WKV through the operator: ``wkv_i = (e^{u+k_i} v_i + α_{i−1}) / (e^{u+k_i} +
    β_{i−1})`` with ``α_i = Σ_{j≤i} e^{−(i−j)e^w + k_j} v_j`` and β the same without v (the
    blog's equations; ``w`` its ``time_decay``, per-step decay ``e^{−e^w}``; ``u`` its
    ``time_first``).

    w, u ``(D,)``; k, v ``(batch, T, D)``; returns ``(batch, T, D)``. Each channel is a head of
    the operator with ``γ = exp(−exp(w))`` (fixed: no gradient to w; k, v and u are
    differentiable). α and β are scaled by ``e^{−max_j k_j}`` per channel: exact in exact
    arithmetic, and finite however large k; a channel whose k spans more than the dtype's
    exponent range (~80 in float32) within one sequence loses the smallest terms to underflow
    (RWKV's recurrent kernels rescale as they go; the operator's one scale cannot)."""
    gamma = torch.exp(-torch.exp(w.detach().double())).clamp_min(torch.finfo(torch.float64).tiny)
    num, den, m = _per_channel(k, v, gamma, method, options)
    prev = lambda x: torch.nn.functional.pad(x[:, :-1], (0, 0, 1, 0))  # noqa: E731  (α_{i−1})
    bonus = torch.exp(u + k - m)
    return (bonus * v + prev(num)) / (bonus + prev(den))


def wkv_direct(w, u, k, v) -> torch.Tensor:
    """WKV by the blog's recurrence, one step per token (float64 makes it the oracle):
    ``α_i = e^{−e^w} α_{i−1} + e^{k_i} v_i``, ``β_i = e^{−e^w} β_{i−1} + e^{k_i}``."""
    decay = torch.exp(-torch.exp(w))
    alpha = beta = torch.zeros_like(k[:, 0])
    out = []
    for i in range(k.shape[1]):
        ek = torch.exp(k[:, i])
        eu = torch.exp(u + k[:, i])
        out.append((eu * v[:, i] + alpha) / (eu + beta))
        alpha, beta = decay * alpha + ek * v[:, i], decay * beta + ek
    return torch.stack(out, 1)


def wkv_quadratic(w, u, k, v) -> torch.Tensor:
    """WKV in the blog's parallel form: the T × T × D weights ``e^{−(i−1−j)e^w + k_j}`` for j < i
    materialised (its ``run_wkv``), then the bonus term."""
    t = k.shape[1]
    i = torch.arange(t, device=k.device)
    lag = (i[:, None] - 1 - i[None, :]).to(k.dtype)                 # (T, T): i − 1 − j
    expo = -torch.exp(w) * lag[..., None] + k[:, None, :, :]          # (batch, T, T, D)
    weight = torch.where((i[:, None] > i[None, :])[..., None], torch.exp(expo), 0)
    eu = torch.exp(u + k)
    return (eu * v + (weight * v[:, None]).sum(2)) / (eu + weight.sum(2))


def aft_simple(q, k, v, *, method: str = "auto", **options) -> torch.Tensor:
    """AFT-simple, causal: ``y_t = σ(q_t) ⊙ Σ_{t'≤t} e^{k_t'} ⊙ v_t' / Σ_{t'≤t} e^{k_t'}``. q, k, v
    ``(batch, T, D)``. Through the operator with one head per channel, γ = 1, r = d = 1: a
    running sum, which is all the operator computes here."""
    num, den, _ = _per_channel(k, v, None, method, options)
    return torch.sigmoid(q) * num / den


def aft_simple_direct(q, k, v) -> torch.Tensor:
    """AFT-simple by running sums (its own linear-time form)."""
    m = k.amax(1, keepdim=True)
    ek = torch.exp(k - m)
    return torch.sigmoid(q) * (ek * v).cumsum(1) / ek.cumsum(1)
