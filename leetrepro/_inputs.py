"""Input checking shared by every entry point (the dtypes it takes: :mod:`leetrepro._dtypes`;
heads in groups: :mod:`leetrepro._groups`; packed sequences' offsets: :mod:`leetrepro.api`).

Conventions (the whole package follows them):

* ``B, C``: ``(batch, heads, N, r)``; ``V``: ``(batch, heads, N, d)``; one floating dtype, one device.
  B and C may hold *groups* instead, ``(batch, groups, N, r)`` with groups dividing heads: head h
  reads group ``h // (heads / groups)`` (Mamba-2's grouped B and C, grouped-query attention);
  methods with ``Method.groups`` read them in place, others get them expanded.
* The decay rules, ``gamma`` per head and ``g`` per token, are checked and normalised by their
  own modules (:mod:`leetrepro.decay`).
"""
from __future__ import annotations

import torch

from ._dtypes import FLOAT_DTYPES


def check_4d(named) -> None:
    """Each ``(name, tensor, layout)`` of ``named`` a 4-D torch.Tensor, else a TypeError/ValueError
    naming the argument and the layout it should have."""
    for name, t, layout in named:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D {layout}, got shape {tuple(t.shape)}")


def check_qkv(B: torch.Tensor, C: torch.Tensor, V: torch.Tensor) -> None:
    """Raise a ValueError/TypeError naming the problem and the shapes."""
    check_4d((("B", B, "(batch, heads, N, r)"), ("C", C, "(batch, heads, N, r)"),
              ("V", V, "(batch, heads, N, d)")))
    shapes = f"B {tuple(B.shape)}, C {tuple(C.shape)}, V {tuple(V.shape)}"
    for axis, label in ((0, "batch"), (2, "N (sequence length)")):
        if not B.shape[axis] == C.shape[axis] == V.shape[axis]:
            raise ValueError(f"B, C and V disagree on {label} (dim {axis}): {shapes}")
    if B.shape[1] != C.shape[1] or (V.shape[1] != B.shape[1] and
                                    (B.shape[1] == 0 or V.shape[1] % B.shape[1])):
        raise ValueError(f"B, C and V disagree on heads (dim 1): B and C need V's heads, or both "
                         f"the same number of groups dividing them: {shapes}")
    if B.shape[3] != C.shape[3]:
        raise ValueError(f"B and C must have the same rank r (last dim): {shapes}")
    for name, t in (("B", B), ("C", C), ("V", V)):
        if t.dtype not in FLOAT_DTYPES:
            raise TypeError(f"{name} has dtype {t.dtype}; expected one of float16, bfloat16, "
                            f"float32, float64")
    if not B.dtype == C.dtype == V.dtype:
        raise TypeError(f"B, C and V must share one dtype, got B {B.dtype}, C {C.dtype}, V {V.dtype}")
    if not B.device == C.device == V.device:
        raise ValueError(f"B, C and V must be on one device, got B on {B.device}, C on {C.device}, "
                         f"V on {V.device}")
