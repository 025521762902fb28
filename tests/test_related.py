"""The related papers' methods through the operator against their direct forms: the kernel
paper's normalised linear attention (1 + x), the linear transformer, RWKV's WKV, AFT-simple."""
import pytest
import torch

from leetrepro import related
from leetrepro.reference import rel_error

from conftest import quick_lane, real_codegen, tolerance


def _unit(x):
    return x / x.norm(dim=-1, keepdim=True)


def _qkv(batch, heads, n, r, d, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k = (_unit(torch.randn(batch, heads, n, r, generator=g, dtype=torch.float64)) for _ in "qk")
    v = torch.randn(batch, heads, n, d, generator=g, dtype=torch.float64)
    return tuple(t.to(dtype) for t in (q, k, v))


def _time_major(t, dtype, device="cpu"):
    """``t`` (batch, heads, N, ·) in ``dtype`` as a time-major tensor's view: a model's projection
    hands q, k and v so."""
    return t.to(device, dtype).transpose(1, 2).contiguous().transpose(1, 2)


def _sweep_case(dtype, constant):
    """The normaliser's sweep tests' inputs: q, k, v in float64 (q and k non-negative where the
    constant is 0, so the denominators stay positive) and their time-major copies in ``dtype``."""
    q, k, v = _qkv(2, 3, 150, 12, 70)
    if constant == 0.0:
        q, k = q.abs(), k.abs()
    return (q, k, v), [_time_major(t, dtype) for t in (q, k, v)]


def _grads(fn, ins, dO):
    ins = [t.detach().requires_grad_() for t in ins]
    out = fn(*ins)
    return out, torch.autograd.grad(out, ins, dO)


@pytest.mark.parametrize("constant", [1.0, 0.0, 2.5])
@pytest.mark.parametrize("method", ["auto", pytest.param("Chunk", marks=pytest.mark.slow),
                                    "LA_torch", "ECA"])
def test_normalized_matches_its_definition(method, constant):
    q, k, v = _qkv(2, 3, 53, 8, 6)
    if constant == 0.0:  # positive features keep the denominators positive
        q, k = q.abs(), k.abs()
    dO = torch.randn(2, 3, 53, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    ref, want = _grads(lambda *t: related.normalized_direct(*t, constant=constant), (q, k, v), dO)
    for fn in (related.normalized_linear_attention, related.normalized_via_ones):
        if method == "Chunk" and fn is related.normalized_via_ones:
            continue
        dtype = torch.float32 if method == "Chunk" else torch.float64
        out, got = _grads(lambda *t: fn(*t, constant=constant, method=method),
                          [t.to(dtype) for t in (q, k, v)], dO.to(dtype))
        tol = 1e-12 if dtype == torch.float64 else 1e-4
        assert rel_error(out, ref) < tol
        for a, b in zip(got, want):
            assert rel_error(a, b) < tol


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_normalized_accuracy_contract(dtype):
    q, k, v = _qkv(1, 2, 300, 16, 16)
    dO = torch.randn_like(v)
    ref, want = _grads(related.normalized_direct, (q, k, v), dO)
    out, got = _grads(related.normalized_linear_attention, [t.to(dtype) for t in (q, k, v)],
                      dO.to(dtype))
    assert out.dtype == dtype and rel_error(out, ref) <= tolerance(dtype)
    for a, b in zip(got, want):
        assert a.dtype == dtype and rel_error(a, b) <= tolerance(dtype)


def test_normalized_saves_inputs_output_and_row_sums_only():
    q, k, v = (t.float().requires_grad_() for t in _qkv(2, 4, 256, 16, 8))
    saved = []

    def pack(t):
        saved.append(t.numel())
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        related.normalized_linear_attention(q, k, v)
    inputs_output = q.numel() + k.numel() + 2 * v.numel()
    assert sum(saved) <= inputs_output + 2 * 4 * 256  # + the denominators, N per head


@pytest.mark.skipif(torch.cuda.is_available(), reason="the kernels interpreted on CPU tensors")
def test_normalized_rows_inside_save_their_rows_and_norms_only(monkeypatch):
    """With ``normalize_rows=True`` on the passes' kernels (interpreted): the layer saves q and k
    normalised in place of q and k, v, the output, and N floats per head for each of the
    denominators and the two rows' norms, nothing else (no copy of the raw q and k)."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("LEETREPRO_ROWS_KERNEL", "1")
    q, k, v = (t.float().mul(3).requires_grad_() for t in _qkv(2, 4, 40, 16, 8))
    saved = []

    def pack(t):
        saved.append(t.numel())
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        related.normalized_linear_attention(q, k, v, normalize_rows=True)
    assert sum(saved) == q.numel() + k.numel() + 2 * v.numel() + 3 * 2 * 4 * 40, saved


def test_only_the_gradients_asked_for():
    q, k, v = _qkv(1, 2, 40, 4, 4)
    v = v.requires_grad_()
    out = related.normalized_linear_attention(q, k, v)
    (dv,) = torch.autograd.grad(out.sum(), (v,))
    want = torch.autograd.grad(related.normalized_direct(q, k, v).sum(), (v,))[0]
    assert rel_error(dv, want) < 1e-12


@pytest.mark.parametrize("feature_map", sorted(related.FEATURE_MAPS))
def test_linear_transformer_matches_running_sums(feature_map):
    q, k, v = (t * 3 for t in _qkv(2, 2, 45, 6, 5))
    dO = torch.randn_like(v)
    ref, want = _grads(lambda *t: related.linear_transformer_direct(*t, feature_map=feature_map),
                       (q, k, v), dO)
    out, got = _grads(lambda *t: related.linear_transformer(*t, feature_map=feature_map),
                      (q, k, v), dO)
    assert rel_error(out, ref) < 1e-12
    for a, b in zip(got, want):
        assert rel_error(a, b) < 1e-12


def _rwkv(batch=2, t=50, dim=6, scale=1.0, dtype=torch.float64, seed=3):
    g = torch.Generator().manual_seed(seed)
    w, u = (torch.randn(dim, generator=g, dtype=torch.float64) for _ in "wu")
    k, v = (torch.randn(batch, t, dim, generator=g, dtype=torch.float64) for _ in "kv")
    return tuple(x.to(dtype) for x in (w, u, k * scale, v))


def test_wkv_matches_the_recurrence_and_the_quadratic_form():
    w, u, k, v = _rwkv()
    ref = related.wkv_direct(w, u, k, v)
    assert rel_error(related.wkv(w, u, k, v), ref) < 1e-12
    assert rel_error(related.wkv_quadratic(w, u, k, v), ref) < 1e-12
    # the gradients to k, v, u (the decay is fixed, as every γ of the operator)
    dO = torch.randn_like(v)
    _, want = _grads(lambda u, k, v: related.wkv_direct(w, u, k, v), (u, k, v), dO)
    _, got = _grads(lambda u, k, v: related.wkv(w, u, k, v), (u, k, v), dO)
    for a, b in zip(got, want):
        assert rel_error(a, b) < 1e-10


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_wkv_in_low_precision_and_with_large_keys(dtype):
    w, u, k, v = _rwkv(scale=20.0)  # e^k far beyond float32 without the per-channel shift
    ref = related.wkv_direct(w, u, k, v)
    out = related.wkv(*(x.to(dtype) for x in (w, u, k, v)))
    assert torch.isfinite(out).all()
    assert rel_error(out, ref) <= tolerance(dtype)


def test_aft_simple_is_a_running_sum():
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(2, 30, 5, generator=g, dtype=torch.float64) for _ in "qkv")
    assert rel_error(related.aft_simple(q, k, v), related.aft_simple_direct(q, k, v)) < 1e-12


@pytest.mark.slow  # seconds: a compilation
def test_normalized_compiles_into_one_graph():
    q, k, v = (t.float() for t in _qkv(1, 2, 40, 8, 8))

    def layer(q, k, v):
        return related.normalized_linear_attention(q, k, v)
    compiled = torch.compile(layer, backend="aot_eager", fullgraph=True)
    dO = torch.randn_like(v)
    out, got = _grads(compiled, (q, k, v), dO)
    ref, want = _grads(related.normalized_direct, (q.double(), k.double(), v.double()), dO.double())
    assert rel_error(out, ref) < 1e-5
    for a, b in zip(got, want):
        assert rel_error(a, b) < 1e-5


@pytest.mark.slow  # (seconds a case: the full lane runs it)
@pytest.mark.skipif(torch.cuda.is_available(), reason="the kernels interpreted on CPU tensors: on "
                    "a GPU host Triton's driver is up already, and CPU tensors are refused")
@pytest.mark.parametrize("dtype, constant, need", [
    (torch.float32, 1.0, (True, True, True)), (torch.float16, 2.5, (True, True, True)),
    (torch.float32, 0.0, (True, True, True)), (torch.float32, 1.0, (False, True, False)),
    (torch.bfloat16, 1.0, (True, False, True))])
def test_normalized_passes_kernels_are_the_composition(monkeypatch, dtype, constant, need):
    """The normaliser's passes on their Triton kernels (``methods.normalizer``; interpreted here):
    the output and each wanted gradient against the float64 definition within the contract, and
    against PyTorch's composition; q and k strided views (time-major), N not a multiple of the
    kernels' chunk (several chunks), r ≠ d, batch > 1; each op through opcheck; 16-bit inputs with
    the running sums on the tensor cores (``RUN_ON_MMA``)."""
    from leetrepro.methods import normalizer
    q, k, v = _qkv(2, 3, 75, 12, 10)
    if constant == 0.0:
        q, k = q.abs(), k.abs()
    dO = torch.randn(2, 3, 75, 10, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    ref, want = _grads(lambda *t: related.normalized_direct(*t, constant=constant), (q, k, v), dO)

    def run():
        # (q and k as time-major views, as a model's projection hands them)
        ins = [_time_major(t, dtype).requires_grad_(w) for t, w in zip((q, k, v), need)]
        out = related.normalized_linear_attention(*ins, constant=constant)
        grads = torch.autograd.grad(out, [t for t in ins if t.requires_grad], dO.to(dtype))
        if normalizer.on_kernels(*ins):  # (each gradient in its input's layout)
            assert [g.stride() for g in grads] == [t.stride() for t in ins if t.requires_grad]
        return [out, *grads]
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.delenv("LEETREPRO_ROWS_KERNEL", raising=False)
    # (16-bit inputs with the running sums on the tensor cores, built off: the other tests take
    # tl.cumsum)
    monkeypatch.setattr(normalizer, "RUN_ON_MMA", True)
    assert not normalizer.on_kernels(q.float(), v.float())
    plain = run()
    monkeypatch.setenv("LEETREPRO_ROWS_KERNEL", "1")
    assert normalizer.on_kernels(q.to(dtype), v.to(dtype))
    got = run()
    exact = [ref] + [g for g, w in zip(want, need) if w]
    for a, p, e in zip(got, plain, exact):
        assert a.dtype == dtype and torch.isfinite(a).all()
        assert rel_error(a, e) <= tolerance(dtype), rel_error(a, e)
        assert rel_error(a, p.double()) <= tolerance(dtype)
    if dtype == torch.float32 and need == (True, True, True):
        small = [t[:1, :2, :40].float() for t in (q, k, v)]
        num = small[0][..., :10] * 0 + small[2]  # (any numerator: the pass does not read it twice)
        torch.library.opcheck(normalizer.normalized_output, (num, *small, constant, 1e-6))
        o, den = normalizer.normalized_output(num, *small, constant, 1e-6)
        do = torch.randn_like(o)
        pro = normalizer.normalized_prologue(do, o, den, small[0], small[1])
        torch.library.opcheck(normalizer.normalized_prologue, (do, o, den, small[0], small[1]))
        grads = [torch.randn_like(t) for t in small]
        for norms in ((None, None), tuple(t.norm(dim=-1) for t in small[:2])):
            torch.library.opcheck(normalizer.normalized_epilogue,
                                  (*grads, *small[:2], do, den, pro[1], pro[2], *norms,
                                   constant, 1e-12))


def _non_finite_rows_stay_on_their_side(sweep: bool, device: str, dtype, run: int):
    """A NaN in one row of k and an infinity in a later row of v: the output and dq before those
    rows are the clean call's, the output from them on non-finite, the other head untouched (a
    block's triangular product must not carry a non-finite entry to the rows before it)."""
    from leetrepro.methods import normalizer
    q, k, v = (t.to(device, dtype) for t in _qkv(1, 2, 75, 12, 10))
    dO = torch.randn(1, 2, 75, 10, generator=torch.Generator().manual_seed(3)).to(device, dtype)
    bad_k, bad_v = k.clone(), v.clone()
    bad_k[0, 0, 40, 3], bad_v[0, 0, 50, 1] = float("nan"), float("inf")
    old = normalizer.IN_SWEEP, normalizer.RUN_ON_MMA
    normalizer.IN_SWEEP, normalizer.RUN_ON_MMA = sweep, run != 0
    try:
        assert normalizer.on_kernels(q, v) and normalizer._run(v.dtype) == run
        def call(k, v):
            ins = [t.clone().requires_grad_(w) for t, w in zip((q, k, v), (True, False, False))]
            out = related.normalized_linear_attention(*ins)
            return out.float().cpu(), torch.autograd.grad(out, ins[0], dO)[0].float().cpu()
        (o, dq), (clean, clean_dq) = call(bad_k, bad_v), call(k, v)
    finally:
        normalizer.IN_SWEEP, normalizer.RUN_ON_MMA = old
    for a, b in ((o, clean), (dq, clean_dq)):
        assert torch.isfinite(a[0, 0, :40]).all() and torch.isfinite(a[0, 1]).all()
        assert rel_error(a[0, 0, :40], b[0, 0, :40]) <= 1e-3
        assert rel_error(a[0, 1], b[0, 1]) <= 1e-3
    assert (~torch.isfinite(o[0, 0, 40:])).all()


@pytest.mark.skipif(torch.cuda.is_available(), reason="the kernels interpreted on CPU tensors")
@pytest.mark.parametrize("sweep, run", [(False, 2), (False, 0),
                                        pytest.param(True, 2, marks=pytest.mark.slow)])
def test_a_non_finite_row_stays_on_its_side(monkeypatch, sweep, run):
    """:func:`_non_finite_rows_stay_on_their_side` interpreted, fp16: the passes' running sums on
    the tensor cores (``run`` 2: the interpreter's fp16 split) or by ``tl.cumsum`` (0), the
    forward as passes or as one sweep."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("LEETREPRO_ROWS_KERNEL", "1")
    _non_finite_rows_stay_on_their_side(sweep, "cpu", torch.float16, run=run)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("sweep", [False, True])
def test_a_non_finite_row_stays_on_its_side_on_the_gpu(sweep):
    """:func:`_non_finite_rows_stay_on_their_side` on a GPU, bf16, the running sums on the
    tensor cores (the bf16 split)."""
    _non_finite_rows_stay_on_their_side(sweep, "cuda", torch.bfloat16, run=1)


@pytest.mark.slow  # (seconds a case: the full lane runs it)
@pytest.mark.skipif(torch.cuda.is_available(), reason="the kernels interpreted on CPU tensors")
@pytest.mark.parametrize("dtype, need", [
    (torch.float32, (True, True, True)), (torch.float16, (True, True, True)),
    (torch.float32, (False, True, False)), (torch.float32, (True, False, False))])
def test_normalized_with_its_rows_normalized(monkeypatch, dtype, need):
    """``normalize_rows=True``: q and k normalised by rows inside the layer (the paper's Eq.
    22), their backward folded into the epilogue (interpreted) or PyTorch's normalize around the
    composition: output and each wanted gradient of the raw q, k, v against float64 (the
    definition of the normalised rows), time-major views, rows of several scales."""
    from leetrepro.methods import normalizer
    g = torch.Generator().manual_seed(7)
    q, k = (torch.randn(2, 3, 75, 12, generator=g, dtype=torch.float64) *
            torch.rand(2, 3, 75, 1, generator=g, dtype=torch.float64).add(0.2) * 3 for _ in "qk")
    v = torch.randn(2, 3, 75, 10, generator=g, dtype=torch.float64)
    dO = torch.randn(2, 3, 75, 10, generator=g, dtype=torch.float64)
    unit = lambda t: torch.nn.functional.normalize(t, dim=-1)  # noqa: E731
    ref, want = _grads(lambda a, b, c: related.normalized_direct(unit(a), unit(b), c), (q, k, v),
                       dO)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    for kernels, sweep in ((False, False), (True, True), (True, False)):
        if kernels:  # (the forward as one sweep, or as the operator and the passes)
            monkeypatch.setenv("LEETREPRO_ROWS_KERNEL", "1")
        monkeypatch.setattr(normalizer, "IN_SWEEP", sweep)
        ins = [_time_major(t, dtype).requires_grad_(w) for t, w in zip((q, k, v), need)]
        assert normalizer.on_kernels(*ins) == kernels
        assert normalizer.in_sweep(*ins, "auto", {}) == sweep
        out = related.normalized_linear_attention(*ins, normalize_rows=True)
        got = torch.autograd.grad(out, [t for t in ins if t.requires_grad], dO.to(dtype))
        for a, e in zip([out, *got], [ref] + [w for w, n in zip(want, need) if n]):
            assert a.dtype == dtype and torch.isfinite(a).all()
            assert rel_error(a.double(), e) <= tolerance(dtype), (kernels, sweep,
                                                                 rel_error(a.double(), e))


def _row_layouts(dtype):
    """(name, x) of the layouts a model hands a row normalisation: dense, a time-major view, a
    slice of a fused projection, a strided last dimension, three dimensions with a row of zeros
    and one below eps (fp32: in half precision its gradient, dy / eps, is past the range)."""
    g = torch.Generator().manual_seed(4)
    rnd = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    yield "dense", rnd(2, 37, 3, 20)
    yield "time-major view", rnd(2, 37, 3, 20).transpose(1, 2)
    yield "fused projection", rnd(2, 37, 60)[..., 20:40]
    yield "strided rows", rnd(20, 37).t()
    if dtype == torch.float32:
        z = rnd(2, 5, 20)
        z[0, 1], z[1, 2] = 0, z[1, 2] * 1e-14
        yield "zero and tiny rows", z


@pytest.mark.skipif(torch.cuda.is_available(), reason="the kernels interpreted on CPU tensors")
@pytest.mark.parametrize("dtype", quick_lane([torch.float32, torch.float16, torch.bfloat16],
                                             keep=(0,)))
def test_normalize_rows_kernels(monkeypatch, dtype):
    """``normalize_rows`` on its Triton passes (interpreted) against float64
    ``torch.nn.functional.normalize``, value and gradient, in every layout a model hands it: the
    result and the gradient in the input's dtype and layout, finite; both ops through opcheck."""
    from leetrepro.methods import normalizer
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("LEETREPRO_ROWS_KERNEL", "1")
    for name, x64 in _row_layouts(dtype):
        x = x64.to(dtype).requires_grad_()
        assert normalizer.on_row_norm_kernels(x), name
        dy = torch.randn(x.shape, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
        y = related.normalize_rows(x)
        dx, = torch.autograd.grad(y, x, dy.to(dtype))
        x64 = x64.detach().requires_grad_()
        ref = torch.nn.functional.normalize(x64, dim=-1)
        want, = torch.autograd.grad(ref, x64, dy)
        for a, e in ((y, ref), (dx, want)):
            assert a.dtype == dtype and torch.isfinite(a).all(), name
            assert rel_error(a.double(), e) <= tolerance(dtype), (name, rel_error(a.double(), e))
        if name in ("dense", "time-major view"):
            assert y.stride() == x.stride() and dx.stride() == x.stride(), name
    x = x64.detach().to(dtype)[:1].contiguous()
    torch.library.opcheck(normalizer.row_normalized, (x, 1e-12))
    y, s = normalizer.row_normalized(x, 1e-12)
    torch.library.opcheck(normalizer.row_normalized_backward, (torch.randn_like(y), y, s, 1e-12))


@pytest.mark.skipif(torch.cuda.is_available(), reason="the kernels interpreted on CPU tensors")
@pytest.mark.parametrize("dtype, constant", quick_lane(
    [(torch.float32, 1.0), (torch.float16, 2.5), (torch.float32, 0.0)], keep=(), unpack=True))
def test_normalized_in_one_sweep_against_float64(monkeypatch, dtype, constant):
    """The layer's forward as one sweep of Chunk's portable kernel (``normalizer.IN_SWEEP``;
    interpreted here): the output and the denominators against the float64 definition, and the
    layer's output and every gradient through it (its backward takes the saved denominators),
    within the contract; time-major q and k, N over several chunks and not a multiple of one,
    r ≠ d, batch > 1, more value columns than one block (two programs a lane, one storing the
    denominators); and with the lanes cut into segments. A call it cannot take (a decay) is
    refused by name."""
    from leetrepro.methods import chunk, normalizer
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("LEETREPRO_ROWS_KERNEL", "1")
    (q, k, v), ins = _sweep_case(dtype, constant)
    o, den = normalizer.normalized_in_sweep(*ins, constant, 1e-6)
    a = torch.tril(constant + q @ k.transpose(-1, -2))
    assert o.dtype == dtype and torch.isfinite(o).all()
    assert rel_error(o, related.normalized_direct(q, k, v, constant=constant)) <= tolerance(dtype)
    assert rel_error(den, a.sum(-1) + 1e-6) <= tolerance(dtype)
    # the lanes cut into segments of 64 rows, their sums published beside their states
    den2 = torch.empty_like(den)
    o2 = chunk.chunk_scan(*ins, None, kernel="portable", segment=64, norm=(constant, 1e-6, den2))
    assert rel_error(o2, o) <= tolerance(dtype) and rel_error(den2, den) <= tolerance(dtype)
    assert any(p.split for k, p in chunk.plans._PLANS.items() if k[0][0][11] == 64 and
               k[0][0][6] == dtype and k[0][0][-1])  # (the signature: segment, dtype, norm)
    monkeypatch.setattr(normalizer, "IN_SWEEP", True)
    assert normalizer.in_sweep(*ins, "auto", {})
    dO = torch.randn(2, 3, 150, 70, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    ref, want = _grads(lambda *t: related.normalized_direct(*t, constant=constant), (q, k, v), dO)
    out, got = _grads(lambda *t: related.normalized_linear_attention(*t, constant=constant), ins,
                      dO.to(dtype))
    for x, e in zip([out, *got], [ref, *want]):
        assert x.dtype == dtype and torch.isfinite(x).all()
        assert rel_error(x, e) <= tolerance(dtype), rel_error(x, e)
    with pytest.raises(ValueError, match="norm .* takes no a decay"):
        chunk.chunk_scan(*ins, torch.full((3,), 0.9, dtype=torch.float64), kernel="portable",
                         norm=(constant, 1e-6, den))
    if dtype == torch.float32 and constant == 1.0:  # (a custom op: checked, and compiled)
        small = [t[:1, :2, :40] for t in ins]
        torch.library.opcheck(normalizer.normalized_in_sweep, (*small, constant, 1e-6))
        compiled = torch.compile(related.normalized_linear_attention, fullgraph=True)
        out2, got2 = _grads(compiled, ins, dO.to(dtype))
        for x, e in zip([out2, *got2], [ref, *want]):
            assert rel_error(x, e) <= tolerance(dtype), rel_error(x, e)


@pytest.mark.slow  # (~20 s: Triton's code generation for sm_90 and ptxas)
def test_normalized_sweep_compiles_for_hopper_without_spills():
    """Chunk's portable sweep carrying the normaliser (``chunk_scan``'s ``norm``), as the GPU will
    run it at r = d = 128 (the whole state in one program, 8 warps), one segment a lane and
    segments, compiles for sm_90 in fp16, bf16 and fp32, its spills under a ceiling: 548, 548,
    808 and 548 (fp16, segments) bytes a thread at the last change (656, 656, 960 and 660 when
    the ceiling was set), where the plain sweep of the same tiles spills 184, 184, 116 and 228
    (its sums ride as [r, 16] and [16, d] products with ones: as fp32 vectors made from row
    tiles it spilled 1514 in fp16); and the scores' offsets (the normaliser's gradients: by rows
    forward, by columns and constant in reverse, the last two as the repair launch compiles
    them, 988 and 792 bytes at the first build), under the same ceiling."""
    code = ("from leetrepro.probes.regs import compile_ptx, ptxas_usage, spill_bytes\n"
            "for dt, bn, sp, nm, rp in (('fp16', 64, 0, 1, 0), ('bf16', 64, 0, 1, 0),\n"
            "        ('fp32', 32, 0, 1, 0), ('fp16', 64, 1, 1, 0), ('bf16', 64, 0, 2, 0),\n"
            "        ('bf16', 64, 0, 3, 1), ('bf16', 64, 0, 4, 1)):\n"
            "    use = ptxas_usage(compile_ptx(dt, False, bn, 2, split=bool(sp), norm=nm,\n"
            "                                  reverse=nm > 2, repair=bool(rp)))\n"
            "    print(dt, spill_bytes(use), use.strip()[-120:])\n")
    res = real_codegen("-c", code)
    lines = [line.split() for line in res.stdout.strip().split("\n")]
    assert [x[0] for x in lines] == ["fp16", "bf16", "fp32", "fp16", "bf16", "bf16", "bf16"], \
        res.stdout
    assert all(int(x[1]) <= 1024 for x in lines), res.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="the kernel interpreted on CPU tensors")
def test_the_chunks_sums_before_and_after_each_chunk(monkeypatch):
    """The chunk scan (interpreted): each chunk's sum over the chunks before it and after it,
    against float64 cumulative sums, over more chunks than a program takes at once (the carry)
    and a width not a multiple of its columns."""
    from leetrepro.methods import normalizer
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    block_c, block_w, _ = normalizer.SCAN_BLOCK
    sums = torch.randn(3, 2 * block_c + 5, block_w + 7, generator=torch.Generator().manual_seed(4))
    wide = sums.double()
    before = wide.cumsum(1) - wide
    after = wide.flip(1).cumsum(1).flip(1) - wide
    assert rel_error(normalizer._before(sums), before) <= 1e-6
    assert rel_error(normalizer._scan(sums, 0), after) <= 1e-6
    assert (normalizer._before(sums)[:, 0] == 0).all() and (normalizer._scan(sums, 0)[:, -1] == 0).all()
    # (the passes' parts side by side: the first block of columns forward, the rest reversed)
    mixed = normalizer._scan(sums, block_w)
    assert rel_error(mixed[..., :block_w], before[..., :block_w]) <= 1e-6
    assert rel_error(mixed[..., block_w:], after[..., block_w:]) <= 1e-6


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("segment", [None, 256])
def test_normalized_in_one_sweep_on_the_gpu(dtype, segment):
    """On a GPU, the normaliser's sweep (``chunk_scan``'s ``norm``, the portable kernel compiled):
    r = d = 128 time-major views, N not a multiple of a chunk, the lanes whole or cut into
    256-row segments; the output and the denominators against the float64 definition within the
    contract (fp32: tf32's), finite."""
    from leetrepro.methods import chunk
    q, k, v = _qkv(2, 4, 1000, 128, 128)
    a = torch.tril(1.0 + q @ k.transpose(-1, -2))
    ins = [_time_major(t, dtype, "cuda") for t in (q, k, v)]
    den = torch.empty(2, 4, 1000, dtype=torch.float32, device="cuda")
    o = chunk.chunk_scan(*ins, None, kernel="portable", segment=segment, norm=(1.0, 1e-6, den))
    tol = tolerance(dtype) if dtype != torch.float32 else 5e-3
    assert torch.isfinite(o).all() and torch.isfinite(den).all()
    assert rel_error(o.double().cpu(), related.normalized_direct(q, k, v)) <= tol
    assert rel_error(den.double().cpu(), a.sum(-1) + 1e-6) <= tol


@pytest.mark.parametrize("dtype, constant, rows", quick_lane(
    [(torch.float32, 1.0, False), (torch.float16, 2.5, True), (torch.float32, 0.0, True)],
    unpack=True))
def test_normalized_gradients_in_three_sweeps_against_float64(monkeypatch, dtype, constant, rows):
    """The layer's backward with dq, dk, dv each one sweep whose scores carry the running sums'
    terms (``normalizer.GRAD_IN_SWEEPS``, here ``"always"``: the portable kernel interpreted):
    every gradient against float64 within the contract, time-major q and k, N over several
    chunks and not a multiple of one, r ≠ d, batch > 1, with and without the rows normalised
    inside the layer; any one gradient alone; and the same numbers as the passes' path."""
    from leetrepro.methods import normalizer
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("LEETREPRO_ROWS_KERNEL", "1")
    (q, k, v), ins = _sweep_case(dtype, constant)
    dO = torch.randn(2, 3, 150, 70, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    unit = (lambda t: torch.nn.functional.normalize(t, dim=-1)) if rows else (lambda t: t)
    ref, want = _grads(lambda a, b, c: related.normalized_direct(unit(a), unit(b), c,
                                                               constant=constant), (q, k, v), dO)
    layer = lambda *t: related.normalized_linear_attention(  # noqa: E731
        *t, constant=constant, normalize_rows=rows)
    monkeypatch.setattr(normalizer, "GRAD_IN_SWEEPS", "always")
    assert normalizer.grads_in_sweeps(*ins)
    out, got = _grads(layer, ins, dO.to(dtype))
    for x, e in zip([out, *got], [ref, *want]):
        assert x.dtype == dtype and torch.isfinite(x).all()
        assert rel_error(x, e) <= tolerance(dtype), rel_error(x, e)
    for i in range(3):  # (one input needing its gradient)
        one = [t.detach().requires_grad_(j == i) for j, t in enumerate(ins)]
        g, = torch.autograd.grad(layer(*one), one[i], dO.to(dtype))
        assert rel_error(g, want[i]) <= tolerance(dtype)
    monkeypatch.setattr(normalizer, "GRAD_IN_SWEEPS", False)
    _, passes = _grads(layer, ins, dO.to(dtype))
    for x, e in zip(got, passes):
        assert rel_error(x, e) <= tolerance(dtype)


@pytest.mark.slow  # (seconds: opcheck's and the compiler's)
def test_normalized_three_sweeps_ops_pass_opcheck_and_compile_whole(monkeypatch):
    """The three sweeps' custom ops pass ``opcheck``, and the layer with them compiles into one
    graph (``fullgraph=True``) whose output and gradients are float64's within the contract."""
    from leetrepro.methods import normalizer
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(normalizer, "GRAD_IN_SWEEPS", "always")
    (q, k, v), ins = _sweep_case(torch.float32, 1.0)
    small = [t[:1, :2, :40].contiguous() for t in ins]
    dnum = torch.randn(1, 2, 40, 70)
    dden = torch.randn(1, 2, 40, dtype=torch.float32)
    torch.library.opcheck(normalizer.normalized_grads_in_sweeps,
                          (dnum, dden, *small, 1.0, [True, True, True]))
    torch.library.opcheck(normalizer.normalized_prologue_rows,
                          (dnum, torch.randn_like(dnum), dden.abs() + 1.0))
    dO = torch.randn(2, 3, 150, 70, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    ref, want = _grads(lambda a, b, c: related.normalized_direct(a, b, c), (q, k, v), dO)
    layer = lambda *t: related.normalized_linear_attention(*t, normalize_rows=False)  # noqa: E731
    out, got = _grads(torch.compile(layer, fullgraph=True), ins, dO.float())
    for x, e in zip([out, *got], [ref, *want]):
        assert rel_error(x, e) <= tolerance(torch.float32), rel_error(x, e)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("rows", [False, True])
def test_normalized_gradients_in_hopper_sweeps_on_the_gpu(rows):
    """On an sm_90 GPU, the layer's backward in three sweeps of the Hopper kernel (the default
    where it takes them: bf16, r = d = 128), time-major views, N not a multiple of a chunk, the
    lanes whole (2 × 3 × 1000) and cut into segments (1 × 3 × 5000): every gradient against
    float64 within the contract, finite, and the passes' path's within bf16's rounding; the
    sweeps' plans ran the Hopper kernel."""
    from leetrepro.methods import chunk, normalizer
    for batch, heads, n in ((2, 3, 1000), (1, 3, 5000)):
        q, k, v = _qkv(batch, heads, n, 128, 128)
        if rows:
            q, k = (t * torch.linspace(0.3, 3.0, n, dtype=t.dtype)[:, None] for t in (q, k))
        dO = torch.randn(batch, heads, n, 128, dtype=torch.float64,
                         generator=torch.Generator().manual_seed(3))
        unit = (lambda t: torch.nn.functional.normalize(t, dim=-1)) if rows else (lambda t: t)
        ref, want = _grads(lambda a, b, c: related.normalized_direct(unit(a), unit(b), c),
                           (q, k, v), dO)
        ins = [_time_major(t, torch.bfloat16, "cuda") for t in (q, k, v)]
        if not normalizer.grads_in_sweeps(*ins):
            pytest.skip("needs the Hopper kernel (an sm_90 GPU)")
        layer = lambda *t: related.normalized_linear_attention(  # noqa: E731
            *t, normalize_rows=rows)
        out, got = _grads(layer, ins, dO.to("cuda", torch.bfloat16))
        for a, e in zip([out, *got], [ref, *want]):
            assert torch.isfinite(a).all() and \
                rel_error(a.double().cpu(), e) <= tolerance(torch.bfloat16), rel_error(a, e)
        # (the sweeps asked for by default: dq's, and dv's with dk as its dual output; the
        # dual's two plain portable plans stand by for its repair launches)
        offsets = [p for key, p in chunk.plans._PLANS.items() if key[0][0][-1] >= 2 and
                   key[0][0][0] == n and key[1] == "auto"]
        assert len(offsets) == 2 and all(p.kernel == "hopper" for p in offsets)
        old, normalizer.GRAD_IN_SWEEPS = normalizer.GRAD_IN_SWEEPS, False
        try:
            _, passes = _grads(layer, ins, dO.to("cuda", torch.bfloat16))
        finally:
            normalizer.GRAD_IN_SWEEPS = old
        for a, e in zip(got, passes):  # (bf16's roundings, in another order)
            assert rel_error(a, e) <= tolerance(torch.bfloat16), rel_error(a, e)
    # a NaN in one row of dO: dk and dv after it (in the reverse sweep, the rows swept before
    # it, its own chunk's among them, repaired by the dual's two plain repair launches) are the
    # clean call's, finite; the other head's untouched
    bad = dO.to("cuda", torch.bfloat16)
    clean = _grads(layer, ins, bad)[1]
    bad[0, 1, 600, 5] = float("nan")
    dirty = _grads(layer, ins, bad)[1]
    for i in (1, 2):  # (the repaired rows: the portable kernel's, rounded its own way)
        a, e = dirty[i][0, 1, 601:], clean[i][0, 1, 601:]
        assert torch.isfinite(a).all() and rel_error(a, e) <= tolerance(torch.bfloat16)
        assert torch.equal(dirty[i][0, 0], clean[i][0, 0])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("r, constant, segment", [(128, 1.0, None), (128, 2.5, 256),
                                                  (64, 1.0, 128), (128, 0.0, None)])
def test_normalized_in_one_hopper_sweep_on_the_gpu(r, constant, segment):
    """On an sm_90 GPU, the normaliser's sweep on the Hopper kernel (``chunk.tables.HOPPER_NORM``, bf16,
    d = 128): time-major views, N not a multiple of a chunk, batch > 1, the lanes whole, cut by
    the launcher (3 lanes of 5000 rows: a few programs, so segments) or into the segments
    asked; the output and the denominators against the float64 definition within the contract,
    finite, and equal to the portable kernel's sweep within bf16's rounding; the plan says it ran
    the Hopper kernel, and a call it cannot take (fp16) is refused by name."""
    from leetrepro.methods import chunk
    if chunk.hopper_norm_unfit(*(torch.empty(1, 1, 64, n, device="cuda", dtype=torch.bfloat16)
                                 for n in (r, r, 128))):
        pytest.skip("needs the Hopper kernel (an sm_90 GPU)")
    for batch, heads, n in ((2, 3, 1000), (1, 3, 5000)):
        q, k, v = _qkv(batch, heads, n, r, 128)
        if constant == 0.0:
            q, k = q.abs(), k.abs()
        a = torch.tril(constant + q @ k.transpose(-1, -2))
        ins = [_time_major(t, torch.bfloat16, "cuda") for t in (q, k, v)]
        den = torch.empty(batch, heads, n, dtype=torch.float32, device="cuda")
        o = chunk.chunk_scan(*ins, None, segment=segment, norm=(constant, 1e-6, den))
        # (the plans' keys: (signature: N, r, …, segment at 11, …, norm last), kernel asked, …)
        plan = [p for key, p in chunk.plans._PLANS.items() if key[0][0][-1] and key[1] == "auto" and
                key[0][0][:2] == (n, r) and key[0][0][11] == segment]
        assert plan and all(p.kernel == "hopper" for p in plan)
        assert torch.isfinite(o).all() and torch.isfinite(den).all()
        assert rel_error(o.double().cpu(), related.normalized_direct(q, k, v, constant=constant)) \
            <= tolerance(torch.bfloat16)
        assert rel_error(den.double().cpu(), a.sum(-1) + 1e-6) <= tolerance(torch.bfloat16)
        den2 = torch.empty_like(den)
        o2 = chunk.chunk_scan(*ins, None, kernel="portable", segment=segment,
                              norm=(constant, 1e-6, den2))
        # (the same bf16 inputs: the sums as exact as fp32's in both, rounded apart in O)
        assert rel_error(o, o2) <= 4e-3, rel_error(o, o2)
        assert rel_error(den, den2) <= 1e-5, rel_error(den, den2)
    with pytest.raises(ValueError, match="kernel='hopper' cannot run norm"):
        chunk.chunk_scan(*(t.half() for t in ins), None, kernel="hopper",
                         norm=(constant, 1e-6, den))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("rows", [False, True])
def test_normalized_passes_on_the_gpu(dtype, rows):
    """On a GPU, where the normaliser's passes run on their kernels: the layer (time-major views
    of q, k, v, as a model's projection hands them; r = d = 128, N not a multiple of the chunk)
    against the float64 definition within the contract (fp32: the operator's tf32), output and
    every gradient finite; ``rows``: q and k of several scales, normalised inside the layer
    (``normalize_rows=True``)."""
    from leetrepro.methods import normalizer
    q, k, v = _qkv(2, 4, 1000, 128, 128)
    if rows:
        q, k = (t * torch.linspace(0.3, 3.0, 1000, dtype=t.dtype)[:, None] for t in (q, k))
    dO = torch.randn(2, 4, 1000, 128, dtype=torch.float64,
                     generator=torch.Generator().manual_seed(3))
    unit = (lambda t: torch.nn.functional.normalize(t, dim=-1)) if rows else (lambda t: t)
    ref, want = _grads(lambda a, b, c: related.normalized_direct(unit(a), unit(b), c), (q, k, v),
                       dO)
    ins = [_time_major(t, dtype, "cuda") for t in (q, k, v)]
    assert normalizer.on_kernels(*ins)
    layer = lambda *t: related.normalized_linear_attention(*t, normalize_rows=rows)  # noqa: E731
    out, got = _grads(layer, ins, dO.to("cuda", dtype))
    tol = tolerance(dtype) if dtype != torch.float32 else 5e-3
    for a, e in zip([out, *got], [ref, *want]):
        assert torch.isfinite(a).all() and rel_error(a.double().cpu(), e) <= tol
    # (one compiled graph holds the passes' custom ops, forward and backward)
    compiled = torch.compile(layer, fullgraph=True)
    out2, got2 = _grads(compiled, ins, dO.to("cuda", dtype))
    for a, e in zip([out2, *got2], [ref, *want]):
        assert torch.isfinite(a).all() and rel_error(a.double().cpu(), e) <= tol


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_normalize_rows_on_the_gpu(dtype):
    """On a GPU, ``normalize_rows`` (its Triton passes compiled) in every layout of
    :func:`_row_layouts` against float64, value and gradient, finite, in the input's dtype."""
    from leetrepro.methods import normalizer
    for name, x64 in _row_layouts(dtype):
        x = x64.to("cuda", dtype).requires_grad_()
        assert normalizer.on_row_norm_kernels(x)
        dy = torch.randn(x.shape, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
        y = related.normalize_rows(x)
        dx, = torch.autograd.grad(y, x, dy.to("cuda", dtype))
        x64 = x64.detach().requires_grad_()
        ref = torch.nn.functional.normalize(x64, dim=-1)
        want, = torch.autograd.grad(ref, x64, dy)
        for a, e in ((y, ref), (dx, want)):
            assert a.dtype == dtype and torch.isfinite(a).all(), name
            assert rel_error(a.double().cpu(), e) <= tolerance(dtype), name
