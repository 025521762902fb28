"""The public entry point, ``causal_linear_decoder`` (the paper's Listing 2)."""
from __future__ import annotations

import typing
import warnings

import torch

from . import methods as _methods  # noqa: F401  (fills the registry)
from . import ops, registry
from ._direct import apply as direct_apply
from ._inputs import check_qkv
from .decay.per_head import normalize_gamma
from .decay.per_token import check_gates
from ._state import check_state
from .projection import rejoined
from .registry import get


def check_cu_seqlens(cu_seqlens, B: torch.Tensor, host=None) -> int | None:
    """The number of sequences packed along N, after checking ``cu_seqlens`` (None: not packed).

    ``cu_seqlens``: 1-D int32/int64 offsets on B's device, ``cu[0] = 0``, non-decreasing,
    ``cu[-1] = N``; B's batch must be 1 (flash-linear-attention's convention). The values are
    checked on the host (one small device-to-host copy) unless ``torch.compile`` is tracing or
    ``host``, the same offsets as a CPU tensor (flash-linear-attention's ``cu_seqlens_cpu``), is
    given: its values are checked instead, with no synchronisation."""
    if cu_seqlens is None:
        if host is not None:
            raise ValueError("cu_seqlens_cpu is given without cu_seqlens (the offsets on the "
                             "inputs' device)")
        return None
    if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.dim() != 1 \
            or cu_seqlens.dtype not in (torch.int32, torch.int64) or cu_seqlens.numel() < 1:
        raise TypeError("cu_seqlens must be a 1-D int32 (or int64) tensor of offsets "
                        "[0, len_0, len_0 + len_1, ..., N]")
    if cu_seqlens.device != B.device:
        raise ValueError(f"cu_seqlens is on {cu_seqlens.device}, the inputs on {B.device}")
    if host is not None and (not isinstance(host, torch.Tensor) or host.device.type != "cpu"
                             or host.shape != cu_seqlens.shape or host.is_floating_point()):
        raise ValueError(f"cu_seqlens_cpu must be the offsets of cu_seqlens as an integer CPU "
                         f"tensor of shape {tuple(cu_seqlens.shape)}, got "
                         f"{getattr(host, 'device', type(host).__name__)} "
                         f"{tuple(getattr(host, 'shape', ()))}")
    if B.shape[0] != 1:
        raise ValueError(f"with cu_seqlens the sequences are packed along N of a batch of one; "
                         f"got batch {B.shape[0]}")
    if not torch.compiler.is_compiling():
        cu = (cu_seqlens if host is None else host).tolist()
        if cu[0] != 0 or cu[-1] != B.shape[2] or any(b < a for a, b in zip(cu, cu[1:])):
            raise ValueError(f"cu_seqlens must start at 0, never decrease and end at N = "
                             f"{B.shape[2]}; got {cu[:4]}{' ...' if len(cu) > 4 else ''} "
                             f"ending at {cu[-1]}")
    return cu_seqlens.numel() - 1


