"""Custom ops called without the dispatcher in eager mode (``leetrepro._direct``): the same numbers
as the op, bit for bit, forward and backward; the op itself wherever something traces the call."""
import pytest
import torch

from leetrepro import _direct
from leetrepro.methods import ssd_rows
from leetrepro.models import _conv, _norm


def _calls():
    """(name, op, the module's direct call, positional inputs as fresh leaves)."""
    g = torch.Generator().manual_seed(0)

    def r(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64)
    return [
        ("gated_rms_norm", _norm.gated_rms_norm_fwd, _norm._gated_rms_norm_fwd,
         lambda: (r(2, 5, 12), r(2, 5, 12), r(12), 1e-5, 3)),
        ("causal_conv_silu", _conv.causal_conv_silu_fwd, _conv._causal_conv_silu_fwd,
         lambda: (r(2, 9, 6), r(6, 1, 4), r(6), None)),
        ("ssd_rows", ssd_rows.ssd_rows, ssd_rows._ssd_rows,
         lambda: (r(2, 7, 3, 4), r(2, 7, 3).abs(), r(2, 7, 3, 4), None, True)),
        ("dt_gates", ssd_rows.dt_gates, ssd_rows._dt_gates,
         lambda: (r(2, 7, 3), r(3), -r(3).abs(), True, 0.0, 5.0)),
    ]


@pytest.mark.parametrize("name, op, call, inputs", _calls(), ids=lambda v: v if isinstance(v, str) else "")
@pytest.mark.parametrize("grad", [False, True])
def test_direct_call_gives_the_op_s_numbers_and_gradients(name, op, call, inputs, grad):
    """Every input that can take a gradient asks for one (``grad``): outputs and gradients equal
    the op's bit for bit; without gradients the direct call runs the implementation alone."""
    args = inputs()
    leaves = [a for a in args if isinstance(a, torch.Tensor) and a.is_floating_point()]
    results = []
    for fn in (op, call):
        fresh = [a.detach().clone().requires_grad_(grad) if isinstance(a, torch.Tensor) else a
                 for a in args]
        out = fn(*fresh)
        outs = out if isinstance(out, tuple) else (out,)
        grads = ()
        if grad and op._backward_fn is not None:
            ts = [t for t in fresh if isinstance(t, torch.Tensor) and t.requires_grad]
            first = outs[0]
            grads = torch.autograd.grad(first, ts, torch.ones_like(first) * 0.5)
        results.append((outs, grads))
    (o1, g1), (o2, g2) = results
    assert leaves and len(o1) == len(o2)
    assert all(torch.equal(a, b) for a, b in zip(o1, o2))
    assert len(g1) == len(g2) and all(torch.equal(a, b) for a, b in zip(g1, g2))
    if grad and op._backward_fn is not None:
        assert g1 and all(g.abs().sum() > 0 for g in g1)


def test_direct_call_takes_the_op_where_something_traces(monkeypatch):
    """Under a dispatch mode (fake tensors), a functorch transform, with a tensor subclass, or
    with ``DIRECT = False``, the call goes through the op; in plain eager mode it does not."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    seen = []
    op = _norm.gated_rms_norm_fwd
    real = op._init_fn
    monkeypatch.setattr(op, "_init_fn", lambda *a: (seen.append("impl"), real(*a))[1])
    call = _direct.direct(op)
    y, z, w = torch.randn(3, 8), torch.randn(3, 8), torch.randn(8)
    assert _direct.traced((y, z, w)) is False
    call(y, z, w, 1e-5, 1)
    with FakeTensorMode() as mode:
        fy, fz, fw = (mode.from_tensor(t) for t in (y, z, w))
        assert _direct.traced((fy, fz, fw))
        out = call(fy, fz, fw, 1e-5, 1)[0]
    assert out.shape == y.shape and seen == ["impl"]  # (the fake call took the op's fake)
    monkeypatch.setattr(_direct, "DIRECT", False)
    assert torch.equal(call(y, z, w, 1e-5, 1)[0], op(y, z, w, 1e-5, 1)[0])


def test_direct_call_under_vmap_and_subclasses_is_traced():
    """functorch's transforms and tensor subclasses count as tracing."""
    seen = []
    torch.func.vmap(lambda a: (seen.append(_direct.traced((a,))), a)[1])(torch.randn(2, 3))
    assert seen == [True]

    class Sub(torch.Tensor):
        pass
    assert _direct.traced((torch.randn(2).as_subclass(Sub),))
    assert not _direct.traced((torch.nn.Parameter(torch.randn(2)), 3, None))


def test_direct_marks_what_an_op_mutates():
    """An op that mutates an argument, called directly, bumps that tensor's version counter as
    its dispatch does; an op with keyword-only arguments keeps the dispatcher."""
    @torch.library.custom_op("leetrepro_test::fill_first", mutates_args=("t",))
    def fill_first(t: torch.Tensor, v: float) -> torch.Tensor:
        t[0] = v
        return t.sum(0, keepdim=True).clone()

    @fill_first.register_fake
    def _(t, v):
        return t.new_empty(1, *t.shape[1:])
    call = _direct.direct(fill_first)
    t = torch.zeros(3, 2)
    version = t._version
    out = call(t, 2.0)
    assert t._version > version and torch.equal(t[0], torch.full((2,), 2.0))
    assert torch.equal(out, torch.full((1, 2), 2.0))

    @torch.library.custom_op("leetrepro_test::keyword_only", mutates_args=())
    def keyword_only(x: torch.Tensor, *, k: float) -> torch.Tensor:
        return x * k
    with pytest.raises(ValueError, match="keyword-only"):
        _direct.direct(keyword_only)


