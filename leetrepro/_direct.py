"""Custom ops called without the dispatcher where nothing traces them.

Every pass around the operator is a ``torch.library`` custom op with its fake, so that
``torch.compile`` holds it in a graph and ``opcheck`` tests it. An eager call of a custom op pays
for that on the host: the dispatcher, the op's Python wrapper (its schema's aliasing check) and,
for an op with ``register_autograd``, a generated ``autograd.Function`` and a redispatch below
autograd. A Mamba-2 layer makes about a dozen such calls a training step, so an eager step pays
them a dozen times. :func:`direct` returns a callable that runs the op's own Python
implementation (and its registered autograd) directly where nothing traces the call, and the op
itself otherwise: under ``torch.compile``, a ``TorchDispatchMode`` (fake tensors, functional
tensors, ``opcheck``), ``functorch`` transforms (``vmap``, ``grad``) or tensor subclasses among
the arguments. Both give the same numbers, bit for bit: the same implementation runs.

``DIRECT = False`` sends every call through the op (the A/B switch of the host-time
measurements).
"""
from __future__ import annotations

import inspect

import torch

#: whether eager calls skip the dispatcher (False: every call takes the custom op)
DIRECT = True

#: whether :func:`apply` enters an autograd Function's C entry in eager mode (False:
#: ``Function.apply`` always; the A/B switch of its host-time measurement)
C_APPLY = True

_PLAIN = (torch.Tensor, torch.nn.Parameter)
#: argument types that are not tensor subclasses, told apart without ``isinstance(·,
#: torch.Tensor)`` (the tensor's metaclass makes that check cost as much as a small op's call)
_NOT_SUBCLASSES = frozenset(_PLAIN + (int, bool, float, str, type(None), torch.dtype))


def traced(args) -> bool:
    """Whether a call with these positional arguments must take the custom op: a compiler, a
    dispatch mode or a functorch transform is active, or an argument is a tensor subclass."""
    # (the transforms' check inline, not through transformed(): every eager direct call runs it)
    if torch.compiler.is_compiling() or torch._C._len_torch_dispatch_stack() \
            or torch._C._functorch.peek_interpreter_stack() is not None:
        return True
    return any(type(a) not in _NOT_SUBCLASSES and isinstance(a, torch.Tensor) for a in args)


def transformed() -> bool:
    """Whether a torch.func transform (``grad``, ``vjp``, ``vmap``) is active."""
    return torch._C._functorch.peek_interpreter_stack() is not None


def refuse_transforms(what: str) -> None:
    """A NotImplementedError naming ``what`` where a torch.func transform is active: an entry
    whose autograd has no torch.func support yet, refused by name rather than by PyTorch's
    complaint about a Function's ``setup_context``."""
    if not torch.compiler.is_compiling() and transformed():
        raise NotImplementedError(
            f"{what} under torch.func transforms (grad, vjp, vmap, functional_call's gradients) "
            f"is not supported yet: take its gradients with torch.autograd (loss.backward(), "
            f"torch.autograd.grad); causal_linear_decoder, chunk_simple_gla, "
            f"mamba_chunk_scan_combined and Mamba2Block support torch.func.grad")


def outside_transforms():
    """A context in which torch.func's active transforms are set aside: tensors made in it are
    plain (a factory call under ``grad`` makes a wrapper, whose storage cannot be read)."""
    from torch._functorch.pyfunctorch import temporarily_clear_interpreter_stack
    return temporarily_clear_interpreter_stack()


#: whether a tensor is a torch.func transform's wrapper (its storage is not its own to read)
wrapped = torch._C._functorch.is_functorch_wrapped_tensor


def unwrapped(t):
    """t without torch.func's gradient wrappers (``grad``, ``vjp``): what a kernel can read, for
    a value no gradient flows through (a decay) or a first-order backward, whose results need
    none. A vmap's batched tensor (``vmap``, ``jacrev``, ``jacfwd``, ``hessian``) is refused:
    the kernels have no batching rule."""
    functorch = torch._C._functorch
    while isinstance(t, torch.Tensor) and wrapped(t):
        if functorch.is_batchedtensor(t):
            raise NotImplementedError(
                "the operator under torch.func.vmap (also jacrev, jacfwd, hessian) is not "
                "supported: its kernels have no batching rule; torch.func.grad and vjp work, "
                "or loop over the rows")
        t = functorch.get_unwrapped(t)
    return t


def apply(function, *args):
    """``function.apply(*args)`` (an ``autograd.Function``; every argument of its forward given,
    positionally: its ``setup_context`` sees them as passed). In eager mode it enters the
    Function's C entry directly: ``Function.apply``'s Python binds the defaults of a Function
    with ``setup_context`` by ``inspect.signature`` on every call, about 55 µs of host time a
    call where the C entry takes 8 (notes/gates.md), and every eager layer call of the operator
    goes through one or more. Under ``torch.compile`` or a torch.func transform,
    ``function.apply`` itself (what those trace and transform). As ``Function.apply`` does, a
    tensor a finished transform left wrapped is unwrapped first (a plain ``torch.Tensor`` by type:
    those wrappers are never a subclass)."""
    if not C_APPLY or torch.compiler.is_compiling() or \
            torch._C._are_functorch_transforms_active():
        return function.apply(*args)
    return super(torch.autograd.Function, function).apply(
        *[_unwrap_if_dead(a) if type(a) is torch.Tensor else a for a in args])


