"""ECA (Exact Causal Attention): the operator's two quadratic products with about 10 % fewer
multiplications, by the Strassen-style identities of Rybin et al., "Exact Causal Attention with
10% Fewer Operations" (``exact-causal-attention.txt``), Algorithms 1 and 2.

Both products of ``O = (B Cᵀ ⊙ M) V`` have one triangular matrix:

* Stage I (Algorithm 1): ``S = Mask(X Yᵀ)``, X and Y ``(n, k)``, the output lower-triangular.
  Cut into 4 × 4 blocks (``X_1..X_16``, ``Y_1..Y_16`` row-major, blocks ``n/4 × k/4``), its 10
  lower blocks ``S_1..S_10`` come from 24 full block products ``m_i`` and 10 products ``h_i`` of
  which only the lower triangle is needed.
* Stage II (Algorithm 2): ``O = P W`` with P lower-triangular (``P_1..P_10``, its lower blocks
  row-major), W and O cut as X: 24 full and 10 half products again (a half product here has a
  triangular diagonal block of P as its left factor).

A full product costs ``(n/4)²(k/4)`` multiply-adds and a half one about half that, so each stage
costs ``29/64 · n²k`` against ``n²k/2`` for the lower-triangular product computed directly: −9.4 %.
Computing the 10 half products by the same algorithm (``depth`` levels of recursion) tends to
``4/9 · n²k`` (−11.1 %). :func:`operation_count` counts what a call performs.

The decay is applied between the stages (``P = S ⊙ M``), so both masks and per-head γ take the
same path. The backward's products each have one triangular operand or output too (Section 2.3):
``dV = Pᵀ dO`` and ``dC = dSᵀ B`` (an upper-triangular left factor: Stage II on rows and columns
reversed), ``dP = Mask(dO Vᵀ)`` (Stage I), ``dB = dS C`` (Stage II), with ``dS = dP ⊙ M`` and S
recomputed: five ECA products (:func:`gradients`).

Shapes: B, C ``(batch, heads, N, r)``, V ``(batch, heads, N, d)``; O ``(batch, heads, N, d)``.
N is padded with zero rows to a multiple of ``4^(depth+1)`` and r, d with zero columns the same
way (zero rows and columns add nothing to any product: the result is exact; the padding is
sliced off). Memory O(N²) per (batch, head) like Vanilla: S, P and the block products are
materialised, which is why the paper expects no gain on a GPU. Time O(N²(r+d)).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from fractions import Fraction

import torch

from ._common import compute_dtype, torch_method
from ..decay.per_head import causal_mask, log_gamma
from ..registry import register
from .vanilla import check_quadratic_memory

# Algorithm 1, transcribed: (left factor in X's blocks, right factor in Y's blocks); a product
# ``Xa · Yb`` is X's block a times the transpose of Y's block b (the paper writes Kᵀ's blocks).
STAGE1_FULL = (
    ("X8+X11", "-Y2+Y3-Y4+Y8"), ("X15+X5", "Y1-Y5-Y6+Y7"), ("-X10+X16+X12", "-Y2+Y12"),
    ("X13+X9-X14", "Y9-Y6"), ("-X6+X15-X7", "Y2+Y11"), ("X6+X7-X11", "Y6+Y11"),
    ("X6+X7", "Y11"), ("-X14-X10+X6-X15+X7+X16+X12", "Y2"),
    ("X13+X9-X14-X10+X6+X7-X11", "Y6"), ("X11", "Y2-Y3+Y7+Y11+Y4-Y8"), ("X5", "Y5+Y6-Y7"),
    ("X8", "Y2-Y3+Y4"), ("X15", "-Y1+Y5+Y6+Y3-Y7+Y11"), ("X13+X9+X15", "-Y1+Y5+Y6"),
    ("X11+X16+X12", "Y2+Y4-Y8"), ("X9-X16", "Y1-Y8"), ("X10-X12", "Y12"), ("X13-X14", "Y9"),
    ("-X15+X7+X8", "-Y2+Y3"), ("X9", "Y5+Y9-Y8"), ("X9-X8+X12", "Y8"), ("X13-X5+X16", "Y1"),
    ("X16", "-Y1+Y4+Y12"), ("X14", "Y9+Y2+Y10"),
)
STAGE1_HALF = (
    ("X1", "Y1"), ("X2", "Y2"), ("X3", "Y3"), ("X4", "Y4"), ("X13", "Y13"), ("X14", "Y14"),
    ("X15", "Y15"), ("X16", "Y16"), ("X5+X7-X11", "-Y6+Y7"), ("X10", "Y6+Y10+Y12"),
)
STAGE1_OUT = (
    "h1+h2+h3+h4", "m2-m5-m7+m11+m12+m13+m19", "m1+m6-m7+m10+m11+m12+h9",
    "m1+m3+m12+m15+m16+m17+m21-m23", "m1-m4+m6-m7-m9+m10+m12+m18+m20+m21",
    "m4-m6+m7+m9-m17-m18+h10", "m2-m3-m5-m7-m8+m11+m13-m17+m22+m23",
    "m2+m4+m11+m14+m16-m18-m20+m22", "m3+m5+m7+m8+m17+m18+m24", "h5+h6+h7+h8",
)

# Algorithm 2, transcribed: (left factor in P's lower blocks, right factor in W's blocks)
STAGE2_FULL = (
    ("P3+P4+P5", "-W2+W3-W4+W8"), ("P2+P7+P8", "W1-W5-W6+W7"), ("P4-P7+P9", "-W2+W12"),
    ("-P5+P6+P8", "W9-W6"), ("-P2-P7+P9", "W2+W11"), ("P3+P5-P6", "W6+W11"),
    ("-P2-P3-P5+P6-P7+P9", "W11"), ("-P7+P9", "W2"), ("-P5+P6", "W6"),
    ("P3+P5", "W2-W3+W7+W11+W4-W8"), ("P2+P3+P7+P8", "W5+W6-W7"), ("P2+P3+P4+P5", "W2-W3+W4"),
    ("P2+P7", "-W1+W5+W6+W3-W7+W11"), ("P8", "-W1+W5+W6"), ("P4", "W2+W4-W8"),
    ("P4+P8", "W1-W8"), ("P4-P6-P7+P9", "W12"), ("P5-P6-P8+P9", "W9"), ("P2", "-W2+W3"),
    ("P5-P8", "W5+W9-W8"), ("P4+P5", "W8"), ("P7+P8", "W1"), ("-P4+P7", "-W1+W4+W12"),
    ("P9", "W9+W2+W10"),
)
STAGE2_HALF = (
    ("P3", "-W6+W7"), ("P6", "W6+W10+W12"), ("P1", "W1"), ("P1", "W2"), ("P1", "W3"),
    ("P1", "W4"), ("P10", "W13"), ("P10", "W14"), ("P10", "W15"), ("P10", "W16"),
)
STAGE2_OUT = (
    "h3", "h4", "h5", "h6", "m2+m11-m22+h1", "-m5+m6+m7+m8+m9", "-m5+m6+m7+m8+m9+m19+h1",
    "m1+m12+m19-m21", "m4+m9+m14+m16+m20+m21", "-m3-m8-m9+m17+h2", "m1-m6-m9+m10+m15-h1",
    "m3+m8+m15-m17+m21", "m4+m9+m14+m18+m22+h7", "-m4-m8-m9-m18+m24+h8",
    "m2+m5-m8+m13+m14-m19+h9", "m3+m8+m15-m16+m22+m23+h10",
)

#: the lower blocks (row, column) of a 4 × 4 block matrix in the paper's order (S_1..S_10, P_1..P_10)
LOWER = tuple((i, j) for i in range(4) for j in range(i + 1))
#: below this many rows a half product is one full product with its upper triangle dropped
LEAF = 64


def terms(expr: str) -> list[tuple[int, str]]:
    """``"-X10+X16"`` → ``[(-1, "X10"), (1, "X16")]``: (sign, block name) of each term."""
    found = re.findall(r"([+-]?)([A-Za-z]+\d+)", expr)
    if "".join(s + t for s, t in found).lstrip("+") != expr.lstrip("+"):
        raise ValueError(f"not a signed sum of blocks: {expr!r}")
    return [(-1 if s == "-" else 1, t) for s, t in found]


@dataclass
class Counter:
    """Multiply-adds of the products a call makes, three ways: ``paper`` counts a half product as
    half a full one, ``(n/4)²(k/4)/2`` (the paper's convention); ``exact`` counts the entries a
    half product needs, its diagonal included, ``n'(n'+1)/2 · k'``; ``performed`` what the
    matrix multiplications actually ran (a half product's small leaves are computed whole).
    ``adds``: block additions forming the factors and the outputs (elements)."""
    paper: Fraction = Fraction(0)
    exact: int = 0
    performed: int = 0
    adds: int = 0
    products: dict = field(default_factory=lambda: {"full": 0, "half": 0})


_COUNTER: list[Counter] = []


def _tally(kind: str, n: int, k: int) -> None:
    for c in _COUNTER:
        c.products[kind] += 1
        c.paper += n * n * k if kind == "full" else Fraction(n * n * k, 2)
        c.exact += n * n * k if kind == "full" else n * (n + 1) // 2 * k


def _matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    for c in _COUNTER:  # (per lane: operation_count runs one batch, one head)
        c.performed += a.shape[-2] * a.shape[-1] * b.shape[-1]
    return a @ b


def _combine(blocks: dict, expr: str) -> torch.Tensor:
    """The signed sum ``expr`` of named blocks (``"X8+X11"``, ``"m1-m4+h9"``)."""
    parts = terms(expr)
    sign, name = parts[0]
    out = blocks[name] if sign > 0 else -blocks[name]
    for sign, name in parts[1:]:
        out = out + blocks[name] if sign > 0 else out - blocks[name]
    for c in _COUNTER:
        c.adds += (len(parts) - 1) * out.shape[-2] * out.shape[-1]
    return out


def _blocks(x: torch.Tensor, n: int, k: int, letter: str) -> dict:
    """The 16 blocks of x ``(…, 4n, 4k)``, row-major, named ``letter + "1"`` .. (views)."""
    return {f"{letter}{4 * i + j + 1}": x[..., i * n:(i + 1) * n, j * k:(j + 1) * k]
            for i in range(4) for j in range(4)}


def _products(left: dict, right: dict, full, half, full_mm, half_mm, q: int, kk: int) -> dict:
    """The 24 full products ``m1..m24`` and 10 half products ``h1..h10`` of an algorithm, by name."""
    out = {}
    for i, (a, b) in enumerate(full):
        _tally("full", q, kk)
        out[f"m{i + 1}"] = full_mm(_combine(left, a), _combine(right, b))
    for i, (a, b) in enumerate(half):  # (tallied where they end: recursion or the standard one)
        out[f"h{i + 1}"] = half_mm(_combine(left, a), _combine(right, b))
    return out


def tri_scores(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``Mask(x yᵀ)`` by the standard algorithm: the lower triangle only, by halving (two diagonal
    halves and one full off-diagonal block) down to :data:`LEAF` rows. About ``n²k/2``
    multiply-adds: the baseline the paper counts ECA against."""
    n = x.shape[-2]
    if n <= LEAF:
        return torch.tril(_matmul(x, y.transpose(-1, -2)))
    h = n // 2
    out = x.new_zeros(*x.shape[:-1], n)
    out[..., :h, :h] = tri_scores(x[..., :h, :], y[..., :h, :])
    out[..., h:, :h] = _matmul(x[..., h:, :], y[..., :h, :].transpose(-1, -2))
    out[..., h:, h:] = tri_scores(x[..., h:, :], y[..., h:, :])
    return out


def tri_times(p: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``p w`` with p lower-triangular ``(…, n, n)`` by the standard algorithm (the zero upper
    triangle skipped by halving down to :data:`LEAF` rows): about ``n²k/2`` multiply-adds."""
    n = p.shape[-1]
    if n <= LEAF:
        return _matmul(p, w)
    h = n // 2
    top = tri_times(p[..., :h, :h], w[..., :h, :])
    bottom = _matmul(p[..., h:, :h], w[..., :h, :]) + tri_times(p[..., h:, h:], w[..., h:, :])
    return torch.cat([top, bottom], dim=-2)


def _fits(n: int, k: int, depth: int) -> bool:
    return depth >= 0 and n % 4 == 0 and k % 4 == 0 and n >= 4


def stage1(x: torch.Tensor, y: torch.Tensor, depth: int = 0) -> torch.Tensor:
    """Algorithm 1: ``Mask(x yᵀ)`` (lower-triangular ``(…, n, n)``) for x, y ``(…, n, k)`` with n
    and k multiples of 4; ``depth`` > 0 computes the 10 half products by Algorithm 1 again (their
    sizes must then divide by 4 too). Falls back to :func:`tri_scores` where the sizes do not
    divide (``depth`` < 0 means: the standard algorithm)."""
    n, k = x.shape[-2], x.shape[-1]
    if not _fits(n, k, depth):
        return tri_scores(x, y)
    q, kk = n // 4, k // 4
    named = _products(_blocks(x, q, kk, "X"), _blocks(y, q, kk, "Y"), STAGE1_FULL, STAGE1_HALF,
                      lambda a, b: _matmul(a, b.transpose(-1, -2)),
                      lambda a, b: _half(stage1, tri_scores, a, b, a.shape, depth - 1), q, kk)
    out = x.new_zeros(*x.shape[:-1], n)
    for (i, j), expr in zip(LOWER, STAGE1_OUT):
        block = _combine(named, expr)
        out[..., i * q:(i + 1) * q, j * q:(j + 1) * q] = torch.tril(block) if i == j else block
    return out


def _half(stage, standard, a, b, shape, depth):
    """A half product (Stage I: only its lower triangle is needed; Stage II: a triangular diagonal
    block of P on the left) by the same algorithm one level down (``depth`` ≥ 0 and the sizes
    ``shape[-2:]`` divide), else by the standard one, tallied there."""
    n, k = shape[-2], shape[-1]
    if _fits(n, k, depth):
        return stage(a, b, depth)
    _tally("half", n, k)
    return standard(a, b)


def stage2(p: torch.Tensor, w: torch.Tensor, depth: int = 0) -> torch.Tensor:
    """Algorithm 2: ``p w`` for p lower-triangular ``(…, n, n)`` and w ``(…, n, k)``, n and k
    multiples of 4 (else :func:`tri_times`); ``depth`` as in :func:`stage1`. Only the lower
    blocks of p are read (its upper triangle is taken to be zero)."""
    n, k = w.shape[-2], w.shape[-1]
    if not _fits(n, k, depth):
        return tri_times(p, w)
    q, kk = n // 4, k // 4
    pb = {f"P{t + 1}": p[..., i * q:(i + 1) * q, j * q:(j + 1) * q] for t, (i, j) in enumerate(LOWER)}
    named = _products(pb, _blocks(w, q, kk, "W"), STAGE2_FULL, STAGE2_HALF, _matmul,
                      lambda a, b: _half(stage2, tri_times, a, b, b.shape, depth - 1), q, kk)
    rows = [torch.cat([_combine(named, STAGE2_OUT[4 * i + j]) for j in range(4)], dim=-1)
            for i in range(4)]
    return torch.cat(rows, dim=-2)


def upper_times(u: torch.Tensor, w: torch.Tensor, depth: int = 0) -> torch.Tensor:
    """``u w`` with u upper-triangular: Algorithm 2 on rows and columns reversed
    (``J u J`` is lower-triangular and ``u w = J (J u J)(J w)``, J the reversal)."""
    return stage2(u.flip(-1, -2), w.flip(-2), depth).flip(-2)


def padded(n: int, depth: int) -> int:
    """n rounded up to a multiple of ``4^(depth+1)``: the sizes every level of the blocks divides."""
    unit = 4 ** (depth + 1)
    return -(-n // unit) * unit


def _pad(x: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    n, k = x.shape[-2:]
    if (n, k) == (rows, cols):
        return x
    return torch.nn.functional.pad(x, (0, cols - k, 0, rows - n))


def _padded_inputs(b, c, v, depth):
    n, r, d = b.shape[-2], b.shape[-1], v.shape[-1]
    np_, rp, dp = padded(n, depth), padded(r, depth), padded(d, depth)
    return _pad(b, np_, rp), _pad(c, np_, rp), _pad(v, np_, dp)


def _mask(np_: int, lg, like: torch.Tensor):
    return causal_mask(np_, lg, dtype=like.dtype, device=like.device) if lg is not None else None


def forward(b, c, v, lg, depth: int = 0) -> torch.Tensor:
    """``(B Cᵀ ⊙ M) V``: S by Algorithm 1, P = S ⊙ M, O by Algorithm 2 (accumulation dtype in,
    accumulation dtype out; ``lg`` log γ ``(H, 1, 1)`` or None). ``depth`` −1 computes both
    products by the standard lower-triangular algorithm instead (the baseline the benchmarks
    time ECA against)."""
    n, d = b.shape[-2], v.shape[-1]
    bp, cp, vp = _padded_inputs(b, c, v, depth)
    s = stage1(bp, cp, depth)
    mask = _mask(bp.shape[-2], lg, bp)
    p = s if mask is None else s * mask
    return stage2(p, vp, depth)[..., :n, :d]


def gradients(dO, b, c, v, lg, depth: int = 0):
    """``(dB, dC, dV)`` of ``O = (B Cᵀ ⊙ M) V`` by five ECA products (Section 2.3): S again by
    Algorithm 1, ``dV = Pᵀ dO``, ``dP = Mask(dO Vᵀ)``, ``dB = dS C``, ``dC = dSᵀ B`` with
    ``dS = dP ⊙ M`` (Pᵀ and dSᵀ upper-triangular: :func:`upper_times`)."""
    n, r, d = b.shape[-2], b.shape[-1], v.shape[-1]
    bp, cp, vp = _padded_inputs(b, c, v, depth)
    dop = _pad(dO, bp.shape[-2], vp.shape[-1])
    mask = _mask(bp.shape[-2], lg, bp)
    s = stage1(bp, cp, depth)
    p = s if mask is None else s * mask
    dv = upper_times(p.transpose(-1, -2), dop, depth)
    del s, p
    dp = stage1(dop, vp, depth)
    ds = dp if mask is None else dp * mask
    db = stage2(ds, cp, depth)
    dc = upper_times(ds.transpose(-1, -2), bp, depth)
    return db[..., :n, :r], dc[..., :n, :r], dv[..., :n, :d]


def operation_count(n: int, r: int, d: int | None = None, *, depth: int = 0,
                    stage: str = "both", backward: bool = False) -> Counter:
    """What one (batch, head) of a call performs, counted by running the same code on tensors
    without data (the ``meta`` device): ``stage`` ``"1"`` (``Mask(B Cᵀ)``, n × r), ``"2"``
    (``P V``, n × d) or ``"both"`` (the forward); ``backward``: the five products of
    :func:`gradients` instead. N, r, d padded as a call pads them. See :class:`Counter`."""
    d = r if d is None else d
    meta = dict(device="meta", dtype=torch.float32)
    b, c = torch.empty(1, 1, n, r, **meta), torch.empty(1, 1, n, r, **meta)
    v = torch.empty(1, 1, n, d, **meta)
    counter = Counter()
    _COUNTER.append(counter)
    try:
        if backward:
            gradients(torch.empty_like(v), b, c, v, None, depth)
        elif stage == "1":
            stage1(*_padded_inputs(b, c, v, depth)[:2], depth)
        elif stage == "2":
            bp, _, vp = _padded_inputs(b, c, v, depth)
            stage2(torch.empty(1, 1, bp.shape[-2], bp.shape[-2], **meta), vp, depth)
        else:
            forward(b, c, v, None, depth)
    finally:
        _COUNTER.remove(counter)
    return counter


def paper_fraction(depth: int) -> Fraction:
    """The paper's multiply count of one stage over ``n²k`` at recursion ``depth``: 29/64 without
    recursion, ``24/64 + 10/64 · (that of depth − 1)`` with it, tending to 4/9."""
    f = Fraction(29, 64)
    for _ in range(depth):
        f = Fraction(24, 64) + Fraction(10, 64) * f
    return f


def _gradients(dO, B, C, V, gamma, depth: int = 0, **_):
    """The registered backward (:func:`gradients` in the accumulation dtype, cast back)."""
    cd = compute_dtype(V.dtype)
    grads = gradients(dO.to(cd), B.to(cd), C.to(cd), V.to(cd), log_gamma(gamma, cd), depth)
    return tuple(g.to(x.dtype) for g, x in zip(grads, (B, C, V)))


@register("ECA", "ECA", complexity="O(N²(r+d))", language="torch",
          options={"depth": 0}, gradients=_gradients,
          summary="Vanilla's two products by Algorithms 1-2 of Exact Causal Attention: ~10 % fewer "
                  "multiplications")
@torch_method
def eca(b, c, v, decay, depth: int = 0):
    """``(B Cᵀ ⊙ M) V`` by ECA (module docstring); ``depth``: levels of recursion into the half
    products (0: none); ``decay``: its log λ."""
    check_quadratic_memory(b, "ECA", copies=4)
    return forward(b, c, v, decay.lg, depth)
