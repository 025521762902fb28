"""The operator as PyTorch sees it: the custom ops ``leetrepro::causal_linear`` and
``leetrepro::causal_linear_backward`` with their fakes and autograd, and :class:`Eager`, the
same forward and backward without the op's dispatch.
"""
from __future__ import annotations


import torch

from .._direct import outside_transforms, unwrapped, wrapped
from ..decay.per_head import check_gamma_values, normalize_gamma


from . import backward, forward, resolution


@torch.library.custom_op("leetrepro::causal_linear", mutates_args=())
def causal_linear(B: torch.Tensor, C: torch.Tensor, V: torch.Tensor, gamma: torch.Tensor | None,
                  initial_state: torch.Tensor | None, method: str, options: str, reverse: bool,
                  output_final_state: bool, cu_seqlens: torch.Tensor | None = None,
                  scale: float = 1.0, differentiable: bool = False,
                  g: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``O = (B Cᵀ ⊙ M) V`` (``reverse``: on time-reversed rows) by ``method`` (a registered name
    or ``"auto"``), ``options`` a JSON object of method options; ``gamma`` None or a float64
    ``(H,)`` tensor of decays in (0, 1]; ``cu_seqlens`` None or the offsets of sequences packed
    along N; ``scale`` multiplies O (not S_N); ``differentiable``: autograd will take this call's
    gradient (what ``"auto"`` chooses for: the op's forward cannot see it); ``g`` None or the
    per-token log gates ``(batch, heads, N)``. Returns ``(O, S_N)``,
    S_N an empty tensor unless ``output_final_state``. Use
    :func:`leetrepro.causal_linear_decoder`, which checks the inputs."""
    check_gamma_values(gamma)
    m, opts = resolution.prepare(method, dict(resolution._decode(options)), B, gamma,
                                 initial_state is not None or output_final_state, V, differentiable,
                                 g is not None)
    return forward.run(m, opts, B, C, V, gamma, initial_state, reverse, output_final_state,
                       cu_seqlens=cu_seqlens, scale=scale, g=g)


@causal_linear.register_fake
def _(B, C, V, gamma, initial_state, method, options, reverse, output_final_state, cu_seqlens=None,
      scale=1.0, differentiable=False, g=None):
    batch, _, _, r = B.shape
    heads = V.shape[1]
    batch = batch if cu_seqlens is None else cu_seqlens.shape[0] - 1
    sdtype = resolution.state_dtype(V.dtype)
    s = V.new_empty((batch, heads, r, V.shape[-1]) if output_final_state else (0,), dtype=sdtype)
    return forward.output_like(V), s


@torch.library.custom_op("leetrepro::causal_linear_backward", mutates_args=())
def causal_linear_backward(dO: torch.Tensor, B: torch.Tensor, C: torch.Tensor, V: torch.Tensor,
                           gamma: torch.Tensor | None, initial_state: torch.Tensor | None,
                           dS: torch.Tensor | None, method: str, options: str, reverse: bool,
                           need_b: bool, need_c: bool, need_v: bool, need_s0: bool,
                           cu_seqlens: torch.Tensor | None = None, scale: float = 1.0,
                           g: torch.Tensor | None = None, SN: torch.Tensor | None = None,
                           need_g: bool = False,
                           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                                      torch.Tensor]:
    """Gradients ``(dB, dC, dV, dS0, dg)`` of :func:`causal_linear` for output gradients dO and
    dS (dS None: the final state was not asked for), by the forward's method; an empty tensor
    stands for a gradient not asked for. ``g``: the forward's gates, ``SN`` its final state (for
    dg's ⟨dS_N, S_N⟩ term; None without dS). See the module docstring for the formulas. A method
    that takes ``dual=`` (Chunk) computes dV and dC in one reverse sweep."""
    check_gamma_values(gamma)
    m, opts = resolution.prepare(method, dict(resolution._decode(options)), B, gamma,
                                 initial_state is not None or dS is not None, V, True,
                                 g is not None)
    return backward._gradients(m, opts, dO, B, C, V, gamma, initial_state, dS, reverse, need_b,
                               need_c, need_v, need_s0, cu_seqlens, scale, g=g, SN=SN,
                               need_g=need_g)


def gradients(dO: torch.Tensor, B: torch.Tensor, C: torch.Tensor, V: torch.Tensor, gamma=None, *,
              method: str = "auto", need: tuple = (True, True, True), g=None, **options) -> tuple:
    """``(dB, dC, dV)`` of ``O = (B Cᵀ ⊙ M) V`` for the output gradient dO ``(batch, heads, N, d)``
    (``gamma`` and the gates ``g`` as :func:`leetrepro.causal_linear_decoder` takes them): what a
    layer built on the operator calls from its own backward, with nothing saved but the inputs
    and no forward run again. ``need``: which of the three to compute (an empty tensor stands
    for the others); with ``g`` a fourth entry asks for dg, returned fourth.
    Under ``torch.compile`` it is the backward's custom op, which the graph can hold."""
    gam = normalize_gamma(gamma, V.shape[1], B.device)
    need_g = len(need) > 3 and bool(need[3])
    keep = (0, 1, 2, 4) if need_g else (0, 1, 2)
    if torch.compiler.is_compiling():
        res = causal_linear_backward(dO, B, C, V, gam, None, None, method,
                                     resolution.encode_options(options), False, *need[:3], False,
                                     None, 1.0, g, None, need_g)
        return tuple(res[i] for i in keep)
    m, opts = resolution.prepare(method, options, B, gam, False, V, True, g is not None)
    res = backward._gradients(m, opts, dO, B, C, V, gam, None, None, False, *need[:3], False,
                              None, 1.0, g=g, need_g=need_g)
    return tuple(res[i] for i in keep)


def resolved_gradients(resolved: tuple, *args, **kwargs) -> tuple:
    """:func:`causal_linear_backward`'s ``(dB, dC, dV, dS0, dg)`` (its arguments after
    ``options``, the same keywords) by a method and options already resolved (:func:`prepare`),
    without the custom op's dispatch: what an ``autograd.Function`` built on the operator calls
    from its eager backward, as :class:`Eager` does."""
    return backward._gradients(*resolved, *args, **kwargs)


@causal_linear_backward.register_fake
def _(dO, B, C, V, gamma, initial_state, dS, method, options, reverse, need_b, need_c, need_v,
      need_s0, cu_seqlens=None, scale=1.0, g=None, SN=None, need_g=False):
    def grad(x, need):
        return forward.output_like(x) if need else V.new_empty(0)
    return (grad(B, need_b), grad(C, need_c), grad(V, need_v), grad(initial_state, need_s0),
            grad(g, need_g))


def _setup_context(ctx, inputs, output):
    (B, C, V, gamma, initial_state, method, options, reverse, output_final_state, cu_seqlens,
     scale, _, *rest) = inputs
    g = rest[0] if rest else None
    ctx.save_for_backward(B, C, V, gamma, initial_state, cu_seqlens, g,
                          output[1] if g is not None and output_final_state else None)
    ctx.args = (method, options, reverse, output_final_state, scale)
    ctx.g_index = 12


def _backward(ctx, dO, dS):
    """The gradients of (B, C, V, gamma, initial_state) and of the gates (at ``ctx.g_index``),
    None for every other input of the custom op (``ctx.args``: :func:`_setup_context`) or of
    :class:`Eager` (``ctx.resolved``)."""
    B, C, V, gamma, S0, cu_seqlens, g, SN = ctx.saved_tensors
    if any(map(wrapped, (dO, B, C, V))):  # (torch.func.grad, vjp: wrappers without storage)
        with outside_transforms():
            return _backward_of(ctx, *map(unwrapped, (B, C, V, gamma, S0, cu_seqlens, g, SN,
                                                       dO, dS)))
    return _backward_of(ctx, B, C, V, gamma, S0, cu_seqlens, g, SN, dO, dS)


def _backward_of(ctx, B, C, V, gamma, S0, cu_seqlens, g, SN, dO, dS):
    method, options, reverse, final, scale = ctx.args
    need_b, need_c, need_v, _, need_s0 = ctx.needs_input_grad[:5]
    need_g = g is not None and ctx.needs_input_grad[ctx.g_index]
    dO = torch.zeros_like(V) if dO is None else dO.to(V.dtype)
    dS = dS if final and dS is not None and dS.numel() else None
    grad = (dO, B, C, V, gamma, S0, dS)
    flags = (reverse, need_b, need_c, need_v, bool(need_s0), cu_seqlens, scale)
    gates = dict(g=g, SN=SN if dS is not None else None, need_g=bool(need_g))
    resolved = getattr(ctx, "resolved", None)
    if resolved is None:
        dB, dC, dV, dS0, dg = causal_linear_backward(*grad, method, options, *flags, **gates)
    else:  # (eager: the gradients may share one buffer; a custom op's outputs may not alias)
        dB, dC, dV, dS0, dg = backward._gradients(*resolved, *grad, *flags, shared=True, **gates)
    out = [dB if need_b else None, dC if need_c else None, dV if need_v else None, None,
           dS0 if need_s0 else None] + [None] * (len(ctx.needs_input_grad) - 5)
    if need_g:
        out[ctx.g_index] = dg
    return tuple(out)


causal_linear.register_autograd(_backward, setup_context=_setup_context)


class Eager(torch.autograd.Function):
    """:func:`causal_linear` in eager mode: the same forward (:func:`run`) and backward
    (:func:`_gradients`) by a method and options already resolved (:func:`prepare`), without the
    custom op's dispatch, which costs host time on every call (its schema's defaults,
    aliasing checks and the method resolved again; NOTES.md). ``torch.compile`` traces the custom
    op instead (:func:`leetrepro.causal_linear_decoder` chooses). First-order only, as the op."""

    @staticmethod
    def forward(B, C, V, gamma, initial_state, resolved, reverse, output_final_state, cu_seqlens,
                scale, g=None):
        m, opts = resolved
        return forward.run(m, opts, B, C, V, gamma, initial_state, reverse, output_final_state,
                           cu_seqlens=cu_seqlens, scale=scale, g=g)

    @staticmethod
    def setup_context(ctx, inputs, output):
        # (the forward apart from its context: what torch.func's transforms ask of a Function)
        B, C, V, gamma, initial_state, resolved, reverse, output_final_state, cu_seqlens, \
            scale, *rest = inputs
        g = rest[0] if rest else None
        ctx.save_for_backward(B, C, V, gamma, initial_state, cu_seqlens, g,
                              output[1] if g is not None and output_final_state else None)
        ctx.args = (None, None, reverse, output_final_state, scale)
        ctx.resolved = resolved
        ctx.g_index = 10

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dO, dS):
        return _backward(ctx, dO, dS)
