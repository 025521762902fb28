"""Serving: packed variable-length prompts (``cu_seqlens``), the decode step over a state pool,
and the flash-linear-attention drop-in, against running each sequence alone through the oracle."""
import pytest
import torch

from leetrepro import causal_linear_decoder, chunk_simple_gla, decode_step, reference, rel_error
from leetrepro.reference import TOLERANCE

from conftest import make_inputs, quick_lane, random_gammas, tolerance

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
INTERPRETED = DEVICE == "cpu"
LENGTHS = [37, 0, 1, 100, 64]          # an empty sequence and one of one row among them
TRITON = pytest.importorskip("triton", reason="Triton is not installed") is not None


def _packed(lengths, heads, r, d, dtype, seed=0, time_major=False):
    n = sum(lengths)
    cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32,
                      device=DEVICE)
    if time_major:  # flash-linear-attention's layout, viewed as (1, heads, n, ·)
        g = torch.Generator().manual_seed(seed)
        q, k = (torch.randn(1, n, heads, r, generator=g) / r ** 0.5 for _ in range(2))
        v = torch.randn(1, n, heads, d, generator=g)
        B, C, V = (x.to(DEVICE, dtype).transpose(1, 2) for x in (q, k, v))
    else:
        B, C, V = make_inputs(1, heads, n, r, d, dtype=dtype, device=DEVICE, seed=seed)
    return B, C, V, cu


def _tol(dtype, method):
    return tolerance(dtype, tf32=method == "Chunk" and not INTERPRETED)


def _each(B, C, V, g, cu, S0=None, scale=1.0):
    """Each packed sequence alone through the oracle: O (times ``scale``) and the final states."""
    o, s = reference(B, C, V, g, initial_state=S0, output_final_state=True, cu_seqlens=cu)
    return o * scale, s


PACKED_METHODS = ["Chunk", "LA_torch"]
DTYPES = [torch.float32, torch.float16,
          pytest.param(torch.bfloat16, marks=pytest.mark.skipif(
              INTERPRETED, reason="bf16 dot kernels are refused under TRITON_INTERPRET=1"))]


@pytest.mark.parametrize("method", PACKED_METHODS)
@pytest.mark.parametrize("dtype", quick_lane(DTYPES, keep=(0, 2)))
@pytest.mark.parametrize("decay", quick_lane([False, True], keep=(1,)))
@pytest.mark.parametrize("time_major", [False, True])
def test_packed_prompts_equal_each_prompt_alone(method, dtype, decay, time_major):
    heads, r, d = 3, 8, 6
    B, C, V, cu = _packed(LENGTHS, heads, r, d, dtype, seed=1, time_major=time_major)
    g = random_gammas(heads, 2).to(DEVICE) if decay else None
    S0 = torch.randn(len(LENGTHS), heads, r, d, device=DEVICE)
    for s0 in (None, S0):
        out, fin = causal_linear_decoder(B, C, V, g, method=method, cu_seqlens=cu,
                                         initial_state=s0, output_final_state=True)
        want, want_s = _each(B, C, V, g, cu, s0)
        assert out.shape == V.shape and fin.shape == (len(LENGTHS), heads, r, d)
        assert rel_error(out, want) <= _tol(dtype, method)
        assert rel_error(fin, want_s) <= _tol(dtype, method)
        assert torch.isfinite(out).all()


@pytest.mark.parametrize("method", PACKED_METHODS)
def test_packed_gradients_equal_each_prompt_alone(method):
    heads, r, d = 2, 8, 5
    B, C, V, cu = _packed([20, 1, 0, 45], heads, r, d, torch.float32, seed=3)
    g = random_gammas(heads, 3).to(DEVICE)
    S0 = torch.randn(4, heads, r, d, device=DEVICE)
    gen = torch.Generator(device=DEVICE).manual_seed(4)
    dO = torch.randn(V.shape, device=DEVICE, generator=gen, dtype=torch.float64)
    dS = torch.randn(S0.shape, device=DEVICE, generator=gen, dtype=torch.float64)
    opts = {"fp32_precision": "ieee"} if method == "Chunk" else {}

    def grads(fn):
        leaves = [t.detach().clone().requires_grad_() for t in (B, C, V, S0)]
        o, s = fn(*leaves)
        ((o.double() * dO).sum() + (s.double() * dS).sum()).backward()
        return [t.grad for t in leaves]

    got = grads(lambda b, c, v, s0: causal_linear_decoder(
        b, c, v, g, method=method, cu_seqlens=cu, initial_state=s0, output_final_state=True,
        scale=0.5, **opts))
    want = grads(lambda b, c, v, s0: _each(b, c, v, g, cu, s0, scale=0.5))
    for name, a, w in zip(("dB", "dC", "dV", "dS0"), got, want):
        assert rel_error(a, w) <= 1e-5, name


