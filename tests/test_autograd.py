"""Training: gradients of every method against float64 autograd through the oracle, the custom op
(opcheck), gradcheck, and torch.compile(fullgraph=True) of a model that calls the operator."""
import pytest
import torch

from leetrepro import causal_linear_decoder, reference, registry, rel_error
from leetrepro.bench.gpu_check import frozen_subsets
from leetrepro.methods import methods
from leetrepro.reference import TOLERANCE

from conftest import (KERNEL_DEVICE, interpreted_once, make_inputs, method_params, patch_package,
                      random_gammas, tolerance)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
INTERPRETED = DEVICE == "cpu"
# every method that runs here (Triton kernels under the interpreter on a CPU), bar the unsafe one
METHODS = [m for m in methods() if not m.unsafe and m.supports(torch.float32, torch.device(DEVICE))]
# odd N (no block divides it), r ≠ d, batch > 1; small blocks so blocks are crossed
SHAPE = (2, 3, 37, 8, 5)
SMALL = {"Bb": {"block_size": 16}, "LA_torch": {"block_size": 16}, "Recur": {"base": 4}}


def _tol(m, dtype):
    return tolerance(dtype, tf32=m.language == "triton" and not INTERPRETED)


def _grads(fn, inputs, cotangents, wrt=None):
    outs = fn(*inputs)
    outs = outs if isinstance(outs, tuple) else (outs,)
    loss = sum((o.double() * c).sum() for o, c in zip(outs, cotangents))
    return torch.autograd.grad(loss, inputs if wrt is None else wrt)


def _check_gradients(m, dtype, decay, state, shape=SHAPE, opts=None, wanted="BCVS"):
    b, h, n, r, d = shape
    B, C, V = make_inputs(*shape, dtype=dtype, device=DEVICE, seed=n + r)
    g = random_gammas(h, seed=3, low=0.7).to(DEVICE) if decay else None
    S0 = torch.randn(b, h, r, d, device=DEVICE) if state else None
    opts = SMALL.get(m.abbr, {}) if opts is None else opts
    gen = torch.Generator(device=DEVICE).manual_seed(1)
    dO = torch.randn(b, h, n, d, device=DEVICE, generator=gen, dtype=torch.float64)
    cots = [dO] + ([torch.randn(b, h, r, d, device=DEVICE, generator=gen, dtype=torch.float64)]
                   if state else [])
    leaves = [t.detach().requires_grad_(name in wanted)
              for name, t in zip("BCVS", (B, C, V) + ((S0,) if state else ()))]
    asked = [t for t in leaves if t.requires_grad]
    ours = _grads(lambda *x: causal_linear_decoder(
        *x[:3], g, method=m.name, initial_state=x[3] if state else None,
        output_final_state=state, **opts), leaves, cots, asked)
    exact = [t.detach().double().requires_grad_() for t in leaves]
    want = _grads(lambda *x: reference(*x[:3], g, initial_state=x[3] if state else None,
                                       output_final_state=state), exact, cots)
    assert len(ours) == len(asked) > 0
    ours = iter(ours)
    for name, leaf, w in zip("BCVS", leaves, want):
        if not leaf.requires_grad:
            continue
        a = next(ours)
        assert a.dtype == leaf.dtype and a.shape == w.shape
        err = rel_error(a, w)
        assert err <= _tol(m, dtype), f"d{name}: relative error {err:.2e}"


