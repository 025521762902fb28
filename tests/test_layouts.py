"""The layouts models hand the operator: time-major views of separate projections, the slices of
one fused projection, flash-linear-attention's layout, against head-major. Every method's forward
and gradients against float64, the layouts of what comes back (O time-major for a time-major V;
each gradient in its input's layout), and on the kernel path (Chunk) no copy of any input,
output or gradient: the kernels read and write every layout in place."""
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from leetrepro import causal_linear_decoder, reference, rel_error, split_projection
from leetrepro.bench.gpu_check import check_layouts
from leetrepro.bench.layouts import make_layout
from leetrepro.methods import methods
from leetrepro.ops import gradient_buffers, output_like

from conftest import method_params, random_gammas, tolerance

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
INTERPRETED = DEVICE == "cpu"
METHODS = [m for m in methods() if not m.unsafe and m.supports(torch.float32, torch.device(DEVICE))]
SMALL = {"Bb": {"block_size": 16}, "LA_torch": {"block_size": 16}, "Recur": {"base": 4}}
LAYOUTS = ["head-major", "model", "fused", "fused-interleaved"]


def leaves_in(layout: str, b, h, n, r, d, dtype=torch.float32, seed=0):
    """(the leaves gradients go to, a function of them giving B, C, V in ``layout``): those of
    :func:`leetrepro.bench.layouts.make_layout` (``model``: q, k, v ``(b, N, h, ·)`` transposed;
    ``fused``: :func:`split_projection`), and ``fused-interleaved``, the README's module's slices
    (per head [B_h C_h], then V) through autograd's own split and chunk."""
    if layout != "fused-interleaved":
        x, bcv, _ = make_layout(layout, b, h, n, r, d, dtype=dtype, device=DEVICE, seed=seed)
        return x, bcv
    y = torch.randn(b, n, h * (2 * r + d), generator=torch.Generator().manual_seed(seed))
    y = y.to(DEVICE, dtype).requires_grad_()

    def interleaved(y):
        bc, v = y.split([h * 2 * r, h * d], dim=-1)
        B, C = bc.view(b, n, h, 2 * r).transpose(1, 2).chunk(2, dim=-1)
        return B, C, v.view(b, n, h, d).transpose(1, 2)
    return [y], interleaved


#: (method, layout): every method in every layout (Chunk alone in the quick lane), the interpreted
#: FleetAttention (18 s a case, slow lane) in the model's time-major views only (its head-major
#: case is the other files'; the fused slices differ from those views only in ops' shared gradient
#: buffer, every other method's)
CASES = [pytest.param(p.values[0], layout, id=f"{p.id}-{layout}",
                      marks=tuple(p.marks) + (() if p.values[0].abbr == "Chunk" else (pytest.mark.slow,)))
         for p in method_params(METHODS) for layout in LAYOUTS
         if p.values[0].abbr != "FA" or layout == "model"]