def test_cu_seqlens_is_checked():
    B, C, V, cu = _packed([3, 4], 1, 2, 2, torch.float32)
    with pytest.raises(ValueError, match="end at N"):
        causal_linear_decoder(B, C, V, cu_seqlens=cu[:-1], method="LA_torch")
    with pytest.raises(TypeError, match="int32"):
        causal_linear_decoder(B, C, V, cu_seqlens=cu.float(), method="LA_torch")
    with pytest.raises(ValueError, match="batch of one"):
        causal_linear_decoder(*(torch.cat([x, x]) for x in (B, C, V)), cu_seqlens=cu)
    with pytest.raises(ValueError, match=r"\(sequences, heads, r, d\)"):
        causal_linear_decoder(B, C, V, cu_seqlens=cu, initial_state=torch.zeros(1, 1, 2, 2),
                              method="LA_torch")


# ---- the decode step ----------------------------------------------------------------------

def _steps(kernel: bool):
    """decode_step, or on a CPU the Triton kernel under the interpreter."""
    if not kernel:
        return decode_step

    def run(B, C, V, g, pool, slots, scale=1.0):
        from leetrepro.decay.per_head import normalize_gamma
        from leetrepro.decode import _triton_step
        return _triton_step(B, C, V, normalize_gamma(g, B.shape[1], B.device), pool, slots, scale)
    return run


