"""The custom op's method and options: ``method="auto"`` or a name resolved for a call
(:func:`resolve`), the options checked against what the method takes (:func:`check_options`),
and their encoding as the op's string argument (:func:`encode_options`).
"""
from __future__ import annotations

import functools
import inspect
import json

import torch

from .. import dispatch, registry
from ..registry import OPTION_RULES, UNIVERSAL_OPTIONS, Method


def state_dtype(dtype: torch.dtype) -> torch.dtype:
    """The final state's dtype: float32 (float64 for float64 inputs)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def is_auto(method) -> bool:
    return isinstance(method, str) and method.lower() == "auto"


#: why a method of the paper takes no per-token gates, where there is more to say than that
NO_GATES = {
    "FA": "FleetAttention factorises the mask per head as γ^i · γ^-j (rank one); with gates the "
          "factors become exp(G_i) and exp(−G_j), and exp(−G_j) overflows float32 once the "
          "running gate sum G_j falls below −88 (a few hundred tokens of a typical gate, one "
          "document boundary of a hard reset)",
    "FA_modify": "FleetAttention's factorisation (as FA)",
    "Cdotp": "the causal dot product's kernel is the 0-1 mask's prefix sum; a gate per token "
             "is a decay it has no place for",
    "LA": "LA's Triton kernel takes one γ per head; Chunk is its kernel with gates",
}


def _refuse_rule(m: Method, rule: str) -> None:
    """A ValueError naming the method, the decay rule it does not take, why, and the methods
    that take it."""
    why = NO_GATES.get(m.abbr, "it has no per-token decay rule") if rule == "per_token" else \
        f"it has no {rule} decay rule"
    raise ValueError(f"method {m.name} ({m.abbr}) does not take {registry.DECAY_RULES[rule]} "
                     f"(the {rule} decay rule): {why}; methods that do: "
                     f"{', '.join(x.abbr for x in registry.methods() if rule in x.decays)}")


def resolve(method, B: torch.Tensor, gamma, with_state: bool, V: torch.Tensor | None = None,
            grad: bool = False, gates: bool = False) -> Method:
    """The registered method that will run these inputs (``"auto"`` chosen by
    :func:`leetrepro.dispatch.auto_method` from B's and V's signature, ``grad``, whether
    autograd will take this call's gradient, and ``gates``, per-token gates), or a ValueError
    saying why none can."""
    if is_auto(method):
        call = dispatch.call_of(B, B if V is None else V, decay=gamma is not None,
                                state=with_state, grad=grad, gates=gates)
        return dispatch.method_for(B.shape[2], B.dtype, B.device, call)
    m = registry.get(method)
    for rule in ("per_head",) + (("per_token",) if gates else ()):
        if rule not in m.decays:
            _refuse_rule(m, rule)
    if with_state and not m.state:
        raise ValueError(f"method {m.name} ({m.abbr}) does not take or return a state; methods "
                         f"that do: {', '.join(x.abbr for x in registry.methods() if x.state)}")
    if B.device.type not in m.device_types():
        on = " or ".join(sorted(m.device_types()))
        hint = ("; or run its Triton kernels on the CPU through Triton's interpreter (slow: for "
                "tests), with TRITON_INTERPRET=1 set before leetrepro is imported"
                if m.language == "triton" and B.device.type == "cpu" else "")
        raise ValueError(f"method {m.name} ({m.abbr}) runs on {on} tensors only, and these are on "
                         f"{B.device.type}: move B, C, V to a GPU{hint}; methods that run "
                         f"{B.dtype} on {B.device.type}: {_runs_here(B)}")
    if not m.supports(B.dtype, B.device):
        raise ValueError(f"method {m.name} ({m.abbr}) does not take {B.dtype} inputs: it takes "
                         f"{', '.join(sorted(str(d) for d in m.dtypes))}; methods that take "
                         f"{B.dtype} on {B.device.type}: {_runs_here(B)}")
    return m


def _runs_here(B: torch.Tensor) -> str:
    """The methods that take B's dtype on its device, for a refusal's message (asked only when
    refusing: a compiled graph resolves its method on every call)."""
    return ", ".join(x.abbr for x in registry.methods()
                     if x.supports(B.dtype, B.device) and not x.unsafe) or "none"


def check_options(m: Method | None, options: dict) -> dict:
    """The options ``m`` will get, or an error naming the option and what it accepts.

    ``m`` None stands for ``method="auto"``: it takes only the options every method accepts
    (``fp32_precision``), since which method runs depends on the inputs. Unknown names are a
    TypeError, bad values a ValueError. A universal option a method has no use for (the PyTorch
    methods compute in fp32 anyway) is checked and dropped."""
    if m is None:
        specific = sorted(k for k in options if k not in UNIVERSAL_OPTIONS)
        if specific:
            raise ValueError(f"method='auto' takes no method-specific option ({specific}): which "
                             f"method runs depends on the inputs; name the method "
                             f"(method='Bb', …) to pass them. Accepted with auto: "
                             f"{list(UNIVERSAL_OPTIONS)}")
    accepted = None if m is None else _accepted_options(m.fn)
    out = {}
    for k, v in options.items():
        if accepted is not None and k not in accepted and k not in UNIVERSAL_OPTIONS:
            raise TypeError(f"method {m.name} got unknown option {k!r}; it accepts "
                            f"{sorted(accepted) or 'none'} (and {list(UNIVERSAL_OPTIONS)})")
        rule = OPTION_RULES.get(k)
        if rule is not None and not rule[1](v):
            raise ValueError(f"option {k}={v!r} is invalid: {k} takes {rule[0]}")
        if accepted is None or k in accepted:
            out[k] = v
    return out


def prepare(method, options: dict, B: torch.Tensor, gamma, with_state: bool,
            V: torch.Tensor | None = None, grad: bool = False,
            gates: bool = False) -> tuple[Method, dict]:
    """The method that will run (:func:`resolve`) and the options it gets (:func:`check_options`):
    ``"auto"`` takes only universal options, whichever method it picks."""
    m = resolve(method, B, gamma, with_state, V, grad, gates)
    if is_auto(method):
        options = check_options(None, options)
    return m, check_options(m, options)


@functools.lru_cache(maxsize=None)  # inspect.signature is too slow to run on every call
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
                     and p.name not in ("initial_state", "output_final_state", "reverse", "dual",
                                        "cu_seqlens", "scale", "out", "out2", "g", "gate",
                                        "gate_pieces"))


def encode_options(options: dict) -> str:
    """Options as the op's string argument (a custom op takes no dict): a JSON object."""
    if not options:
        return ""
    return _encode(tuple(sorted(options.items())))


def _encode(items: tuple) -> str:
    return json.dumps(dict(items), sort_keys=True)


# traced once as a constant (the options are Python values): the mark that
# torch.compiler.assume_constant_result sets, set here without importing torch._dynamo, which
# took 2 of `import leetrepro`'s 5 seconds (tests/test_package.py holds the two marks equal)
_encode._dynamo_marked_constant = True


@functools.lru_cache(maxsize=1024)
def _decode(options: str) -> tuple:
    return tuple(sorted(json.loads(options).items())) if options else ()
