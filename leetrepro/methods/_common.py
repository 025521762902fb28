"""What every PyTorch method shares: inputs upcast to the accumulation dtype, log λ taken, non-finite
rows kept from leaking backwards in time, the output cast back (:func:`torch_method`)."""
from __future__ import annotations

import functools

import torch

from ..decay.blocks import Decay


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The accumulation dtype of the PyTorch methods: at least float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def isolate_nonfinite(c: torch.Tensor, v: torch.Tensor):
    """``(c, v, poison)`` with the non-finite entries of C and V set to 0.

    The blocked methods multiply whole blocks, so a NaN or Inf in row j of C or V meets the zero
    mask weights of the earlier rows i < j, and 0 × NaN = NaN would spoil rows that do not depend
    on row j (padding with uninitialised memory does exactly this). Zeroing the entries first
    keeps earlier rows exact; ``poison(out)`` then puts the NaN back where the formula has it: in
    every column of every row from a non-finite row of C on (its scores reach all columns), and
    in column k from a non-finite V[j, k] on. No host synchronisation (CUDA-graph safe).
    """
    cz, vz = c * 0, v * 0  # 0 where finite, NaN where not
    c, v = torch.nan_to_num(c, 0.0, 0.0, 0.0), torch.nan_to_num(v, 0.0, 0.0, 0.0)
    row = cz.sum(-1, keepdim=True)  # (…, N, 1): NaN from a bad row of C on

    def poison(out: torch.Tensor, state: torch.Tensor | None = None):
        out = out + (vz + row).cumsum(-2)
        if state is None:
            return out
        return out, state + cz.sum(-2)[..., :, None] + vz.sum(-2)[..., None, :]

    return c, v, poison


def torch_method(fn):
    """Wrap ``fn(b, c, v, decay, **options)`` (accumulation dtype; ``decay`` the call's decay as
    one value, :class:`leetrepro.decay.blocks.Decay`: log λ ``(H, 1, 1)`` or None, or the
    per-token gates ``g`` ``(batch, H, N)`` with any γ folded in, gamma None then, for methods
    registered with ``per_token``) as a registered method ``(B, C, V, gamma, g=None,
    **options)``: upcast, non-finite isolation (:func:`isolate_nonfinite`), cast back. ``fn``
    may return ``(out, state)`` when it takes ``initial_state``/``output_final_state``; the
    state stays in the accumulation dtype."""
    @functools.wraps(fn)
    def run(B, C, V, gamma, g=None, **options):
        cd = compute_dtype(V.dtype)
        b, c, v = B.to(cd), C.to(cd), V.to(cd)
        c, v, poison = isolate_nonfinite(c, v)
        res = fn(b, c, v, Decay.of(gamma, g, cd), **options)
        if isinstance(res, tuple):
            out, state = poison(*res)
            return out.to(V.dtype), state
        return poison(res).to(V.dtype)
    return run