@pytest.mark.parametrize("kernel", [False, True] if DEVICE == "cpu" else [False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("decay", [False, True])
def test_prefill_then_decode_equals_prefill_of_the_longer_prompt(kernel, dtype, decay):
    heads, r, d, n, k, batch = 3, 8, 6, 40, 5, 3
    step = _steps(kernel)
    B, C, V = make_inputs(batch, heads, n + k, r, d, dtype=dtype, device=DEVICE, seed=7)
    g = random_gammas(heads, 7).to(DEVICE) if decay else None
    want = reference(B, C, V, g)
    _, state = causal_linear_decoder(B[:, :, :n], C[:, :, :n], V[:, :, :n], g,
                                     output_final_state=True, method="LA_torch")
    pool = torch.randn(6, heads, r, d, device=DEVICE)        # other slots hold other sequences
    slots = torch.tensor([4, 0, 2], dtype=torch.int32, device=DEVICE)
    pool[slots.long()] = state.float()
    untouched = pool[[1, 3, 5]].clone()
    outs = [step(B[:, :, t:t + 1], C[:, :, t:t + 1], V[:, :, t:t + 1], g, pool, slots)
            for t in range(n, n + k - 2)]
    outs.append(step(B[:, :, n + k - 2:], C[:, :, n + k - 2:], V[:, :, n + k - 2:], g, pool, slots))
    got = torch.cat(outs, 2)
    assert got.dtype == dtype
    assert rel_error(got, want[:, :, n:]) <= TOLERANCE[dtype]
    _, final = reference(B, C, V, g, output_final_state=True)
    assert rel_error(pool[slots.long()], final) <= 1e-5
    assert torch.equal(pool[[1, 3, 5]], untouched)


def test_decode_step_is_checked():
    B, C, V = make_inputs(2, 1, 1, 4, 4)
    pool = torch.zeros(3, 1, 4, 4)
    with pytest.raises(ValueError, match="slots"):
        decode_step(B, C, V, 0.9, pool, torch.tensor([0]))
    with pytest.raises(ValueError, match="state_pool"):
        decode_step(B, C, V, 0.9, pool[:, :, :2], torch.tensor([0, 1]))


def test_decode_step_refuses_what_it_cannot_compute():
    """Integer tokens (they were truncated), half-precision pools (float32 and float64 are the
    rule), and slot ids outside the pool or named twice (they wrapped around, or lost an update),
    each a ValueError naming the dtype or the slot."""
    B, C, V = make_inputs(3, 2, 1, 4, 4)
    pool = torch.randn(5, 2, 4, 4)
    before = pool.clone()
    with pytest.raises(ValueError, match="V must be a floating tensor.*int64"):
        decode_step(B, C, (V * 3).long(), 0.9, pool, torch.tensor([0, 1, 2]))
    with pytest.raises(ValueError, match="B must be a floating tensor.*int32"):
        decode_step(B.int(), C.int(), V.int(), 0.9, pool, torch.tensor([0, 1, 2]))
    with pytest.raises(ValueError, match="float32 or float64.*torch.float16"):
        decode_step(B, C, V, 0.9, pool.half(), torch.tensor([0, 1, 2]))
    with pytest.raises(ValueError, match=r"slots\[1\] = -1 is outside the state pool.*0 … 4"):
        decode_step(B, C, V, 0.9, pool, torch.tensor([0, -1, 2]))
    with pytest.raises(ValueError, match=r"slots\[2\] = 5 is outside"):
        decode_step(B, C, V, 0.9, pool, torch.tensor([0, 1, 5], dtype=torch.int32))
    with pytest.raises(ValueError, match=r"slots\[0\] and slots\[1\] both name slot 2"):
        decode_step(B, C, V, 0.9, pool, torch.tensor([2, 2, 0]))
    # the PyTorch path checks whatever check_slots says (its indexing would wrap or drop)
    with pytest.raises(ValueError, match="both name slot 2"):
        decode_step(B, C, V, 0.9, pool, torch.tensor([2, 2, 0]), check_slots=False)
    assert torch.equal(pool, before)
    # one rule for the pool on every device: float32 and float64 are taken
    out = decode_step(B.double(), C.double(), V.double(), 0.9, pool.double(),
                      torch.tensor([2, 4, 0]))
    assert out.dtype == torch.float64 and torch.isfinite(out).all()


@pytest.mark.parametrize("slots, bad, poisoned", [([0, -1, 2], [1], []), ([0, 1, 5], [2], []),
                                                  ([2, 2, 0], [0, 1], [2])],
                         ids=["negative", "past-the-pool", "repeated"])
def test_decode_kernel_checks_slots_on_the_device(slots, bad, poisoned):
    """The graph path (no host check): a bad slot is never read or written, its sequences'
    outputs are NaN, a row two sequences named is poisoned, and the good sequences are exact."""
    B, C, V = make_inputs(3, 2, 1, 4, 4, device=DEVICE)
    pool = torch.randn(5, 2, 4, 4, device=DEVICE)
    guard = torch.randn(2, 5, 2, 4, 4, device=DEVICE)       # rows either side of the pool
    guard[0, :], guard[1, :] = pool, pool
    arena = torch.cat([guard[0], pool, guard[1]])             # pool = arena[5:10]
    view = arena[5:10]
    before = arena.clone()
    ids = torch.tensor(slots, dtype=torch.int32, device=DEVICE)
    out = _steps(True)(B, C, V, 0.9, view, ids) if DEVICE == "cpu" else \
        decode_step(B, C, V, 0.9, view, ids, check_slots=False)
    good = [i for i in range(3) if i not in bad]
    assert torch.isnan(out[bad]).all() and torch.isfinite(out[good]).all()
    want = decode_step(B[good], C[good], V[good], 0.9, before[5:10].clone(),
                       ids[good].cpu().to(DEVICE))
    assert torch.allclose(out[good], want, atol=1e-5)
    assert torch.equal(arena[:5], before[:5]) and torch.equal(arena[10:], before[10:])
    touched = {s for i, s in enumerate(slots) if i in good} | set(poisoned)
    for s in range(5):
        if s in poisoned:
            assert torch.isnan(view[s]).all()
        elif s not in touched:
            assert torch.equal(view[s], before[5 + s])


# ---- the flash-linear-attention drop-in ----------------------------------------------------

@pytest.mark.parametrize("packed", [False, True])
def test_chunk_simple_gla_is_the_operator_in_fla_conventions(packed):
    heads, K, Vd = 3, 8, 6
    gen = torch.Generator().manual_seed(11)
    lengths = [13, 0, 30] if packed else [25]
    n = sum(lengths)
    batch = 1 if packed else 2
    q, k = (torch.randn(batch, n, heads, K, generator=gen).to(DEVICE) for _ in range(2))
    v = torch.randn(batch, n, heads, Vd, generator=gen).to(DEVICE)
    g_gamma = torch.log(random_gammas(heads, 11)).float().to(DEVICE)
    h0 = torch.randn(len(lengths) if packed else batch, heads, K, Vd, generator=gen).to(DEVICE)
    cu = torch.tensor([0, 13, 13, 43], dtype=torch.int32, device=DEVICE) if packed else None
    o, ht = chunk_simple_gla(q, k, v, g_gamma=g_gamma, initial_state=h0, output_final_state=True,
                             cu_seqlens=cu)
    assert o.shape == v.shape and ht.shape == h0.shape
    # the same by hand: head-major, q scaled by K^-0.5, λ = exp(g_gamma)
    B, C, V = (x.transpose(1, 2) for x in (q * K ** -0.5, k, v))
    lam = torch.exp(g_gamma.double())
    if packed:
        want, want_s = _each(B, C, V, lam, cu, h0)
    else:
        want, want_s = reference(B, C, V, lam, initial_state=h0, output_final_state=True)
    assert rel_error(o.transpose(1, 2), want) <= _tol(torch.float32, "Chunk")
    assert rel_error(ht, want_s) <= _tol(torch.float32, "Chunk")
    o2, none = chunk_simple_gla(q, k, v, g_gamma=g_gamma, initial_state=h0, cu_seqlens=cu,
                                head_first=False)
    assert none is None and torch.allclose(o2, o)
    # per-token gates of 0 (no decay) and g_gamma as gates: the per-head decay again
    gates = g_gamma.view(1, 1, -1).expand(batch, n, heads)
    o3, _ = chunk_simple_gla(q, k, v, g=torch.zeros(batch, n, heads, device=DEVICE),
                             g_gamma=g_gamma, initial_state=h0, cu_seqlens=cu, head_first=False)
    o4, _ = chunk_simple_gla(q, k, v, g=gates, initial_state=h0, cu_seqlens=cu, head_first=False)
    assert rel_error(o3, o) <= _tol(torch.float32, "Chunk")
    assert rel_error(o4, o) <= _tol(torch.float32, "Chunk")


def test_chunk_simple_gla_takes_flash_linear_attentions_other_arguments(monkeypatch):
    """cu_seqlens_cpu (its values are checked instead of the device copy's), chunk_size (checked,
    not needed), state_v_first (states (N, heads, V, K)): each the same operator."""
    heads, K, Vd = 2, 8, 6
    gen = torch.Generator().manual_seed(12)
    q, k = (torch.randn(1, 20, heads, K, generator=gen).to(DEVICE) for _ in range(2))
    v = torch.randn(1, 20, heads, Vd, generator=gen).to(DEVICE)
    g_gamma = torch.log(random_gammas(heads, 12)).to(DEVICE)
    cu_cpu = torch.tensor([0, 7, 20], dtype=torch.int32)
    cu = cu_cpu.clone().to(DEVICE)   # another tensor on the CPU too
    h0 = torch.randn(2, heads, K, Vd, generator=gen).to(DEVICE)
    want, want_s = chunk_simple_gla(q, k, v, g_gamma=g_gamma, initial_state=h0,
                                    output_final_state=True, cu_seqlens=cu, method="Chunk")
    # Chunk (packed in one launch) never reads the device offsets back when their host copy is given
    real_tolist, read_back = torch.Tensor.tolist, []

    def tolist(t):
        read_back.append(t is cu)
        return real_tolist(t)
    monkeypatch.setattr(torch.Tensor, "tolist", tolist)
    got, got_s = chunk_simple_gla(q, k, v, g_gamma=g_gamma, initial_state=h0.transpose(-1, -2),
                                  output_final_state=True, cu_seqlens=cu, cu_seqlens_cpu=cu_cpu,
                                  chunk_size=32, state_v_first=True, method="Chunk")
    monkeypatch.undo()
    assert read_back and not any(read_back)
    assert torch.allclose(got, want, atol=1e-6)
    assert got_s.shape == (2, heads, Vd, K) and torch.allclose(got_s.transpose(-1, -2), want_s)
    with pytest.raises(ValueError, match="cu_seqlens must start at 0.*ending at 19"):
        chunk_simple_gla(q, k, v, cu_seqlens=cu, cu_seqlens_cpu=torch.tensor([0, 7, 19]))
    with pytest.raises(ValueError, match="cu_seqlens_cpu must be"):
        chunk_simple_gla(q, k, v, cu_seqlens=cu, cu_seqlens_cpu=torch.tensor([0, 20]))
    with pytest.raises(ValueError, match="chunk_size must be a positive integer"):
        chunk_simple_gla(q, k, v, chunk_size=0)
    with pytest.raises(ValueError, match=r"initial_state must be \(N, heads, V, K\)"):
        chunk_simple_gla(q, k, v, cu_seqlens=cu, initial_state=h0, state_v_first=True)


def test_chunk_simple_gla_errors_speak_fla_names_and_layouts():
    gen = torch.Generator().manual_seed(13)
    q, k, v = (torch.randn(2, 21, 3, 8, generator=gen) for _ in range(3))   # (batch, T, heads, K)
    g_gamma = torch.log(torch.full((3,), 0.9))
    with pytest.raises(ValueError, match=r"g_gamma has 3 entries.*21 heads.*look laid out as "
                                         r"head_first=False"):
        chunk_simple_gla(q, k, v, g_gamma=g_gamma, head_first=True)
    with pytest.raises(ValueError, match=r"look laid out as head_first=False"):
        chunk_simple_gla(q, k, v, initial_state=torch.zeros(2, 3, 8, 8), head_first=True)
    with pytest.raises(ValueError, match=r"g_gamma has 21 entries.*3 heads.*head_first=True"):
        chunk_simple_gla(q, k, v, g_gamma=torch.zeros(21))
    with pytest.raises(ValueError, match=r"q and k must have one shape \(batch, T, heads, K\)"):
        chunk_simple_gla(q, k[:, :5], v)
    with pytest.raises(TypeError, match="q, k and v must share one dtype"):
        chunk_simple_gla(q, k, v.double())
    with pytest.raises(TypeError, match="k must be floating point"):
        chunk_simple_gla(q, k.long(), v)
    # a decay passed without its log: said in g_gamma's terms, not gamma's
    with pytest.raises(ValueError, match=r"g_gamma is the log decay per head, each ≤ 0.*"
                                         r"\[0.9, 0.9, 0.9\].*pass torch.log"):
        chunk_simple_gla(q, k, v, g_gamma=torch.full((3,), 0.9))
    with pytest.raises(ValueError, match="g_gamma is the log decay"):
        chunk_simple_gla(q, k, v, g_gamma=[0.5, -0.1, -0.2])


@pytest.mark.skipif(DEVICE != "cuda", reason="flash-linear-attention runs on a GPU only")
def test_chunk_simple_gla_matches_flash_linear_attention():
    fla = pytest.importorskip("fla.ops.simple_gla", reason="fla-core is not installed")
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(1, 3000, 4, 64, device="cuda", generator=gen, dtype=torch.bfloat16)
               for _ in range(3))
    g_gamma = torch.log(torch.linspace(0.9, 0.999, 4, device="cuda"))
    cu = torch.tensor([0, 1000, 1001, 3000], dtype=torch.int32, device="cuda")
    ours, s1 = chunk_simple_gla(q, k, v, g_gamma=g_gamma, output_final_state=True, cu_seqlens=cu)
    theirs, s2 = fla.chunk_simple_gla(q, k, v, g_gamma=g_gamma, output_final_state=True,
                                      cu_seqlens=cu.long())
    assert rel_error(ours, theirs.double()) <= 1e-2 and rel_error(s1, s2.double()) <= 1e-2