def causal_linear_decoder(B: torch.Tensor, C: torch.Tensor, V: torch.Tensor, gamma=None, *,
                          method: str = "auto", is_mask_weight: bool | None = None,
                          attn_method: str | None = None, initial_state: torch.Tensor | None = None,
                          output_final_state: bool = False, cu_seqlens: torch.Tensor | None = None,
                          cu_seqlens_cpu: torch.Tensor | None = None, scale: float = 1.0,
                          g: torch.Tensor | None = None, **options):
    """Exponentially decaying causal linear attention, ``O = (B Cᵀ ⊙ M) V``, differentiable.

    Args:
        B, C: ``(batch, heads, N, r)``; V: ``(batch, heads, N, d)``. One floating dtype (fp16, bf16,
            fp32, fp64) and one device; any strides. Under ``torch.autocast`` all three are cast
            to the autocast dtype first. B and C may hold groups, ``(batch, groups, N, r)`` with
            groups dividing V's heads (Mamba-2's grouped B and C, grouped-query attention): head h
            reads group ``h // (heads / groups)``, and their gradients are summed over each group's
            heads. Chunk reads a group's rows in place; the other methods get a copy a head each.
        gamma: per-step decay λ per head, in (0, 1]: a float, or a tensor ``(H,)`` / ``(H, 1)``.
            ``M[i, j] = gamma^(i-j)`` for i ≥ j, else 0. None: the 0-1 causal mask. The decays are
            fixed (no gradient): a gamma that requires grad is an error.
        method: a registered name or abbreviation, case-insensitive
            (``leetrepro.methods.available()``), or ``"auto"`` (:func:`leetrepro.auto_method`).
        is_mask_weight, attn_method: the paper's keywords (Listing 2). ``is_mask_weight`` true
            requires ``gamma``; false means the 0-1 mask whatever ``gamma`` is (any truthy or
            falsy value counts). ``attn_method`` is a synonym of ``method``.
        initial_state: ``(batch, heads, r, d)``, the recurrent state S the sequence starts from
            (e.g. the ``final_state`` of the previous piece of a prompt); see :mod:`leetrepro._state`
            for the convention ``S_t = λ S_{t-1} + c_tᵀ v_t``, ``o_t = b_t S_t``.
        output_final_state: also return ``S_N`` (float32; float64 for float64 inputs).
            Both need a method with state support (``available()["state"]``: Chunk, LA_torch).
        cu_seqlens: sequences of different lengths packed along N of a batch of one, as the
            int32 offsets ``[0, len_0, len_0 + len_1, ..., N]`` (flash-linear-attention's
            convention). Each sequence starts from zero (or from its row of ``initial_state``,
            then ``(sequences, heads, r, d)``) and returns its own final state; nothing crosses
            from one sequence to the next and no padding is read or written. Chunk runs them in
            one launch; other methods one call per sequence.
        cu_seqlens_cpu: the same offsets as a CPU tensor (flash-linear-attention's name): they
            are checked from it, so a packed call on a GPU reads nothing back from the device.
        scale: a nonzero number multiplying O (flash-linear-attention's query scale): free in
            Chunk, which applies it as it writes O; the final state is not scaled.
        g: per-token log gates ``(batch, heads, N)`` (flash-linear-attention's ``g``, Mamba-2's
            ``dt·A``): the decay a_t = e^(g_t) of row t, ≤ 0 in the models that use it, any
            strides (a time-major ``(batch, N, heads)`` tensor as ``g.transpose(1, 2)``), any
            float dtype (computed in float32, float64 for float64 inputs). Then ``M[i, j] =
            exp(G_i − G_j)`` with G the running sum of g, and ``S_t = e^(g_t) S_{t-1} + c_tᵀ v_t``;
            with ``gamma`` as well the decays multiply. Differentiable (dg from the same sweeps
            as dB and dC). Methods that take gates: ``available()["gates"]`` (Chunk, LA_torch, Bb,
            Recur, Vanilla); a gate of −1e4 is a hard reset (exact zeros across it).
        **options: method options, e.g. ``block_size`` for Bb and LA_torch, ``base`` for Recur,
            ``fp32_precision`` for the Triton kernels. A bad value is a ValueError naming the
            option. With ``method="auto"`` only ``fp32_precision`` is accepted (every method takes
            it; the PyTorch methods are exact fp32 anyway): the chosen method depends on the
            inputs, so method-specific options need a named method.

    Returns:
        O, ``(batch, heads, N, d)``, in the inputs' dtype (accumulated in float32 or wider);
        ``(O, S_N)`` with ``output_final_state=True``. Gradients flow to B, C, V, ``g`` and
        ``initial_state`` (:mod:`leetrepro.ops`). Rows before a non-finite row of C or V are
        exact (non-finite values never leak backwards in time).

    Complexity: the method's (``available()["complexity"]``); the backward costs three of its calls.
    """
    if attn_method is not None:
        method = _method_keyword(method, attn_method)
    B, C, V = _autocast(B, C, V)
    compiling = torch.compiler.is_compiling()
    grad = torch.is_grad_enabled() and (any(  # (auto chooses for a forward alone, or with its backward)
        isinstance(t, torch.Tensor) and t.requires_grad for t in (B, C, V, initial_state))
        or (g is not None and isinstance(g, torch.Tensor) and g.requires_grad))
    key, seen = (None, None) if compiling or initial_state is not None or cu_seqlens is not None \
        or is_mask_weight is not None else \
        _lookup(B, C, V, method, options, output_final_state, gamma is None, grad, g is None)
    gam, scale = _checked(B, C, V, gamma, g, is_mask_weight, initial_state, cu_seqlens,
                          cu_seqlens_cpu, scale, seen is None)
    if compiling:  # (the custom op, which checks the method and its options when it runs)
        out, s = ops.causal_linear(B, C, V, gam, initial_state, method, ops.encode_options(options),
                                   False, output_final_state, cu_seqlens, scale, grad, g)
    else:  # (resolved here, in eager mode, so that errors name the call)
        seen = seen or _resolved(key, method, options, B, V, gam, g, grad, initial_state is not None
                                 or output_final_state)
        out, s = seen.run(B, C, V, gam, g, initial_state, output_final_state, cu_seqlens, scale, grad)
    return (out, s) if output_final_state else out


def _checked(B, C, V, gamma, g, is_mask_weight, initial_state, cu_seqlens, cu_seqlens_cpu,
             scale, qkv: bool) -> tuple:
    """``(γ, scale)`` of a call, normalised, after its arguments are checked (B, C and V with
    ``qkv``: a call whose signature was seen skips them); errors name the argument."""
    if qkv:
        check_qkv(B, C, V)
    if is_mask_weight is not None:
        gamma = _mask_keyword(is_mask_weight, gamma)
    if g is not None:
        check_gates(g, V)
    gam = normalize_gamma(gamma, V.shape[1], B.device)
    check_state(initial_state, B, V, check_cu_seqlens(cu_seqlens, B, cu_seqlens_cpu))
    try:
        value = float(scale)
    except (TypeError, ValueError):
        raise TypeError(f"scale must be a number, got {type(scale).__name__}") from None
    if value == 0 or value != value or abs(value) == float("inf"):
        raise ValueError(f"scale must be finite and nonzero, got {scale}")
    return gam, value


