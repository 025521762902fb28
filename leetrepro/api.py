"""The public entry point, ``causal_linear_decoder`` (the paper's Listing 2)."""
from __future__ import annotations

import functools
import inspect
import warnings

import torch

from . import dispatch
from . import methods as _methods  # noqa: F401  (fills the registry)
from ._inputs import check_qkv, normalize_gamma
from ._state import check_state
from .registry import Method, get, methods

#: ``method="auto"``: on a GPU with a measured table (``make tune``, :mod:`leetrepro.dispatch`) the
#: method the table names for the nearest cell; elsewhere this rule, the first of the list that is
#: registered and runs the inputs' dtype natively on their device. Short sequences go to Vanilla
#: (Section 5.1: fastest at N ≤ 128), the rest to Chunk (this project's kernel, NOTES.md), then
#: lightningAttention-2 (fastest at batch 1 and N > 512 in Tables 3-4), then PyTorch twins.
AUTO_SHORT_N = 128
AUTO_ORDER = ("Chunk", "LA", "LA_torch", "Bb")
STATE_ORDER = ("Chunk", "LA_torch")


def auto_method(n: int, dtype: torch.dtype, device: torch.device, *, batch: int = 1,
                decay: bool = False, state: bool = False) -> Method:
    """The method ``method="auto"`` uses for these inputs: the measured table's choice where
    there is one, else the rule above; with ``state``, only methods that take and return the
    recurrent state. Cached per arguments (a model calls it per layer); ``register`` and
    ``dispatch.clear_cache`` clear the cache."""
    return _auto_method(n, dtype, torch.device(device), batch, decay, state)


@functools.lru_cache(maxsize=4096)
def _auto_method(n, dtype, device, batch, decay, state) -> Method:
    def usable(m):
        # native devices only: a Triton kernel interpreted on a CPU is correct but very slow
        return (m.supports(dtype, device) and torch.device(device).type in m.devices
                and not m.unsafe and (m.state or not state))

    picked = dispatch.choose(n, batch, dtype, decay, device)
    if picked is not None:
        try:
            m = get(picked)
            if usable(m):
                return m
        except ValueError:
            pass
    order = STATE_ORDER if state else (("Vanilla",) + AUTO_ORDER if n <= AUTO_SHORT_N else AUTO_ORDER)
    for name in order:
        try:
            m = get(name)
        except ValueError:
            continue
        if usable(m):
            return m
    raise ValueError(f"no registered method supports dtype {dtype} on {device}"
                     + (" with a state" if state else ""))


def causal_linear_decoder(B: torch.Tensor, C: torch.Tensor, V: torch.Tensor, gamma=None, *,
                          method: str = "auto", is_mask_weight: bool | None = None,
                          attn_method: str | None = None, initial_state: torch.Tensor | None = None,
                          output_final_state: bool = False, **options):
    """Exponentially decaying causal linear attention, ``O = (B Cᵀ ⊙ M) V``.

    Args:
        B, C: ``(batch, heads, N, r)``; V: ``(batch, heads, N, d)``. One floating dtype (fp16, bf16,
            fp32, fp64) and one device; any strides.
        gamma: per-step decay λ per head, in (0, 1]: a float, or a tensor ``(H,)`` / ``(H, 1)``.
            ``M[i, j] = gamma^(i-j)`` for i ≥ j, else 0. None: the 0-1 causal mask.
        method: a registered name or abbreviation (``leetrepro.methods.available()``), or
            ``"auto"`` (see :func:`auto_method`).
        is_mask_weight, attn_method: the paper's keywords (Listing 2). ``is_mask_weight=True``
            requires ``gamma``; ``is_mask_weight=False`` means the 0-1 mask whatever ``gamma`` is.
            ``attn_method`` is a synonym of ``method``.
        initial_state: ``(batch, heads, r, d)``, the recurrent state S the sequence starts from
            (e.g. the ``final_state`` of the previous piece of a prompt); see :mod:`leetrepro._state`
            for the convention ``S_t = λ S_{t-1} + c_tᵀ v_t``, ``o_t = b_t S_t``.
        output_final_state: also return ``S_N`` (float32; float64 for float64 inputs).
            Both need a method with state support (``available()["state"]``: Chunk, LA_torch).
        **options: method options, e.g. ``block_size`` for Bb and LA_torch, ``base`` for Recur.

    Returns:
        O, ``(batch, heads, N, d)``, in the inputs' dtype (accumulated in float32 or wider);
        ``(O, S_N)`` with ``output_final_state=True``.
    """
    if attn_method is not None:
        if method not in ("auto", attn_method):
            raise ValueError(f"method={method!r} and attn_method={attn_method!r} disagree")
        method = attn_method
    check_qkv(B, C, V)
    if is_mask_weight is True and gamma is None:
        raise ValueError("is_mask_weight=True needs gamma (the per-head decay in (0, 1])")
    if is_mask_weight is False and gamma is not None:
        warnings.warn("is_mask_weight=False: gamma is ignored and the 0-1 causal mask is used",
                      stacklevel=2)
        gamma = None
    batch, heads, n, _ = B.shape
    g = normalize_gamma(gamma, heads, B.device)
    with_state = initial_state is not None or output_final_state
    check_state(initial_state, B, V)
    m = auto_method(n, B.dtype, B.device, batch=batch, decay=g is not None, state=with_state) \
        if method == "auto" else get(method)
    if with_state and not m.state:
        raise ValueError(f"method {m.name} ({m.abbr}) does not take or return a state; methods "
                         f"that do: {', '.join(x.abbr for x in methods() if x.state)}")
    if not m.supports(B.dtype, B.device):
        raise ValueError(f"method {m.name} ({m.abbr}) does not support dtype {B.dtype} on device "
                         f"{B.device.type}; it supports dtypes "
                         f"{sorted(str(d) for d in m.dtypes)} on {sorted(m.device_types())}")
    accepted = _accepted_options(m.fn)
    bad = [] if accepted is None else [k for k in options if k not in accepted]
    if bad:
        raise TypeError(f"method {m.name} got unknown option(s) {bad}; it accepts "
                        f"{sorted(accepted) or 'none'}")
    d = V.shape[-1]
    if n == 0 or batch == 0 or heads == 0 or d == 0 or B.shape[-1] == 0:
        out = V.new_zeros(batch, heads, n, d)
        if not output_final_state:
            return out
        sdtype = torch.float64 if V.dtype == torch.float64 else torch.float32
        s = V.new_zeros(batch, heads, B.shape[-1], d, dtype=sdtype)
        if initial_state is not None and n == 0:
            s = initial_state.to(sdtype).clone()
        elif initial_state is not None:  # r == 0: the state is empty too
            s = s + initial_state.to(sdtype)
        return out, s
    if with_state:
        options = dict(options, initial_state=initial_state, output_final_state=output_final_state)
    return m.fn(B, C, V, g, **options)


@functools.lru_cache(maxsize=None)  # inspect.signature costs ~10 µs, too much per call
def _accepted_options(fn) -> frozenset | None:
    """Keyword options of a method's ``fn`` beyond (B, C, V, gamma); None if it takes ``**kwargs``."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return None
    if any(p.kind == p.VAR_KEYWORD for p in params):
        return None
    return frozenset(p.name for p in params[4:]
                     if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)
                     and p.name not in ("initial_state", "output_final_state"))