_unwrap_if_dead = torch._C._functorch.unwrap_if_dead


class _PlainContext:
    """An ``autograd.Function``'s context whose saved tensors come without torch.func's wrappers
    (:func:`unwrapped`); everything else is the context's own."""

    def __init__(self, ctx):
        self._ctx = ctx

    @property
    def saved_tensors(self) -> tuple:
        return tuple(unwrapped(t) for t in self._ctx.saved_tensors)

    def __getattr__(self, name):
        return getattr(self._ctx, name)


def plain_backward(backward):
    """An ``autograd.Function``'s first-order ``backward`` (its class also defines
    ``setup_context``, which torch.func asks of a Function) made to run under ``torch.func.grad``
    and ``vjp``: under a transform it runs outside it, on the unwrapped gradients and saved
    tensors, so that its kernels read plain tensors and its custom ops meet no transform (their
    generated Functions have no ``setup_context``). Elsewhere it runs as written."""
    def run(ctx, *grads):
        if not torch.compiler.is_compiling() and transformed():
            with outside_transforms():
                return backward(_PlainContext(ctx), *(unwrapped(g) for g in grads))
        return backward(ctx, *grads)
    run.__doc__, run.__name__ = backward.__doc__, backward.__name__
    return run


class _Autograd(torch.autograd.Function):
    """An op's registered autograd (``register_autograd``'s ``setup_context`` and ``backward``)
    around its implementation: what the custom op's own autograd does, without the dispatch. The
    op rides last, as the custom op's own generated function passes its metadata, so that the
    registered backward sees ``ctx.needs_input_grad`` of the op's inputs alone."""

    @staticmethod
    def forward(*args):
        return args[-1]._init_fn(*args[:-1])

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.direct_op = inputs[-1]
        ctx.direct_op._setup_context_fn(ctx=ctx, inputs=inputs[:-1], output=output)

    @staticmethod
    @plain_backward
    def backward(ctx, *grads):
        needs = ctx.needs_input_grad
        try:
            ctx.needs_input_grad = needs[:-1]
            out = ctx.direct_op._backward_fn(ctx, *grads)
        finally:
            ctx.needs_input_grad = needs
        return (*out, None) if isinstance(out, tuple) else (out, None)


def _transformed_only(args) -> bool:
    """Whether a torch.func transform is what makes :func:`traced` true: no compiler, no dispatch
    mode, no tensor subclass among the arguments."""
    return transformed() and not torch.compiler.is_compiling() and \
        not torch._C._len_torch_dispatch_stack() and \
        all(type(a) in _NOT_SUBCLASSES or not isinstance(a, torch.Tensor) or wrapped(a)
            for a in args)


def _every(signature, args: tuple) -> tuple:
    """``args`` with the defaults of the parameters they leave out (setup_context sees every
    input)."""
    if len(args) < len(signature.parameters):
        bound = signature.bind(*args)
        bound.apply_defaults()
        args = bound.args
    return args


def direct(op):
    """``call(*args, **kwargs)``: ``op(*args, **kwargs)`` (a ``torch.library`` custom op), its
    implementation called directly where nothing traces the call (module docstring); with
    gradients where the op registered its autograd and an input needs one; the tensors an op
    mutates marked changed (their version counters), as its dispatch marks them."""
    signature = inspect.signature(op._init_fn)
    impl = op._init_fn
    mutated = [i for i, a in enumerate(op._opoverload._schema.arguments)
               if a.alias_info is not None and a.alias_info.is_write]
    # (torch.library takes no autograd formula for an op that mutates its arguments, so the
    # mutated ones are marked changed below and never meet _Autograd)
    if any(p.kind is p.KEYWORD_ONLY for p in signature.parameters.values()):
        raise ValueError(f"direct({op._name}): an op that takes keyword-only arguments keeps "
                         f"the dispatcher")

    def call(*args, **kwargs):
        if kwargs:
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            args = bound.args
        if not DIRECT or traced(args):
            if DIRECT and op._backward_fn is not None and _transformed_only(args):
                # (torch.func.grad, vjp: the op's own generated Function has no setup_context,
                # which a transform asks of it; this one has)
                return _Autograd.apply(*_every(signature, args), op)
            return op(*args)
        if op._backward_fn is not None and torch.is_grad_enabled() and any(
                isinstance(a, torch.Tensor) and a.requires_grad for a in args):
            return apply(_Autograd, *_every(signature, args), op)
        if not mutated:
            return impl(*args)
        out = impl(*args)
        # (as the op's dispatch does: autograd then sees a tensor written in place as changed)
        torch.autograd.graph.increment_version(
            [args[i] for i in mutated if i < len(args) and isinstance(args[i], torch.Tensor)])
        return out
    call.op = op
    call.__doc__ = op._init_fn.__doc__
    call.__name__ = op._init_fn.__name__
    return call
