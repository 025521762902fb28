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

_PLAIN = (torch.Tensor, torch.nn.Parameter)
#: argument types that are not tensor subclasses, told apart without ``isinstance(·,
#: torch.Tensor)`` (the tensor's metaclass makes that check cost as much as a small op's call)
_NOT_SUBCLASSES = frozenset(_PLAIN + (int, bool, float, str, type(None), torch.dtype))


def traced(args) -> bool:
    """Whether a call with these positional arguments must take the custom op: a compiler, a
    dispatch mode or a functorch transform is active, or an argument is a tensor subclass."""
    if torch.compiler.is_compiling() or torch._C._len_torch_dispatch_stack() or transformed():
        return True
    return any(type(a) not in _NOT_SUBCLASSES and isinstance(a, torch.Tensor) for a in args)


def transformed() -> bool:
    """Whether a torch.func transform (``grad``, ``vjp``, ``vmap``) is active."""
    return torch._C._functorch.peek_interpreter_stack() is not None


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
    def backward(ctx, *grads):
        needs = ctx.needs_input_grad
        try:
            ctx.needs_input_grad = needs[:-1]
            out = ctx.direct_op._backward_fn(ctx, *grads)
        finally:
            ctx.needs_input_grad = needs
        return (*out, None) if isinstance(out, tuple) else (out, None)


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
            return op(*args)
        if op._backward_fn is not None and torch.is_grad_enabled() and any(
                isinstance(a, torch.Tensor) and a.requires_grad for a in args):
            if len(args) < len(signature.parameters):  # (setup_context sees every input)
                bound = signature.bind(*args)
                bound.apply_defaults()
                args = bound.args
            return _Autograd.apply(*args, op)
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