@pytest.mark.parametrize("method, layout", CASES)
def test_every_method_in_every_layout(method, layout):
    """Forward and all gradients against float64 autograd (odd N, r ≠ d, batch 2, per-head decays),
    O in V's dimension order."""
    b, h, n, r, d = 2, 3, 37, 8, 5
    x, bcv = leaves_in(layout, b, h, n, r, d, seed=n)
    gam = random_gammas(h, seed=2, low=0.7).to(DEVICE)
    B, C, V = bcv(*x)
    out = causal_linear_decoder(B, C, V, gam, method=method.name, **SMALL.get(method.abbr, {}))
    assert out.stride() == output_like(V).stride()
    dO = torch.randn(b, n, h, d, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    dO = dO.transpose(1, 2)  # as autograd hands it back through O.transpose(1, 2).reshape(…)
    ours = torch.autograd.grad(out, x, dO)
    exact = [t.detach().double().requires_grad_() for t in x]
    ref = reference(*bcv(*exact), gam)
    want = torch.autograd.grad(ref, exact, dO.double())
    tol = tolerance(torch.float32, tf32=method.language == "triton" and not INTERPRETED)
    assert rel_error(out, ref) <= tol
    for a, w, leaf in zip(ours, want, x):
        assert torch.isfinite(a).all()
        assert rel_error(a, w) <= tol
        assert a.shape == leaf.shape


@pytest.mark.parametrize("layout", ["model", "fused"])
def test_time_major_outputs_and_gradients_come_back_in_place(layout):
    """Through a time-major V, O is time-major dense (the model's ``reshape(b, N, h·d)`` is a
    view); the leaves' gradients are contiguous in their own layout (no copy at AccumulateGrad)."""
    x, bcv = leaves_in(layout, 2, 3, 20, 8, 8)
    out = causal_linear_decoder(*bcv(*x), 0.9, method="LA_torch", block_size=16)
    assert out.transpose(1, 2).is_contiguous()
    out.transpose(1, 2).reshape(2, 20, -1).square().sum().backward()
    assert all(t.grad.is_contiguous() for t in x)


def test_gradient_buffers_share_one_buffer_only_for_disjoint_slices():
    y = torch.randn(2, 9, 3 * (2 * 4 + 6))
    B, C, V = split_projection(y, 3, 4, 6)
    dB, dC, dV = gradient_buffers(B, C, V, True, True, True, shared=True)
    assert dB.untyped_storage().data_ptr() == dV.untyped_storage().data_ptr()
    assert (dB.stride(), dC.storage_offset(), dV.storage_offset()) == \
        (B.stride(), C.storage_offset(), V.storage_offset())
    # a frozen part, overlapping views, a larger storage: separate dense buffers
    for args in ((B, C, V, True, False, True), (B, B, V, True, True, True),
                 (*split_projection(torch.randn(2, 9, 3 * 14 + 1)[..., :42], 3, 4, 6), True, True,
                  True)):
        grads = gradient_buffers(*args, shared=True)
        ptrs = {g.untyped_storage().data_ptr() for g in grads if g is not None}
        assert len(ptrs) == sum(g is not None for g in grads)


def test_split_projection_checks_its_shape():
    with pytest.raises(ValueError, match=r"heads·\(2r \+ d\)"):
        split_projection(torch.randn(2, 5, 30), 3, 4, 6)


class _Copies(TorchDispatchMode):
    """The copies made under it: aten ops that write one tensor's values into another's memory."""
    COPY = ("copy_", "clone", "_to_copy", "cat", "contiguous", "index_put", "stack")

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.__name__.split(".")[0]
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        # (the interpreter stages each kernel argument's storage as bytes: uint8, not a copy of
        # a tensor on the GPU path)
        if name in self.COPY and any(t.dtype != torch.uint8 for t in tensors):
            self.seen.append((name, max((t.numel() for t in tensors), default=0)))
        return func(*args, **(kwargs or {}))


@pytest.mark.skipif(not INTERPRETED, reason="the interpreter's own copies are told apart here")
@pytest.mark.parametrize("layout", ["model", "fused", "fused-interleaved"])
def test_no_copy_on_the_kernel_path(layout):
    """Chunk's forward and backward in a model's layouts copy no input, output or gradient
    (copies of at least one row block's worth of elements; under the interpreter the kernels'
    own reads are numpy views, not aten ops). The README's interleaved slices, cut by autograd's
    own split and chunk, copy nothing either (``projection.rejoined``: no concatenation), and
    the projection's gradient is the buffer the kernel wrote."""
    b, h, n, r, d = 2, 2, 40, 16, 16
    x, bcv = leaves_in(layout, b, h, n, r, d)
    B, C, V = bcv(*x)
    dO = torch.randn(b, n, h, d).transpose(1, 2)
    with _Copies() as fwd:
        out = causal_linear_decoder(B, C, V, 0.9, method="Chunk")
    with _Copies() as bwd:
        grads = torch.autograd.grad(out, x, dO)
    small = b * h * n * min(r, d) // 4  # any copy of a tensor this large is a copy of an input
    assert [c for c in fwd.seen if c[1] >= small] == []
    assert [c for c in bwd.seen if c[1] >= small] == []
    assert all(g.shape == t.shape for g, t in zip(grads, x))
    if layout != "model":  # the projection's gradient is the buffer the kernel wrote
        assert grads[0].is_contiguous()


@pytest.mark.slow  # (seconds a case: the full lane runs it)
@pytest.mark.parametrize("method", ["LA_torch", "Chunk"])
def test_the_correctness_matrix_checks_every_layout(method):
    """``gpu_check``'s layout rows, run here: O and dB, dC, dV in each model layout, all passing,
    each naming its layout."""
    from leetrepro import registry
    rows = []
    check_layouts(registry.get(method), (2, 3, 37, 8, 5), torch.float32, DEVICE, 1, rows, {})
    assert len(rows) == 12 and all(r["status"] == "pass" for r in rows), rows
    assert {r["note"].split("; ")[1] for r in rows} == \
        {"model layout", "drop-in layout", "fused layout"}


@pytest.mark.parametrize("wanted", ["BCVS", "CS", "VS", "S", "B"])
def test_gradients_come_in_the_layouts_the_fake_implementation_promises(wanted):
    """What the backward returns has the strides of its fake (shape-only) implementation, which
    a compiled graph trusts: each gradient dense in its input's dimension order, dS0 too (a
    reverse sweep's state may come out transposed)."""
    from leetrepro import registry
    from leetrepro.ops.backward import _gradients
    x, bcv = leaves_in("model", 2, 3, 20, 4, 6)
    B, C, V = (t.detach() for t in bcv(*x))
    S0 = torch.randn(2, 3, 4, 6, device=DEVICE)
    dO = torch.randn(2, 20, 3, 6, device=DEVICE).transpose(1, 2)
    dS = torch.randn(2, 3, 4, 6, device=DEVICE)
    g = torch.tensor([0.9, 0.8, 1.0], dtype=torch.float64, device=DEVICE)
    need = [k in wanted for k in "BCVS"]
    grads = _gradients(registry.get("LA_torch"), {"block_size": 16}, dO, B, C, V, g, S0, dS,
                       False, *need, None, 1.0)
    for grad, like, asked in zip(grads, (B, C, V, S0), need):
        if asked:
            assert grad.stride() == output_like(like).stride()


@pytest.mark.parametrize("args, error, word", [
    ((2.0, 4), TypeError, "heads"), ((None, 4), TypeError, "heads"), ((True, 4), TypeError, "heads"),
    ((2, -1), ValueError, "r must"), ((2, 0), ValueError, "r must"), ((2, "4"), TypeError, "r must"),
    ((2, 4, 0), ValueError, "d must"), ((2, 4, 1.5), TypeError, "d must")])
def test_split_projection_names_the_bad_argument(args, error, word):
    y = torch.randn(1, 3, 2 * 12)
    with pytest.raises(error, match=word):
        split_projection(y, *args)
    with pytest.raises(TypeError, match="y must be a torch.Tensor"):
        split_projection([[1.0]], 2, 4)
    B, C, V = split_projection(y, torch.tensor(2), 4)  # a 0-d integer tensor is an int
    assert B.shape == (1, 2, 3, 4) and V.shape == (1, 2, 3, 4)


def test_hand_cut_slices_of_one_projection_give_its_gradient_without_a_concatenation():
    """``projection.rejoined`` (the API's eager path): B, C, V cut by hand from one tensor that
    needs grad and that they cover exactly are made again from it through one node, whose
    backward hands on the operator's buffer as that tensor's gradient; everything else keeps
    autograd's own path: a tensor with a column left over, a frozen part, views that are leaves
    of their own, a tensor that does not need grad, a ``torch.func`` transform's wrappers.
    Every gradient equals autograd's through the views (float64's, within fp32's contract,
    tf32's on a GPU), also where a view feeds a second use."""
    from leetrepro import projection
    b, h, n, r, d = 2, 3, 37, 4, 5
    gen = torch.Generator().manual_seed(4)

    def cut(x, width=2 * r + d):
        parts = x[..., :h * width].view(b, n, h, width).transpose(1, 2).split([r, r, d], -1)
        return list(parts)

    def grads(x, bcv, extra=None):
        out = causal_linear_decoder(*bcv, 0.9, method="Chunk")
        loss = (out * dO).sum() + (0.0 if extra is None else extra(bcv))
        return torch.autograd.grad(loss, x)
    dO = torch.randn(b, h, n, d, generator=gen).to(DEVICE)
    for width, extra in ((h * (2 * r + d), None), (h * (2 * r + d), lambda t: t[0].square().sum()),
                         (h * (2 * r + d) + 1, None)):
        x = torch.randn(b, n, width, generator=gen).to(DEVICE).requires_grad_()
        bcv = cut(x)
        assert (projection.rejoined(*bcv)[0] is not bcv[0]) == (width == h * (2 * r + d))
        got, = grads([x], bcv, extra)
        ref = x.detach().cpu().double().requires_grad_()
        rbcv = cut(ref)
        want, = torch.autograd.grad((reference(*rbcv, torch.full((h,), 0.9, dtype=torch.float64))
                                     * dO.cpu().double()).sum() + (0.0 if extra is None else
                                                                   extra(rbcv)), ref)
        assert rel_error(got.cpu(), want) <= tolerance(torch.float32, tf32=not INTERPRETED)
    x = torch.randn(b, n, h * (2 * r + d), generator=gen, requires_grad=True)
    frozen = cut(x)
    frozen[1] = frozen[1].detach()
    own = [t.detach().requires_grad_() for t in cut(x.detach())]
    for bcv in (frozen, own, cut(x.detach())):
        assert all(a is t for a, t in zip(projection.rejoined(*bcv), bcv))

    def under_a_transform(y):  # (torch.func's wrappers: their storage is not theirs to read)
        bcv = cut(y)
        assert all(a is t for a, t in zip(projection.rejoined(*bcv), bcv))
        return y.sum()
    torch.func.grad(under_a_transform)(x.detach())
    # the node's own path where the gradients are not one buffer: each copied into zeros
    bcv = projection.rejoined(*cut(x))
    dx, = torch.autograd.grad(bcv[0].sum() + 2 * bcv[2].sum(), x)
    want = torch.zeros(b, n, h, 2 * r + d)
    want[..., :r], want[..., 2 * r:] = 1.0, 2.0
    assert torch.equal(dx, want.view(b, n, -1))