def _mask_keyword(is_mask_weight, gamma):
    """The decay the paper's ``is_mask_weight`` keyword leaves: γ, or None (the 0-1 mask)."""
    if is_mask_weight and gamma is None:
        raise ValueError("is_mask_weight=True needs gamma (the per-head decay in (0, 1])")
    if not is_mask_weight and gamma is not None:
        warnings.warn("is_mask_weight=False: gamma is ignored and the 0-1 causal mask is used",
                      stacklevel=4)
        return None
    return gamma


class Resolved(typing.NamedTuple):
    """A call's method and its checked options (:func:`leetrepro.ops.prepare`), remembered by the
    call's signature (:data:`_SEEN`): what ``ops.Eager`` and the custom op's backward take."""
    method: object
    options: dict

    def run(self, B, C, V, gam, g, initial_state, output_final_state: bool, cu_seqlens, scale: float,
            grad: bool) -> tuple:
        """``(O, S_N or None)`` of an eager call by this method, recorded for autograd if ``grad``
        (:class:`leetrepro.ops.Eager`), else run without autograd's record (host time a call)."""
        if not grad:
            return ops.run(self.method, self.options, B, C, V, gam, initial_state, False,
                           output_final_state, cu_seqlens=cu_seqlens, scale=scale, g=g)
        # (slices of one fused projection: their gradients handed on as one buffer, no
        # concatenation, projection.rejoined)
        B, C, V = rejoined(B, C, V)
        return direct_apply(ops.Eager, B, C, V, gam, initial_state, self, False, output_final_state,
                            cu_seqlens, scale, g)


def _resolved(key, method: str, options: dict, B, V, gam, g, grad: bool, with_state: bool
              ) -> Resolved:
    """The :class:`Resolved` method of a call not seen before, remembered under its signature
    ``key`` (None: not remembered)."""
    seen = Resolved(*ops.prepare(method, options, B, gam, with_state, V, grad, g is not None))
    _remember(key, seen)
    return seen


#: calls already checked, by signature (method, options, shapes, dtypes, devices, state flag,
#: decay or not, B's and V's strides, gradients or not), with the method and options they
#: resolved to: a model repeats one signature per layer, and at short N the checks cost more host
#: time than the kernel. Cleared when a method is registered or a dispatch table reloaded
#: (``registry.on_change``).
_SEEN: dict = {}
registry.on_change(_SEEN.clear)


def _remember(key, seen: tuple) -> None:
    if key is not None:
        if len(_SEEN) >= 1024:
            _SEEN.clear()
        _SEEN[key] = seen


def prepared(B: torch.Tensor, C: torch.Tensor, V: torch.Tensor, method: str, options: dict,
             with_state: bool, grad: bool, gates: bool) -> tuple:
    """:func:`leetrepro.ops.prepare`'s ``(method, options)`` for operands B, C, V without a
    per-head decay, remembered in :data:`_SEEN` by the call's signature as the API's own calls
    are: what a layer that calls the operator's forward and backward itself resolves in eager
    mode (``compat._TurnedOperator``)."""
    key, seen = _lookup(B, C, V, method, options, with_state, True, grad, not gates)
    if seen is None:
        seen = Resolved(*ops.prepare(method, options, B, None, with_state, V, grad, gates))
        _remember(key, seen)
    return seen


def _lookup(B, C, V, method, options: dict, final: bool, no_decay: bool, grad: bool,
            no_gates: bool = True) -> tuple:
    """``(key, seen)``: the call's key in :data:`_SEEN` and what it holds there (None if nothing),
    or ``(None, None)`` where the arguments are not tensors or an option value is unhashable
    (those calls are checked in full)."""
    try:
        # (strides and gradients: what auto chooses by besides shapes, dtypes and devices)
        key = (method, tuple(options.items()), final, no_decay, no_gates, B.shape, C.shape, V.shape, B.dtype,
               C.dtype, V.dtype, B.device, C.device, V.device, B.stride(), V.stride(), grad)
        hash(key)
    except (AttributeError, TypeError):
        return None, None
    return key, _SEEN.get(key)


def _autocast(B, C, V):
    """Under ``torch.autocast`` the operator runs in the autocast dtype, as a matrix product does
    (a model's B, C and V can come out of autocast in different dtypes)."""
    if not all(isinstance(t, torch.Tensor) for t in (B, C, V)):
        return B, C, V  # check_qkv says what is wrong
    kind = B.device.type
    if kind in ("cuda", "cpu") and torch.is_autocast_enabled(kind):
        dtype = torch.get_autocast_dtype(kind)
        return tuple(t.to(dtype) if t.is_floating_point() else t for t in (B, C, V))
    return B, C, V


def _method_keyword(method, attn_method) -> str:
    if not ops.is_auto(method) and (ops.is_auto(attn_method) or get(method) is not get(attn_method)):
        raise ValueError(f"method={method!r} and attn_method={attn_method!r} disagree")
    return attn_method