@pytest.mark.parametrize("method", method_params(METHODS))
@pytest.mark.parametrize("decay", [False, True], ids=["mask01", "decay"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_gradients_of_every_method(method, decay, dtype):
    if not method.supports(dtype, torch.device(DEVICE)):
        pytest.skip(f"{method.abbr} does not run {dtype} here")
    interpreted_once(method, dtype == torch.float32)
    _check_gradients(method, dtype, decay, state=False)


@pytest.mark.parametrize("method", [m for m in METHODS if m.language == "torch"], ids=lambda m: m.abbr)
def test_gradients_in_bfloat16(method):
    _check_gradients(method, torch.bfloat16, True, state=False)


@pytest.mark.parametrize("method", [m for m in METHODS if m.state], ids=lambda m: m.abbr)
@pytest.mark.parametrize("decay", [False, True], ids=["mask01", "decay"])
def test_gradients_through_the_states(method, decay):
    _check_gradients(method, torch.float32, decay, state=True)


# a frozen embedding, LoRA, a probe: some inputs need no gradient. Every method, every subset of
# {B, C, V} (and of {B, C, V, S0} where the method takes a state); the fast lane keeps four of Chunk's
# (the fused dual sweep; the sweep-count test below runs a PyTorch method's separate sweeps too)
QUICK_SUBSETS = {"B", "CV", "BCV", "S"}   # each input alone or with others, the state alone
SUBSET_CASES = [pytest.param(m, w, id=f"{m.abbr}-{w}",
                             marks=() if m.abbr == "Chunk" and w in QUICK_SUBSETS else pytest.mark.slow)
                for m in METHODS for w in frozen_subsets(m)]


@pytest.mark.parametrize("method, wanted", SUBSET_CASES)
def test_gradients_when_only_some_inputs_require_grad(method, wanted):
    interpreted_once(method, wanted in ("B", "CV"))
    _check_gradients(method, torch.float32, True, state=method.state, wanted=wanted,
                     shape=(2, 3, 21, 4, 3))


@pytest.mark.parametrize("abbr", ["Chunk", "LA_torch"])
@pytest.mark.parametrize("wanted", frozen_subsets(registry.get("Chunk")) + ["BCVS"])
def test_backward_sweeps_only_for_the_gradients_asked_for(abbr, wanted, monkeypatch):
    """dB alone is one forward sweep, dV alone or dC alone one reverse sweep; dV with dC one
    sweep where the method has the fused (dual) reverse sweep, else two; dS0 rides on either."""
    from leetrepro import ops
    method = next(m for m in METHODS if m.abbr == abbr)
    sweeps = []
    real_run = ops.run

    def counting_run(m, opts, B, C, V, gamma, initial_state, reverse, output_final_state, dual=None,
                     **kw):
        sweeps.append("dual" if dual is not None else "rev" if reverse else "fwd")
        return real_run(m, opts, B, C, V, gamma, initial_state, reverse, output_final_state,
                        dual, **kw)

    B, C, V = make_inputs(1, 2, 9, 4, 3, seed=4, device=DEVICE)
    S0 = torch.randn(1, 2, 4, 3, device=DEVICE)
    leaves = [t.requires_grad_(n in wanted) for n, t in zip("BCVS", (B, C, V, S0))]
    out, s = causal_linear_decoder(*leaves[:3], 0.9, method=abbr, initial_state=leaves[3],
                                   output_final_state=True)
    patch_package(monkeypatch, ops, "run", counting_run)
    (out.sum() + s.sum()).backward()
    reverse = {"C", "V", "S"} & set(wanted)
    fused = method.dual and "C" in reverse and len(reverse) > 1
    want = ["dual"] if fused else sorted(["rev"] * (("V" in wanted or wanted in ("S", "BS"))
                                                    + ("C" in wanted)))
    want = want + (["fwd"] if "B" in wanted else [])
    assert sorted(sweeps) == sorted(want)
    for name, t in zip("BCVS", leaves):
        assert (t.grad is not None) == (name in wanted), name


@pytest.mark.slow
def test_chunk_backward_across_segments():
    chunk = next((m for m in METHODS if m.abbr == "Chunk"), None)
    if chunk is None:
        pytest.skip("Chunk does not run here")
    _check_gradients(chunk, torch.float32, True, state=True, shape=(1, 2, 200, 16, 12),
                     opts={"segment": 64})


def test_gradcheck_in_float64():
    B, C, V = (t.double().requires_grad_() for t in make_inputs(2, 2, 13, 3, 4, seed=2))
    S0 = torch.randn(2, 2, 3, 4, dtype=torch.float64, requires_grad=True)
    g = torch.tensor([0.8, 0.95], dtype=torch.float64)
    assert torch.autograd.gradcheck(
        lambda *x: causal_linear_decoder(*x[:3], g, method="LA_torch", block_size=4,
                                         initial_state=x[3], output_final_state=True),
        (B, C, V, S0))


@pytest.mark.slow  # seconds: every registered op's schema, fake tensor and autograd checks
def test_opcheck():
    """The custom op's schema, fake implementation and autograd registration."""
    from leetrepro.ops import causal_linear
    B, C, V = make_inputs(2, 3, 21, 4, 5, seed=7)
    g = torch.tensor([0.9, 0.8, 1.0], dtype=torch.float64)
    S0 = torch.randn(2, 3, 4, 5)
    cases = [
        (B, C, V, None, None, "Bb", '{"block_size": 8}', False, False),
        (B, C, V, g, None, "auto", "", False, False),
        (B, C, V, g, S0, "LA_torch", "", False, True),
        (B, C, V, g, S0, "auto", "", True, True),
    ]
    # time-major views (a model's layout): the fake's O and gradients take V's and the inputs'
    # dimension order, as the kernels write them
    tm = [t.transpose(1, 2).contiguous().transpose(1, 2) for t in (B, C, V)]
    on = [t.to(KERNEL_DEVICE) for t in (*tm, g, S0)]  # (Chunk on its kernels' device)
    cases += [(*tm, g, None, "LA_torch", "", False, False),
              (*on[:4], on[4], "Chunk", '{"fp32_precision": "ieee"}', False, True)]
    # a method with a backward of its own (ECA's products), in both layouts
    cases += [(B, C, V, g, None, "ECA", '{"depth": 1}', False, False),
              (*tm, None, None, "ECA", "", False, False)]
    for args in cases:
        args = tuple(a.clone().requires_grad_() if isinstance(a, torch.Tensor) and a.dtype != torch.float64
                     else a for a in args)
        torch.library.opcheck(causal_linear, args)


@pytest.mark.parametrize("abbr", ["Chunk", "LA_torch"])
@pytest.mark.parametrize("wanted", ["BCVS", "CS", "B"])
def test_custom_op_and_eager_path_give_the_same_gradients(abbr, wanted):
    """Eager calls with gradients take ``ops.Eager`` (no custom-op dispatch), a compiled graph the
    custom op's own autograd: the same forward and the same sweeps, so the same numbers."""
    from leetrepro import ops
    if not any(m.abbr == abbr for m in METHODS):
        pytest.skip(f"{abbr} does not run here")
    B, C, V = make_inputs(2, 3, 21, 4, 5, seed=5, device=DEVICE)
    S0 = torch.randn(2, 3, 4, 5, device=DEVICE)
    g = torch.tensor([0.9, 0.7, 1.0], dtype=torch.float64, device=DEVICE)
    gen = torch.Generator(device=DEVICE).manual_seed(2)
    dO, dS = (torch.randn(2, 3, n, 5, device=DEVICE, generator=gen) for n in (21, 4))
    results = []
    for path in ("eager", "op"):
        leaves = [t.detach().clone().requires_grad_(name in wanted)
                  for name, t in zip("BCVS", (B, C, V, S0))]
        if path == "eager":
            out, s = causal_linear_decoder(*leaves[:3], g, method=abbr, initial_state=leaves[3],
                                           output_final_state=True)
        else:
            out, s = ops.causal_linear(*leaves[:3], g, leaves[3], abbr, "", False, True)
        grads = torch.autograd.grad((out * dO).sum() + (s * dS).sum(),
                                    [t for t in leaves if t.requires_grad])
        results.append((out.detach(), s.detach()) + grads)
    assert len(results[0]) == 2 + len(wanted)
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_eager_path_is_first_order_only():
    B, C, V = (t.requires_grad_() for t in make_inputs(1, 2, 9, 4, 3, seed=6, device=DEVICE))
    out = causal_linear_decoder(B, C, V, 0.9, method="LA_torch")
    (dB,) = torch.autograd.grad(out.sum(), B, create_graph=True)
    with pytest.raises(RuntimeError, match="does not require grad|differentiable"):
        dB.sum().backward()


class TinyLayer(torch.nn.Module):
    """A causal linear-attention layer as a model would hold it."""

    def __init__(self, gamma, heads=2, dim=16, method="auto"):
        super().__init__()
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.heads, self.gamma, self.method = heads, gamma, method

    def forward(self, x):
        b, n, dim = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, dim // self.heads).permute(2, 0, 3, 1, 4)
        o = causal_linear_decoder(q, k, v, self.gamma, method=self.method)
        return o.transpose(1, 2).reshape(b, n, dim)


@pytest.mark.slow
@pytest.mark.parametrize("gamma", [None, 0.9, torch.tensor([0.9, 0.5])], ids=["mask01", "float", "tensor"])
def test_torch_compile_fullgraph_forward_and_backward(gamma):
    torch.manual_seed(0)
    layer = TinyLayer(gamma).to(DEVICE)
    x = torch.randn(2, 40, 16, device=DEVICE)
    eager = layer(x)
    eager.square().sum().backward()
    want = [p.grad.clone() for p in layer.parameters()]
    layer.zero_grad()
    compiled = torch.compile(layer, fullgraph=True)
    out = compiled(x)
    out.square().sum().backward()
    torch.testing.assert_close(out, eager, rtol=1e-4, atol=1e-4)
    for p, w in zip(layer.parameters(), want):
        torch.testing.assert_close(p.grad, w, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("decay", ["g_gamma", "g"])
def test_the_drop_in_traces_whole_with_a_fixed_or_a_per_token_decay(decay):
    """chunk_simple_gla under torch.compile without a graph break: its per-head decay is looked
    up in a cache keyed by the tensor's version, which dynamo cannot trace (each layer of a
    compiled model broke its graph there)."""
    from leetrepro.compat import chunk_simple_gla
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 40, 2, 8) for _ in range(3))
    kw = dict(g_gamma=torch.tensor([0.9, 0.5]).log()) if decay == "g_gamma" else \
        dict(g=torch.nn.functional.logsigmoid(torch.randn(2, 40, 2)))

    def mix(q, k, v):
        return chunk_simple_gla(q, k, v, scale=1.0, **kw)[0]
    torch._dynamo.reset()
    out = torch.compile(mix, fullgraph=True, backend="eager")(q, k, v)
    torch.testing.assert_close(out, mix(q, k, v))


@pytest.mark.slow  # (torch.compile: seconds)
def test_the_compiled_drop_in_checks_its_decays_once_not_at_every_call(monkeypatch):
    """Traced, exp(g_gamma) was a new tensor at every run of the graph, and the operator copied
    each to the host to check it: a host sync per layer and step (a compiled model's steps 7 %
    slower with the drop-in than with causal_linear_decoder). The decays are now made by an op
    that runs with the graph and checks each g_gamma once; a bad g_gamma is still refused there."""
    from leetrepro.compat import chunk_simple_gla, decays_from_log
    from leetrepro.decay import per_head
    seen = []
    real = per_head._check_values
    monkeypatch.setattr(per_head, "_check_values", lambda *a: seen.append(1) or real(*a))
    q, k, v = (torch.randn(1, 24, 2, 4) for _ in range(3))
    lg = torch.tensor([0.9, 0.5]).log()
    torch._dynamo.reset()
    mix = torch.compile(lambda q, k, v, lg: chunk_simple_gla(q, k, v, g_gamma=lg, scale=1.0)[0],
                        fullgraph=True)
    want = chunk_simple_gla(q, k, v, g_gamma=lg.clone(), scale=1.0)[0]  # (another tensor)
    seen.clear()
    for _ in range(3):
        torch.testing.assert_close(mix(q, k, v, lg), want)
    assert len(seen) == 1
    with pytest.raises(ValueError, match=r"\(0, 1\]"):
        mix(q, k, v, torch.tensor([0.1, -0.2]))
    torch.library.opcheck(decays_from_log, (torch.tensor([-0.1, -0.7]),))


@pytest.mark.slow
def test_a_compiled_call_tells_auto_whether_its_gradient_is_taken(monkeypatch):
    """The op's forward cannot see autograd: the caller tells it (``differentiable``), so a
    compiled training step and a compiled inference call get auto's choice for each."""
    from leetrepro import dispatch
    seen = []
    real = dispatch._auto
    monkeypatch.setattr(dispatch, "_auto",
                        lambda n, dt, dev, call: seen.append(call) or real(n, dt, dev, call))
    torch._dynamo.reset()
    layer = TinyLayer(0.9).to(DEVICE)
    x = torch.randn(2, 40, 16, device=DEVICE)
    torch.compile(layer, fullgraph=True)(x).sum().backward()
    assert seen and all(c.grad and not c.head_major for c in seen)
    seen.clear()
    with torch.no_grad():
        torch.compile(layer, fullgraph=True)(x)
    assert seen and not any(c.grad for c in seen)


@pytest.mark.slow
def test_torch_compile_reduce_overhead_and_bad_gamma_at_run_time():
    torch._dynamo.reset()
    layer = TinyLayer(torch.tensor([0.9, 0.5]), method="Bb").to(DEVICE)
    compiled = torch.compile(layer, fullgraph=True, mode="reduce-overhead")
    x = torch.randn(2, 24, 16, device=DEVICE)
    for _ in range(3):  # warm-up, record, replay
        out = compiled(x)
    torch.testing.assert_close(out, layer(x), rtol=1e-4, atol=1e-4)
    # the values of a tensor gamma are checked when the compiled graph runs
    bad = TinyLayer(torch.tensor([0.9, 1.5]), method="Bb").to(DEVICE)
    with pytest.raises(ValueError, match=r"\(0, 1\]"):
        torch.compile(bad, fullgraph=True)(x)


@pytest.mark.slow
@pytest.mark.skipif(DEVICE != "cuda", reason="CUDA graphs (cudagraph trees) need a GPU")
@pytest.mark.parametrize("entry", ["causal_linear_decoder", "chunk_simple_gla"])
def test_reduce_overhead_training_steps_with_the_kernels(entry):
    """Training steps under ``torch.compile(mode="reduce-overhead")`` on the GPU kernels: the
    operator keeps no tensor made while cudagraph trees warm a graph up (its counters live
    outside the graph's pool; the drop-in's decays are a new tensor each call, the graph's own),
    and the replayed steps' gradients are eager's."""
    from leetrepro import chunk_simple_gla
    torch._dynamo.reset()
    heads, dim = 4, 256

    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = torch.nn.Linear(dim, 3 * dim)
            self.register_buffer("log_decay", torch.linspace(-0.2, -0.01, heads))

        def forward(self, x):
            b, n, _ = x.shape
            q, k, v = self.qkv(x).view(b, n, 3, heads, dim // heads).unbind(2)
            if entry == "chunk_simple_gla":
                o = chunk_simple_gla(q, k, v, g_gamma=self.log_decay, scale=1.0)[0]
            else:
                o = causal_linear_decoder(*(t.transpose(1, 2) for t in (q, k, v)),
                                          self.log_decay.exp()).transpose(1, 2)
            return o.reshape(b, n, dim)

    torch.manual_seed(0)
    layer = Layer().to(DEVICE)
    x = torch.randn(2, 200, dim, device=DEVICE)
    layer(x).square().mean().backward()
    want = [p.grad.clone() for p in layer.parameters()]
    compiled = torch.compile(layer, mode="reduce-overhead")
    for _ in range(4):  # warm-up, record, replays
        layer.zero_grad(set_to_none=True)
        torch.compiler.cudagraph_mark_step_begin()
        compiled(x).square().mean().backward()
    for p, w in zip(layer.parameters(), want):
        assert torch.isfinite(p.grad).all()
        assert rel_error(p.grad, w) <= 5e-3  # (tf32 products in the kernels)


@pytest.mark.skipif(DEVICE != "cuda", reason="CUDA graphs need a GPU")
def test_a_gamma_computed_inside_a_captured_call():
    """A gamma the captured code computes (a new tensor each call) is not read back during the
    capture (the warm-up calls checked its values), and the replay is eager's."""
    from leetrepro.bench.harness import capture_graph
    B, C, V = make_inputs(2, 3, 300, 64, 64, device=DEVICE, dtype=torch.bfloat16, seed=3)
    log_decay = torch.linspace(-0.3, -0.01, 3, device=DEVICE)
    out = torch.empty_like(V)
    graph = capture_graph(lambda: out.copy_(causal_linear_decoder(B, C, V, log_decay.exp())), (),
                          DEVICE)
    graph.replay()
    want = reference(*(t.double() for t in (B, C, V)), log_decay.exp().double())
    assert rel_error(out, want) <= TOLERANCE[torch.bfloat16]


def test_autocast_runs_in_the_autocast_dtype_with_gradients():
    B, C, V = (t.requires_grad_() for t in make_inputs(2, 2, 30, 4, 6, seed=5))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = causal_linear_decoder(B, C.to(torch.bfloat16), V, 0.9, method="LA_torch")
    assert out.dtype == torch.bfloat16
    ref = reference(*(t.detach().to(torch.bfloat16) for t in (B, C, V)), 0.9)
    assert rel_error(out, ref) <= TOLERANCE[torch.bfloat16]
    out.float().sum().backward()
    assert B.grad.dtype == torch.float32 and torch.isfinite(B.grad).all()
