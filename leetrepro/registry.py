"""One registry of computation methods, keyed by the paper's names (Table 2 abbreviations too).

A method is any callable ``fn(B, C, V, gamma, **options) -> O`` with
B, C ``(batch, heads, N, r)``, V ``(batch, heads, N, d)`` and ``gamma`` either None (0-1 mask) or a
float64 tensor ``(heads,)`` of per-step decays in (0, 1] on the inputs' device. It returns O
``(batch, heads, N, d)`` in the inputs' dtype. Inputs reach it validated, with N ≥ 1.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Callable

import torch

ALL_DTYPES = frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64})
GPU_DTYPES = frozenset({torch.float16, torch.bfloat16, torch.float32})
#: fp32 precision of the kernels' dot products (``fp32_precision``; leetrepro.methods._gpu)
FP32_PRECISIONS = ("tf32", "tf32x3", "ieee")


def _positive_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


#: option name -> (what it accepts, check). Shared by every method that takes the option; an
#: option of a user's method with no rule here is passed on unchecked.
OPTION_RULES = {
    "block_size": ("a positive integer", _positive_int),
    "base": ("a positive integer", _positive_int),
    "depth": ("a non-negative integer", lambda v: isinstance(v, int) and not isinstance(v, bool)
              and v >= 0),
    "rank_groups": ("a positive integer", _positive_int),
    "segment": ("None or a positive integer (a multiple of the kernel's row block)",
                lambda v: v is None or _positive_int(v)),
    "fp32_precision": (f"None or one of {FP32_PRECISIONS}", lambda v: v is None or v in FP32_PRECISIONS),
    "gate_grad_precision": (f"None or one of {FP32_PRECISIONS}",
                            lambda v: v is None or v in FP32_PRECISIONS),
    "kernel": ("one of 'auto', 'portable', 'hopper'", lambda v: v in ("auto", "portable", "hopper")),
    "gate_grad": ("one of 'auto', 'sweeps', 'straddle'",
                  lambda v: v in ("auto", "sweeps", "straddle")),
    "config": ("None or a dict of launch settings (BLOCK_N, num_warps, num_stages, segment; DC: "
               "the Hopper kernel's value columns a program)",
               lambda v: v is None or isinstance(v, dict)),
}
#: options every method accepts: ``fp32_precision`` asks for at least that fp32 accuracy, which the
#: PyTorch methods (plain fp32 arithmetic) always give; ``gate_grad_precision`` likewise for the
#: products of the fp32 gates' gradient (the straddle kernel's; default "tf32x3", fp32's contract:
#: a caller whose fp32 operands hold 16-bit values and who wants 16-bit's contract may ask "tf32").
#: So ``method="auto"`` may take them too
UNIVERSAL_OPTIONS = ("fp32_precision", "gate_grad_precision")


#: the decay rules a method can take, each a module of ``leetrepro.decay``: the per-head decay
#: γ (Eq. (4)) and the per-token gates g (simple GLA, Mamba-2), with what each needs of the call
DECAY_RULES = {"per_head": "a per-head decay gamma", "per_token": "per-token gates g"}


@dataclass(frozen=True)
class Method:
    name: str                      # the paper's name, e.g. "lightningAttention-2_torch"
    abbr: str                      # the paper's abbreviation, e.g. "LA_torch"
    fn: Callable
    complexity: str                # time complexity, Table 1
    dtypes: frozenset = ALL_DTYPES
    devices: frozenset = frozenset({"cpu", "cuda"})
    language: str = "torch"        # torch | triton | cuda | user
    unsafe: bool = False           # gives wrong results by design (FA_modify); never chosen by auto
    state: bool = False            # takes initial_state= and output_final_state= (leetrepro._state)
    reverse: bool = False          # takes reverse=True (the operator in reverse time, for backward)
    dual: bool = False             # takes dual=E: also op(E, V, C) from the same sweep (dV with dC)
    varlen: bool = False           # takes cu_seqlens= (packed sequences); others run them one by one
    scale: bool = False            # takes scale= (multiplies O as it is stored); others multiply after
    # the decay rules it takes (:data:`DECAY_RULES`, ``leetrepro.decay``): every method a
    # per-head γ (None: the 0-1 mask); "per_token" also ``g=``, the per-token gates, γ folded in
    decays: frozenset = frozenset({"per_head"})
    groups: bool = False           # reads operands of fewer heads (groups) in place; others get
    #                                them expanded to a head each (leetrepro._groups.expand_groups)
    out: bool = False              # takes out=/out2= (writes O, the dual output into them, any
    #                                strides): the backward's gradients land in their inputs' layouts
    summary: str = ""
    options: dict = field(default_factory=dict)  # tunable keyword arguments and their defaults
    # gradients(dO, B, C, V, gamma, **options) -> (dB, dC, dV): a backward of the method's own
    # for calls without states or packed sequences (ECA's); None: three calls of the method
    gradients: Callable | None = None

    @property
    def gates(self) -> bool:
        """Whether it takes per-token gates ``g=`` (the "per_token" rule)."""
        return "per_token" in self.decays

    def supports(self, dtype: torch.dtype, device: torch.device) -> bool:
        return dtype in self.dtypes and torch.device(device).type in self.device_types()

    def device_types(self) -> frozenset:
        # Triton kernels also run on CPU tensors under TRITON_INTERPRET=1 (how CI tests them)
        if self.language == "triton" and os.environ.get("TRITON_INTERPRET") == "1":
            return self.devices | {"cpu"}
        return self.devices


_REGISTRY: dict[str, Method] = {}


def register(name: str, abbr: str | None = None, *, complexity: str = "unknown",
             dtypes=ALL_DTYPES, devices=("cpu", "cuda"), language: str = "user",
             unsafe: bool = False, state: bool = False, reverse: bool = False, dual: bool = False,
             varlen: bool = False, scale: bool = False, out: bool = False, gates: bool = False,
             groups: bool = False, summary: str = "",
             options: dict | None = None, gradients: Callable | None = None,
             replace: bool = False, decays=None):
    """Decorator: register ``fn(B, C, V, gamma, **options)`` under ``name`` (and ``abbr``).

    ``decays``: the decay rules ``fn`` takes (:data:`DECAY_RULES`; default the per-head γ alone;
    ``gates=True`` is short for ``decays=("per_head", "per_token")``: ``fn`` also takes ``g=``).

    >>> @register("my-method", abbr="Mine", complexity="O(N r d)")
    ... def mine(B, C, V, gamma):
    ...     ...

    Afterwards ``causal_linear_decoder(..., method="Mine")`` and ``benchmark_method("Mine")`` use it.
    """
    rules = frozenset(decays or ("per_head",)) | ({"per_token"} if gates else set())
    unknown = sorted(rules - set(DECAY_RULES))
    if unknown or "per_head" not in rules:
        raise ValueError(f"register({name!r}): decays must name rules of {sorted(DECAY_RULES)}, "
                         f"per_head among them (every method takes a per-head gamma); got "
                         f"{sorted(rules)}")

    def deco(fn):
        m = Method(name=name, abbr=abbr or name, fn=fn, complexity=complexity,
                   dtypes=frozenset(dtypes), devices=frozenset(devices), language=language,
                   unsafe=unsafe, state=state, reverse=reverse, dual=dual, varlen=varlen,
                   scale=scale, out=out, decays=rules, groups=groups,
                   summary=summary or (fn.__doc__ or "").strip().split("\n")[0],
                   options=dict(options or {}), gradients=gradients)
        keys = {name.lower(), m.abbr.lower()}
        taken = [k for k in keys if k in _REGISTRY and _REGISTRY[k].name != name]
        if taken and not replace:
            raise ValueError(f"method name {taken[0]!r} is already registered "
                             f"(to {_REGISTRY[taken[0]].name}); pass replace=True to override")
        for k in keys:
            _REGISTRY[k] = m
        changed()
        return fn
    return deco


def unregister(name: str) -> None:
    m = get(name)
    for k in [k for k, v in _REGISTRY.items() if v is m]:
        del _REGISTRY[k]
    changed()


_LISTENERS: list[Callable[[], None]] = []


def on_change(fn: Callable[[], None]) -> None:
    """Call ``fn()`` whenever a method is registered or removed, or a dispatch table is reloaded
    (caches of choices listen)."""
    _LISTENERS.append(fn)


def changed() -> None:
    """Tell the caches of choices (:func:`on_change`) that methods or measured tables changed."""
    for fn in _LISTENERS:
        fn()


def methods() -> list[Method]:
    """Every registered method once, in registration order."""
    seen, out = set(), []
    for m in _REGISTRY.values():
        if m.name not in seen:
            seen.add(m.name)
            out.append(m)
    return out


def get(name: str) -> Method:
    """Look a method up by name or abbreviation (case-insensitive; ``"auto"`` is not a method:
    :func:`leetrepro.dispatch.auto_method` chooses one)."""
    if isinstance(name, Method):
        return name
    try:
        return _REGISTRY[str(name).lower()]
    except KeyError:
        listing = ", ".join(f"{m.name} ({m.abbr})" for m in methods())
        raise ValueError(f"unknown method {name!r}; available: {listing}") from None


def available():
    """A pandas DataFrame of the registered methods: name, abbreviation, language, complexity,
    dtypes, devices, whether the method is unsafe (wrong by design, kept for a table), whether
    it takes and returns the recurrent state, whether it runs in reverse time natively (else
    its backward flips the inputs), whether it runs packed sequences (``cu_seqlens``) in one
    launch (else one call per sequence), whether it takes per-token gates (``g``) and the decay
    rules it takes (``decays``: ``per_head``, ``per_token``)."""
    import pandas as pd

    from ._dtypes import SHORT_NAMES as short

    rows = [dict(name=m.name, abbr=m.abbr, language=m.language, complexity=m.complexity,
                 dtypes=",".join(short[d] for d in sorted(m.dtypes, key=lambda d: d.itemsize)
                                 if d in short),
                 devices=",".join(sorted(m.device_types())), unsafe=m.unsafe, state=m.state,
                 reverse=m.reverse, varlen=m.varlen, gates=m.gates,
                 decays=",".join(r for r in DECAY_RULES if r in m.decays), summary=m.summary)
            for m in methods()]
    return pd.DataFrame(rows).set_index("name")