def test_compiled_graph_holds_the_op():
    """``torch.compile`` traces the op, not its implementation (the graph keeps the custom op)."""
    from torch._dynamo.testing import CompileCounterWithBackend
    counter = CompileCounterWithBackend("eager")
    y, z, w = torch.randn(3, 8), torch.randn(3, 8), torch.randn(8)
    fn = torch.compile(lambda a, b, c: _norm.gated_rms_norm(a, b, c), backend=counter,
                       fullgraph=True)
    assert torch.equal(fn(y, z, w), _norm.gated_rms_norm(y, z, w))
    graph = counter.graphs[0]
    assert any("leetrepro.gated_rms_norm" in str(n.target) for n in graph.graph.nodes)


def test_eager_calls_enter_autograd_functions_without_binding_their_defaults(monkeypatch):
    """An eager call with gradients enters the package's autograd Functions (the operator's,
    the SSD's rows, the Mamba-2 block's custom ops) by their C entry (``_direct.apply``):
    ``Function.apply``'s Python binds a Function's defaults with ``inspect.signature`` on every
    call where it defines ``setup_context`` (about 55 µs of host time against 8). None is bound
    through the operator, the SSD drop-in or a Mamba-2 block's forward; outputs and gradients are
    bit for bit those of ``Function.apply`` (the switch off, which binds them)."""
    import inspect

    from leetrepro import causal_linear_decoder
    from leetrepro.compat import mamba_chunk_scan_combined
    from leetrepro.models import Mamba2Block
    gen = torch.Generator().manual_seed(3)
    b, L, H, P, G, N = 2, 24, 4, 8, 2, 16
    gamma = torch.linspace(0.8, 0.99, H, dtype=torch.float64)
    block = Mamba2Block(d_model=16, d_state=N, headdim=8).double()
    inputs = [torch.randn(b, H, L, 5, generator=gen, dtype=torch.float64) for _ in range(2)] + \
        [torch.randn(b, H, L, 6, generator=gen, dtype=torch.float64),
         torch.randn(b, L, H, P, generator=gen, dtype=torch.float64),
         torch.rand(b, L, H, generator=gen, dtype=torch.float64),
         -torch.rand(H, generator=gen, dtype=torch.float64),
         torch.randn(b, L, G, N, generator=gen, dtype=torch.float64),
         torch.randn(b, L, G, N, generator=gen, dtype=torch.float64),
         torch.randn(H, generator=gen, dtype=torch.float64),
         torch.randn(b, L, 16, generator=gen, dtype=torch.float64)]

    def run():
        leaves = [t.clone().requires_grad_() for t in inputs]
        B, C, V, x, dt, A, Bm, Cm, D, u = leaves
        outs = (causal_linear_decoder(B, C, V, gamma, method="Vanilla"),
                mamba_chunk_scan_combined(x, dt, A, Bm, Cm, chunk_size=8, D=D,
                                          dt_softplus=True),
                block(u))
        sum(o.square().sum() for o in outs).backward()
        return [o.detach() for o in outs] + [t.grad for t in leaves] + \
            [p.grad.clone() for p in block.parameters()]
    bound = []
    real = inspect.signature

    def signature(fn, *a, **k):  # (a Function's forward: what Function.apply binds)
        if getattr(fn, "__qualname__", "").endswith(".forward"):
            bound.append(fn.__qualname__)
        return real(fn, *a, **k)
    block.zero_grad()
    run()  # (the first call's checks and plans, remembered)
    monkeypatch.setattr(inspect, "signature", signature)
    block.zero_grad()
    fast = run()
    assert bound == [], bound
    monkeypatch.setattr(_direct, "C_APPLY", False)
    block.zero_grad()
    slow = run()
    assert len(bound) >= 3  # (Function.apply binds them: the operator's, the SSD's, the block's)
    assert all(torch.equal(a, w) for a, w in zip(fast, slow))


def test_direct_apply_unwraps_what_a_finished_transform_left_wrapped():
    """``_direct.apply`` hands a Function's forward a tensor that a finished torch.func
    transform left wrapped (a "dead" wrapper, leaked from inside ``grad``) unwrapped, as
    ``Function.apply`` does, and gives its result."""
    seen = []

    class Double(torch.autograd.Function):
        @staticmethod
        def forward(x, k):
            seen.append(_direct.wrapped(x))
            return x * k

        @staticmethod
        def setup_context(ctx, inputs, output):
            ctx.k = inputs[1]

        @staticmethod
        def backward(ctx, g):
            return g * ctx.k, None
    leaked = []

    def f(x):
        leaked.append(x)
        return x.sum()
    base = torch.randn(3)
    torch.func.grad(f)(base)
    assert _direct.wrapped(leaked[0])  # (a dead wrapper of base)
    out = _direct.apply(Double, leaked[0], 2.0)
    assert seen == [False] and torch.equal(out, base * 2)
