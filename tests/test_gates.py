"""Per-token gates (``g``: simple GLA's and Mamba-2's data-dependent decay) through every method
that takes them, forward and backward, against the float64 oracle; the methods that refuse them;
the numbers at the edges (hard resets, strong gates over long sequences); the drop-ins
(flash-linear-attention's ``chunk_simple_gla``/``fused_recurrent_simple_gla`` with ``g``), the
decode step and the custom op. The Chunk kernel runs under Triton's interpreter without a GPU;
sequence parallelism with gates is in test_distributed.py."""

import pytest
import torch

from leetrepro import (causal_linear_decoder, chunk_simple_gla, decode_step,
                       fused_recurrent_simple_gla, reference, rel_error)
from leetrepro.reference import GATE_GRAD_TOLERANCE
from leetrepro.registry import get, methods

from conftest import BF16, INTERPRETED, KERNEL_DEVICE, make_inputs, patch_chunk, patch_package, \
    quick_lane, random_gammas, real_codegen, tolerance

GATED = [m.abbr for m in methods() if m.gates]
OPTIONS = {"Bb": dict(block_size=16), "LA_torch": dict(block_size=16), "Recur": dict(base=8),
           "Chunk": dict(fp32_precision="ieee")}


def _device(abbr):
    return KERNEL_DEVICE if abbr == "Chunk" else "cpu"


def _gates(batch, heads, n, seed, strength=0.5, device="cpu"):
    """Log gates as models make them: logsigmoid of a random logit (in (−∞, 0))."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch, heads, n, generator=gen) / strength
    return torch.nn.functional.logsigmoid(logits).to(device)


def _tol(dtype, abbr):
    return tolerance(dtype, tf32=abbr == "Chunk" and not INTERPRETED and dtype == torch.float32
                     and OPTIONS.get(abbr, {}).get("fp32_precision") not in ("ieee", "tf32x3"))


def test_the_gated_methods_are_the_paper_s_that_extend():
    assert set(GATED) == {"Vanilla", "Bb", "Recur", "LA_torch", "Chunk"}


@pytest.mark.parametrize("abbr", GATED)
@pytest.mark.parametrize("decay", quick_lane([True, False]), ids=["gamma-too", "gates-alone"])
@pytest.mark.parametrize("dtype", quick_lane([torch.float32, torch.float16, BF16]))
def test_forward_against_the_oracle(abbr, decay, dtype):
    if dtype == torch.bfloat16 and abbr == "Chunk" and INTERPRETED:
        pytest.skip("bf16 dot kernels are refused under TRITON_INTERPRET=1")
    dev = _device(abbr)
    B, C, V = make_inputs(2, 3, 77, 8, 5, dtype=dtype, device=dev, seed=3)
    g = _gates(2, 3, 77, seed=4, device=dev)
    gam = random_gammas(3, 5).to(dev) if decay else None
    out = causal_linear_decoder(B, C, V, gam, g=g, method=abbr, **OPTIONS.get(abbr, {}))
    err = rel_error(out, reference(B, C, V, gam, g=g))
    assert err <= _tol(dtype, abbr), f"{abbr} {dtype}: {err:.2e}"


def test_time_major_gates_and_inputs_are_read_in_place():
    dev = KERNEL_DEVICE
    B, C, V = (t.transpose(1, 2).contiguous().transpose(1, 2)
               for t in make_inputs(2, 3, 70, 8, 8, device=dev, seed=9))
    g = _gates(2, 70, 3, seed=1, device=dev).transpose(1, 2)  # (batch, N, heads) viewed
    out = causal_linear_decoder(B, C, V, g=g, method="Chunk", fp32_precision="ieee")
    assert rel_error(out, reference(B, C, V, g=g)) <= 1e-5


@pytest.mark.parametrize("abbr", ["Chunk", "LA_torch"])
@pytest.mark.parametrize("packed", quick_lane([False, True]))
@pytest.mark.parametrize("wanted", quick_lane(["BCVgS", "g", "gS", "BV"]))
def test_gradients_against_the_oracle(abbr, packed, wanted):
    """Every input's gradient, the gates' and the initial state's included, with a final state
    in the loss, any subset asked for; packed sequences (an empty one among them) each from
    their own state."""
    dev = _device(abbr)
    heads, r, d = 3, 8, 5
    lengths = [30, 0, 47] if packed else [77]
    batch, n = (1, sum(lengths)) if packed else (2, 77)
    count = len(lengths) if packed else batch
    B, C, V = make_inputs(batch, heads, n, r, d, device=dev, seed=11)
    g = _gates(batch, heads, n, seed=12, device=dev)
    gam = random_gammas(heads, 13).to(dev)
    gen = torch.Generator().manual_seed(14)
    S0 = torch.randn(count, heads, r, d, generator=gen).to(dev)
    cu = torch.tensor([0, 30, 30, 77], dtype=torch.int32, device=dev) if packed else None
    names = "BCVgS"
    leaves = [t.detach().clone().requires_grad_(k in wanted)
              for k, t in zip(names, (B, C, V, g, S0))]
    out, s = causal_linear_decoder(*leaves[:3], gam, g=leaves[3], initial_state=leaves[4],
                                   output_final_state=True, cu_seqlens=cu, method=abbr,
                                   **OPTIONS.get(abbr, {}))
    ref = [t.detach().double().requires_grad_(k in wanted)
           for k, t in zip(names, (B, C, V, g, S0))]
    want_o, want_s = _oracle(ref, gam, cu)
    dO = torch.randn(want_o.shape, generator=gen, dtype=torch.float64).to(dev)
    dS = torch.randn(want_s.shape, generator=gen, dtype=torch.float64).to(dev)
    got = torch.autograd.grad((out.double() * dO).sum() + (s.double() * dS).sum(),
                              [t for t in leaves if t.requires_grad])
    want = torch.autograd.grad((want_o * dO).sum() + (want_s * dS).sum(),
                               [t for t in ref if t.requires_grad])
    assert rel_error(out, want_o) <= 1e-5 and rel_error(s, want_s) <= 1e-5
    for name, a, b in zip([k for k in names if k in wanted], got, want):
        err = rel_error(a, b)
        tol = GATE_GRAD_TOLERANCE[torch.float32] if name == "g" else 1e-5
        assert err <= tol, f"d{name}: {err:.2e}"


def _oracle(x, gam, cu):
    """The oracle's O and final states (each packed sequence on its own)."""
    B, C, V, g, S0 = x
    return reference(B, C, V, gam, g=g, initial_state=S0, output_final_state=True,
                     cu_seqlens=cu)


@pytest.mark.parametrize("abbr", ["Chunk", "LA_torch", "Bb"])
def test_a_hard_reset_cuts_the_sequence_exactly(abbr):
    """A gate of −1e4 (a document boundary) makes every weight across it exactly 0: the rows
    after it equal a fresh start, with no NaN anywhere."""
    dev = _device(abbr)
    B, C, V = make_inputs(1, 2, 100, 8, 8, device=dev, seed=21)
    g = _gates(1, 2, 100, seed=22, device=dev)
    g[..., 40] = -1e4
    out = causal_linear_decoder(B, C, V, g=g, method=abbr, **OPTIONS.get(abbr, {}))
    assert torch.isfinite(out).all()
    after = causal_linear_decoder(B[:, :, 40:], C[:, :, 40:], V[:, :, 40:], g=g[..., 40:],
                                  method=abbr, **OPTIONS.get(abbr, {}))
    assert rel_error(out[:, :, 40:], after) <= 1e-5
    before = causal_linear_decoder(B[:, :, :40], C[:, :, :40], V[:, :, :40], g=g[..., :40],
                                   method=abbr, **OPTIONS.get(abbr, {}))
    assert rel_error(out[:, :, :40], before) <= 1e-5


def test_the_oracle_takes_a_minus_inf_gate_as_the_methods_do():
    """A gate of −inf (log 0: a hard reset written the natural way): the oracle's rows, gradients
    and final state are finite and equal those of −1e4 (whose weights across are exactly 0), with
    an initial state, in two lanes of which one resets twice; the methods agree."""
    B, C, V = make_inputs(2, 2, 12, 4, 5, seed=23)
    g = _gates(2, 2, 12, seed=24)
    s0 = torch.randn(2, 2, 4, 5, generator=torch.Generator().manual_seed(25))
    hard, soft = g.clone(), g.clone()
    for t, lanes in ((3, (0, 0)), (9, (0, 0)), (5, (1, 1))):
        hard[lanes + (t,)], soft[lanes + (t,)] = -torch.inf, -1e4
    want_o, want_s = reference(B, C, V, g=soft, initial_state=s0, output_final_state=True)
    x = [t.double().requires_grad_() for t in (B, C, V)]
    got_o, got_s = reference(*x, g=hard, initial_state=s0, output_final_state=True)
    assert torch.isfinite(got_o).all() and torch.isfinite(got_s).all()
    torch.testing.assert_close(got_o, want_o, rtol=0, atol=1e-12)
    torch.testing.assert_close(got_s, want_s, rtol=0, atol=1e-12)
    (got_o.sum() + got_s.sum()).backward()
    assert all(torch.isfinite(t.grad).all() for t in x)
    o, s = causal_linear_decoder(B, C, V, g=hard, method="LA_torch", initial_state=s0,
                                 output_final_state=True, **OPTIONS["LA_torch"])
    assert rel_error(o, got_o) <= 1e-5 and rel_error(s, got_s) <= 1e-5
    for abbr in ("Bb", "Vanilla", "Recur"):  # (no state in or out)
        o = causal_linear_decoder(B, C, V, g=hard, method=abbr, **OPTIONS.get(abbr, {}))
        assert rel_error(o, reference(B, C, V, g=hard)) <= 1e-5, abbr


@pytest.mark.parametrize("abbr", quick_lane(["Chunk", "Bb"], keep=(1,)))
def test_strong_gates_over_a_long_sequence_stay_finite_and_exact(abbr):
    """Gates of about −3 a token sum to −3N: exp(+G) would overflow after 30 tokens. Chunked
    running sums keep every exponent a short difference."""
    dev = _device(abbr)
    n = 4096 if INTERPRETED and abbr == "Chunk" else 65536
    B, C, V = make_inputs(1, 1, n, 4, 4, device=dev, seed=31)
    g = -3.0 + _gates(1, 1, n, seed=32, device=dev)
    opts = dict(block_size=256) if abbr == "Bb" else OPTIONS.get(abbr, {})
    out = causal_linear_decoder(B, C, V, g=g, method=abbr, **opts)
    assert torch.isfinite(out).all()
    # the oracle on the last 300 rows, compared past their first 20 (which the rows before
    # reach, by e^-3 a row: nothing after 20)
    tail = slice(n - 300, n)
    want = reference(B[:, :, tail], C[:, :, tail], V[:, :, tail], g=g[..., tail])
    assert rel_error(out[:, :, n - 280:], want[:, :, 20:]) <= 1e-5


@pytest.mark.parametrize("abbr,why", [("Cdotp", "prefix sum"), ("FA", "overflows float32"),
                                      ("LA", "Chunk is its kernel with gates")])
def test_methods_without_gates_say_why(abbr, why):
    """The refusal names the method, the rule it does not take (``Method.decays``) and why."""
    B, C, V = make_inputs(1, 2, 8, 4, 4)
    rule = r"per-token gates g \(the per_token decay rule\)"
    with pytest.raises(ValueError, match=f"{abbr}\\) does not take {rule}.*{why}"):
        causal_linear_decoder(B, C, V, g=torch.zeros(1, 2, 8), method=abbr)
    assert "per_token" not in get(abbr).decays


def test_a_method_declares_its_decay_rules():
    """``register(..., decays=...)`` (``gates=True`` short for both rules) sets ``Method.decays``;
    an unknown rule, or one without the per-head γ every method takes, is refused by name."""
    from leetrepro import registry
    fn = lambda B, C, V, gamma, g=None: B  # noqa: E731
    try:
        registry.register("rules-a", decays=("per_head", "per_token"))(fn)
        registry.register("rules-b", gates=True)(fn)
        registry.register("rules-c")(fn)
        assert registry.get("rules-a").decays == registry.get("rules-b").decays == \
            frozenset({"per_head", "per_token"})
        assert registry.get("rules-a").gates and not registry.get("rules-c").gates
        assert registry.get("rules-c").decays == frozenset({"per_head"})
    finally:
        for name in ("rules-a", "rules-b", "rules-c"):
            registry.unregister(name)
    with pytest.raises(ValueError, match="decays must name rules.*trapezoid"):
        registry.register("rules-d", decays=("per_head", "trapezoid"))
    with pytest.raises(ValueError, match="per_head among them"):
        registry.register("rules-e", decays=("per_token",))


def test_bad_gates_are_errors_that_name_g():
    B, C, V = make_inputs(2, 3, 10, 4, 4)
    with pytest.raises(ValueError, match=r"g \(the per-token log gates\).*time-major"):
        causal_linear_decoder(B, C, V, g=torch.zeros(2, 10, 3), method="LA_torch")
    with pytest.raises(TypeError, match="floating point"):
        causal_linear_decoder(B, C, V, g=torch.zeros(2, 3, 10, dtype=torch.int32))
    with pytest.raises(TypeError, match="torch.Tensor"):
        causal_linear_decoder(B, C, V, g=0.5)
    # a positive gate (a decay passed without its log, say) is refused where reading it is free
    with pytest.raises(ValueError, match=r"g \(the per-token log gates\) must be ≤ 0.*largest is 3"):
        causal_linear_decoder(B, C, V, g=torch.full((2, 3, 10), 3.0), method="LA_torch")


def test_auto_picks_a_method_that_takes_gates():
    B, C, V = make_inputs(1, 2, 300, 4, 4)
    g = _gates(1, 2, 300, seed=1)
    out = causal_linear_decoder(B, C, V, g=g)  # (on the CPU: a PyTorch method)
    assert rel_error(out, reference(B, C, V, g=g)) <= 1e-5


# ---- the drop-ins ---------------------------------------------------------------------------

#: flash-linear-attention's own simple_gla test cases, scaled to the interpreter: (B, T, H, D,
#: gate_logit_normalizer), T ∈ {1, 15, 63, 300} and D not a power of two, the gates
#: logsigmoid(randn) / normalizer; packed offsets as its varlen tests pack them
FLA_CASES = [(2, 1, 2, 16, 1.0), (2, 15, 2, 20, 0.1), (2, 63, 3, 16, 1.0), (1, 300, 2, 32, 10.0)]
FLA_PACKED = [0, 15, 100, 300]


@pytest.mark.parametrize("case", quick_lane(FLA_CASES, keep=(2,)))
@pytest.mark.parametrize("head_first", [False, True])
def test_chunk_simple_gla_with_gates_is_the_operator(case, head_first):
    batch, T, H, D, norm = case
    dev = KERNEL_DEVICE
    gen = torch.Generator().manual_seed(T + D)
    q, k, v = (torch.randn(batch, T, H, D, generator=gen).to(dev) for _ in range(3))
    g = torch.nn.functional.logsigmoid(torch.randn(batch, T, H, generator=gen)).to(dev) / norm
    h0 = torch.randn(batch, H, D, D, generator=gen).to(dev)
    args = (q, k, v, g) if not head_first else tuple(x.transpose(1, 2) for x in (q, k, v, g))
    o, ht = chunk_simple_gla(*args, initial_state=h0, output_final_state=True,
                             head_first=head_first, scale=0.37, fp32_precision="ieee")
    B, C, V = (x.transpose(1, 2).double() for x in (q * 0.37, k, v))
    want, want_s = reference(B, C, V, g=g.transpose(1, 2), initial_state=h0,
                             output_final_state=True)
    o = o if head_first else o.transpose(1, 2)
    assert rel_error(o, want) <= 1e-5 and rel_error(ht, want_s) <= 1e-5


def test_chunk_simple_gla_with_gates_packed():
    dev = KERNEL_DEVICE
    H, D = 2, 16
    T = FLA_PACKED[-1]
    gen = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, T, H, D, generator=gen).to(dev).requires_grad_() for _ in range(3))
    g = torch.nn.functional.logsigmoid(torch.randn(1, T, H, generator=gen)).to(dev)
    g.requires_grad_()
    h0 = torch.randn(len(FLA_PACKED) - 1, H, D, D, generator=gen).to(dev).requires_grad_()
    cu = torch.tensor(FLA_PACKED, dtype=torch.int32, device=dev)
    o, ht = chunk_simple_gla(q, k, v, g=g, initial_state=h0, output_final_state=True,
                             cu_seqlens=cu, fp32_precision="ieee")
    x = [t.detach().double().requires_grad_() for t in (q, k, v, g, h0)]
    B, C, V = (t.transpose(1, 2) for t in (x[0] * D ** -0.5, x[1], x[2]))
    want, want_s = _oracle([B, C, V, x[3].transpose(1, 2), x[4]], None, cu)
    assert rel_error(o.transpose(1, 2), want) <= 1e-5 and rel_error(ht, want_s) <= 1e-5
    gen = torch.Generator().manual_seed(6)
    dO = torch.randn(want.shape, generator=gen, dtype=torch.float64).to(dev)
    dS = torch.randn(want_s.shape, generator=gen, dtype=torch.float64).to(dev)
    got = torch.autograd.grad((o.transpose(1, 2).double() * dO).sum() + (ht.double() * dS).sum(),
                              (q, k, v, g, h0))
    ref = torch.autograd.grad((want * dO).sum() + (want_s * dS).sum(), x)
    for name, a, b in zip(("dq", "dk", "dv", "dg", "dh0"), got, ref):
        tol = GATE_GRAD_TOLERANCE[torch.float32] if name == "dg" else 1e-5
        assert rel_error(a, b) <= tol, name


def test_fused_recurrent_simple_gla_forward_and_reverse():
    dev = KERNEL_DEVICE
    gen = torch.Generator().manual_seed(8)
    q, k, v = (torch.randn(2, 40, 2, 8, generator=gen).to(dev) for _ in range(3))
    g = torch.nn.functional.logsigmoid(torch.randn(2, 40, 2, generator=gen)).to(dev)
    o, _ = fused_recurrent_simple_gla(q, k, v, g=g, scale=1.0, fp32_precision="ieee")
    want = reference(*(x.transpose(1, 2) for x in (q, k, v)), g=g.transpose(1, 2))
    assert rel_error(o.transpose(1, 2), want) <= 1e-5
    # reverse: h_t = e^(g_t) h_(t+1) + k_tᵀ v_t, o_t = q_t h_t, step by step in float64
    o_rev, _ = fused_recurrent_simple_gla(q, k, v, g=g, scale=1.0, reverse=True,
                                          fp32_precision="ieee")
    h = torch.zeros(2, 2, 8, 8, dtype=torch.float64, device=dev)
    rows = []
    for t in range(39, -1, -1):
        h = h * torch.exp(g[:, t].double())[..., None, None] + \
            k[:, t].double()[..., :, None] * v[:, t].double()[..., None, :]
        rows.append((q[:, t].double()[..., None, :] @ h).squeeze(-2))
    want_rev = torch.stack(rows[::-1], 1)
    assert rel_error(o_rev, want_rev) <= 1e-5


def test_decode_steps_with_gates_continue_a_gated_prefill():
    """A prefill's final state then k decode steps, each token with its gate, equal the whole
    sequence in one call."""
    dev = KERNEL_DEVICE
    B, C, V = make_inputs(2, 3, 40, 8, 6, device=dev, seed=41)
    g = _gates(2, 3, 40, seed=42, device=dev)
    # (Chunk on a GPU at fp32-exact products: its tf32 default was 1.3e-3 off on the H100)
    full = causal_linear_decoder(B, C, V, 0.95, g=g, **(dict(method="LA_torch") if dev == "cpu" else
                                                      dict(method="Chunk", fp32_precision="ieee")))
    _, s = causal_linear_decoder(B[:, :, :33], C[:, :, :33], V[:, :, :33], 0.95, g=g[..., :33],
                                 output_final_state=True, method="LA_torch")
    pool = torch.zeros(5, 3, 8, 6, device=dev)
    slots = torch.tensor([4, 1], device=dev)
    pool[slots] = s.float()
    outs = [decode_step(B[:, :, t:t + 1], C[:, :, t:t + 1], V[:, :, t:t + 1], 0.95, pool, slots,
                        g=g[..., t:t + 1]) for t in range(33, 40)]
    assert rel_error(torch.cat(outs, 2), full[:, :, 33:]) <= 1e-5


@pytest.mark.slow  # seconds: the op's schema, fake tensor and autograd checks
def test_opcheck_with_gates():
    from leetrepro.ops import causal_linear
    B, C, V = make_inputs(2, 3, 21, 4, 5, seed=7)
    gam = torch.tensor([0.9, 0.8, 1.0], dtype=torch.float64)
    g = _gates(2, 3, 21, seed=8)
    S0 = torch.randn(2, 3, 4, 5)
    # (Chunk on its kernels' device: the GPU, or the CPU under the interpreter)
    tm = [t.transpose(1, 2).contiguous().transpose(1, 2).to(KERNEL_DEVICE)
          for t in (B, C, V, g.unsqueeze(-1))]
    cases = [(B, C, V, None, None, "LA_torch", "", False, False, None, 1.0, True, g),
             (B, C, V, gam, S0, "LA_torch", "", False, True, None, 0.5, True, g),
             (*tm[:3], gam.to(KERNEL_DEVICE), S0.to(KERNEL_DEVICE), "Chunk",
              '{"fp32_precision": "ieee"}', False, True, None, 1.0, True, tm[3].squeeze(-1))]
    for args in cases:
        args = tuple(a.clone().requires_grad_() if isinstance(a, torch.Tensor)
                     and a.dtype != torch.float64 else a for a in args)
        torch.library.opcheck(causal_linear, args)


@pytest.mark.slow
def test_torch_compile_fullgraph_with_gates():
    """A layer with data-dependent gates (a projection to one gate per head, logsigmoid), compiled
    whole, forward and backward equal to eager."""
    torch.manual_seed(0)

    class Gated(torch.nn.Module):
        def __init__(self, heads=2, dim=16):
            super().__init__()
            self.qkv = torch.nn.Linear(dim, 3 * dim)
            self.gate = torch.nn.Linear(dim, heads)
            self.heads = heads

        def forward(self, x):
            b, n, dim = x.shape
            q, k, v = self.qkv(x).view(b, n, 3, self.heads, dim // self.heads).permute(2, 0, 3, 1, 4)
            g = torch.nn.functional.logsigmoid(self.gate(x)).transpose(1, 2)
            o = causal_linear_decoder(q, k, v, g=g, method="LA_torch", block_size=8)
            return o.transpose(1, 2).reshape(b, n, dim)

    layer = Gated()
    x = torch.randn(2, 40, 16)
    eager = layer(x)
    eager.square().sum().backward()
    want = [p.grad.clone() for p in layer.parameters()]
    layer.zero_grad()
    out = torch.compile(layer, fullgraph=True)(x)
    out.square().sum().backward()
    torch.testing.assert_close(out, eager, rtol=1e-4, atol=1e-4)
    for p, w in zip(layer.parameters(), want):
        torch.testing.assert_close(p.grad, w, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("n", [150, 1100])
@pytest.mark.parametrize("interpreted", [True, False])
def test_the_hopper_kernel_s_gates_are_running_sums_within_tiles(monkeypatch, n, interpreted):
    """The Hopper kernel reads each lane's gates as running sums within each 64-row tile, in the
    order it sweeps the rows: from a tile's first row forward, from its last in reverse (time
    runs backwards there), the rows past N adding nothing, in base 2 (times log2 e), and
    ``running_tile_sums`` the same in the rows' own units. One kernel launch under Triton's
    interpreter (as on a GPU; several of its programs a lane at N = 1100), PyTorch without it."""
    from leetrepro.methods.chunk import tile_gate_sums
    from leetrepro.methods.chunk.hopper_launch import LOG2E, running_tile_sums
    if not interpreted:
        monkeypatch.setenv("TRITON_INTERPRET", "0")
    elif not INTERPRETED:
        pytest.skip("the CPU's interpreted launch")
    g = _gates(2, 3, n, seed=5).transpose(1, 2).contiguous().transpose(1, 2)  # (any strides)
    whole = -(-n // 64) * 64
    fwd, rev = tile_gate_sums(g, 64, False), tile_gate_sums(g, 64, True)
    own = running_tile_sums(g, 64, False)
    assert fwd.shape == rev.shape == own.shape == (2, 3, whole) and fwd.is_contiguous()
    assert fwd.dtype == rev.dtype == own.dtype == torch.float32
    for t in range(whole // 64):
        rows = slice(64 * t, min(64 * t + 64, n))
        want = g[..., rows].cumsum(-1)
        torch.testing.assert_close(own[..., rows], want)
        torch.testing.assert_close(fwd[..., rows], want * LOG2E)
        torch.testing.assert_close(rev[..., rows],
                                   g[..., rows].flip(-1).cumsum(-1).flip(-1) * LOG2E)
    assert (fwd[..., n:] == fwd[..., n - 1:n]).all() and (rev[..., n:] == 0).all()


def test_time_major_gates_are_summed_a_block_of_heads_a_program_with_the_same_bits(
        monkeypatch):
    """Time-major gates (heads innermost) take up to ``tables.GATE_SUMS_HEADS`` heads a program
    of the tile sums' launch, its loads along the heads; contiguous rows one head a program.
    Both give the same bits, folded and summed alone, with heads past a whole block (20 heads,
    blocks of 16) and N past a whole tile."""
    from leetrepro.methods.chunk import hopper_launch, tables
    if not INTERPRETED:
        pytest.skip("the CPU's interpreted launch")
    monkeypatch.setattr(tables, "GATE_FOLD_FUSED", True)
    g = _gates(2, 20, 150, seed=3)
    g[1, 17, 80] = -1e4
    tm = g.transpose(1, 2).contiguous().transpose(1, 2)
    assert hopper_launch.sums_blocks(g) == (1, tables.GATE_ROWS_TILES)
    assert hopper_launch.sums_blocks(tm)[0] == 16
    for rev in (False, True):
        assert torch.equal(hopper_launch.tile_gate_sums(tm, 64, rev),
                           hopper_launch.tile_gate_sums(g, 64, rev))
    folded = [hopper_launch.folded_gate_sums(x, twin=True) for x in (tm, g)]
    for got, want in zip(*folded):
        assert torch.equal(got, want)
    sums = [[hopper_launch.tile_gate_sums(x, 64, r) for x, r in zip(f, (False, True))]
            for f in folded]
    for got, want in zip(*sums):
        assert torch.equal(got, want)


@pytest.mark.parametrize("interpreted", [True, False])
def test_a_backward_s_sweeps_share_one_launch_of_the_gates_tile_sums(monkeypatch, interpreted):
    """Inside ``shared_tile_sums`` (a gated backward's sweeps) the forward gates' and the
    shifted reverse gates' tile sums are made by one launch, the first time a sweep asks, and
    every later sweep reads the same tensors; they equal the sums made one by one bit for bit.
    Other gates, the other direction, or the scope's end: made anew. With the switch off, one
    launch a sweep again."""
    from leetrepro.decay.per_token import shift_gates
    from leetrepro.methods.chunk import hopper_launch, tables
    if not interpreted:
        monkeypatch.setenv("TRITON_INTERPRET", "0")
    elif not INTERPRETED:
        pytest.skip("the CPU's interpreted launch")
    launched = []
    real = hopper_launch.launch
    monkeypatch.setattr(hopper_launch, "launch",
                        lambda kernel, grid, args, **kw: (launched.append(grid),
                                                          real(kernel, grid, args, **kw))[1])
    g = _gates(2, 3, 150, seed=7).transpose(1, 2).contiguous().transpose(1, 2)
    rev = shift_gates(g)
    alone = [hopper_launch.tile_gate_sums(x, 64, r) for x, r in ((g, False), (rev, True))]
    launched.clear()
    with hopper_launch.shared_tile_sums(g, rev):
        first = hopper_launch.tile_gate_sums(rev, 64, True)
        again = [hopper_launch.tile_gate_sums(rev, 64, True), hopper_launch.tile_gate_sums(g, 64, False)]
        assert again[0] is first
        assert len(launched) == (1 if interpreted else 0)
        assert torch.equal(first, alone[1]) and torch.equal(again[1], alone[0])
        other = hopper_launch.tile_gate_sums(g, 64, True)  # (not named: made alone)
        assert other is not again[1] and not torch.equal(other, again[1])
    assert hopper_launch.tile_gate_sums(rev, 64, True) is not first
    monkeypatch.setattr(tables, "GATE_SUMS_SHARED", False)
    launched.clear()
    with hopper_launch.shared_tile_sums(g, rev):
        assert hopper_launch.tile_gate_sums(rev, 64, True) is not hopper_launch.tile_gate_sums(rev, 64, True)
    assert len(launched) == (2 if interpreted else 0)


def test_gated_calls_choose_their_kernel_as_the_decay_does(monkeypatch):
    """Where the Hopper kernel can take a gated call (fp16/bf16), the measured table's decay rows
    decide for it: its per-chunk work is the decay's, not the 0-1 mask's."""
    from leetrepro.methods import chunk
    B, C, V = make_inputs(1, 2, 64, 128, 128)
    asked = []
    patch_chunk(monkeypatch, "hopper_unfit", lambda *a, **k: None)
    patch_chunk(monkeypatch, "hopper_wins", lambda device, dtype, decay, *a: asked.append(decay) or True)
    assert chunk.plans._use_hopper("auto", B, C, V, None, False, gates=True)
    assert chunk.plans._use_hopper("auto", B, C, V, None, False, gates=False)
    assert asked == [True, False]


@pytest.mark.slow  # (seconds a case: the full lane runs it)
@pytest.mark.parametrize("abbr", ["Chunk", "LA_torch"])
def test_half_precision_gradients_keep_gamma_and_the_final_state(abbr):
    """In fp16 the backward asked for dg runs on fp32 copies at fp32-exact dots (the gates as
    folded, γ in them) and takes the final state again: every gradient within the contract, dg
    far inside its bound, with γ and a final state in the loss."""
    dev = _device(abbr)
    B, C, V = make_inputs(2, 3, 150, 8, 5, dtype=torch.float16, device=dev, seed=51)
    g = _gates(2, 3, 150, seed=52, device=dev)
    gam = random_gammas(3, 53).to(dev)
    leaves = [t.detach().clone().requires_grad_() for t in (B, C, V, g)]
    out, s = causal_linear_decoder(*leaves[:3], gam, g=leaves[3], output_final_state=True,
                                   method=abbr)
    wide = [t.detach().double().requires_grad_() for t in leaves]
    want_o, want_s = reference(*wide[:3], gam, g=wide[3], output_final_state=True)
    gen = torch.Generator().manual_seed(54)
    dO, dS = (torch.randn(x.shape, generator=gen, dtype=torch.float64).to(dev)
              for x in (want_o, want_s))
    got = torch.autograd.grad((out.double() * dO).sum() + (s.double() * dS).sum(), leaves)
    want = torch.autograd.grad((want_o * dO).sum() + (want_s * dS).sum(), wide)
    for name, a, b in zip("BCVg", got, want):
        assert rel_error(a, b) <= (2e-3 if name == "g" else 1e-2), f"d{name}: {rel_error(a, b):.2e}"


@pytest.mark.slow  # (seconds a case: the full lane runs it)
@pytest.mark.parametrize("case", [
    dict(),
    dict(groups=1, scale=0.3, n=100),  # (one segment: the first case crosses segments)
    dict(packed=True),
    dict(r=40, d=130, n=100, states=False),
    dict(dtype=torch.float16, gamma=False, n=100),
    dict(r=40, max_r=16, n=100),
])
def test_the_straddle_kernel_is_the_gates_gradient(case, monkeypatch):
    """The gates' gradient summed over the pairs of rows straddling each row
    (``kernels/gate_straddle.py``) against the float64 oracle's: groups read in place, packed
    sequences (an empty one among them) each with its own states, the initial state and dS_N,
    scale, r ≠ d with the value columns over two lanes (d > 64), r in pieces (r above the
    kernel's bound: Mamba-2's d_state 256), N across 256-row segments and not a multiple of the
    blocks, fp16."""
    from leetrepro.decay.per_token import fold_gates
    from leetrepro.methods import chunk
    from leetrepro.methods.chunk import gate_gradient
    if "max_r" in case:
        monkeypatch.setattr(chunk.tables, "STRADDLE_MAX_R", case["max_r"])

    dtype, n, r, d = case.get("dtype", torch.float32), case.get("n", 300), case.get("r", 16), \
        case.get("d", 24)
    heads, groups = 4, case.get("groups", 2)
    packed, states, scale = case.get("packed", False), case.get("states", True), \
        case.get("scale", 1.0)
    batch = 1 if packed else 2
    cu = torch.tensor([0, 30, 30, 290, n], dtype=torch.int32) if packed else None
    gen = torch.Generator().manual_seed(71)
    B, C = (torch.randn(batch, groups, n, r, generator=gen) for _ in range(2))
    V = torch.randn(batch, heads, n, d, generator=gen)
    g = _gates(batch, heads, n, seed=72)
    gam = random_gammas(heads, 73) if case.get("gamma", True) else None
    count = batch if cu is None else cu.numel() - 1
    S0 = torch.randn(count, heads, r, d, generator=gen) if states else None
    B, C, V = (t.to(dtype) for t in (B, C, V))
    gw = g.double().requires_grad_()
    o, sn = reference(*(t.double() for t in (B, C, V)), gam, g=gw,
                      initial_state=None if S0 is None else S0.double(), output_final_state=True,
                      cu_seqlens=cu)
    dO = torch.randn(o.shape, generator=gen, dtype=torch.float64)
    dS = torch.randn(sn.shape, generator=gen, dtype=torch.float64) if states else None
    loss = (o * dO).sum() * scale + ((sn * dS).sum() if states else 0.0)
    want, = torch.autograd.grad(loss, gw)
    gate = fold_gates(g, gam, torch.float32)
    dev = KERNEL_DEVICE
    got = gate_gradient(*(t.to(dev) for t in (B, C, V)), dO.to(dtype).to(dev), gate.to(dev),
                        initial_state=None if S0 is None else S0.to(dev),
                        dS=None if dS is None else dS.float().to(dev),
                        cu_seqlens=None if cu is None else cu.to(dev), scale=scale)
    assert got.dtype == torch.float32 and got.shape == g.shape
    assert torch.isfinite(got).all()
    assert rel_error(got.cpu(), want) <= (1e-5 if dtype == torch.float32 else 2e-3)


@pytest.mark.slow  # (the interpreter: seconds a case)
@pytest.mark.parametrize("case", [dict(), dict(packed=True), dict(d=80, r=40, angles=7),
                                  dict(max_r=16, r=40, angles=5)],
                         ids=["states", "packed", "column-blocks", "r-pieces"])
def test_the_straddle_kernel_sums_the_turned_pairs(monkeypatch, case):
    """``gate_gradient(angles=A)`` (Mamba-3's angles): beside dg, each row's sums of the
    gradient to an angle that turns pair a of every later row's b and c, against float64
    autograd through such a turn (the suffix sums of its gradient), with states in and out (the
    final state turned by none: ``final_state`` given), packed sequences with an empty one,
    value columns in two blocks, r in pieces (the turned dims in the first)."""
    from leetrepro.decay.trapezoid import rotate_pairs
    from leetrepro.methods import chunk
    if "max_r" in case:
        monkeypatch.setattr(chunk.tables, "STRADDLE_MAX_R", case["max_r"])
    # (the two widest cases over 200 rows: two 128-row segments, the second partial)
    n = 300 if "max_r" not in case and "d" not in case else 200
    r, d, a, heads = case.get("r", 16), case.get("d", 24), case.get("angles", 4), 3
    packed = case.get("packed", False)
    batch = 1 if packed else 2
    cu = torch.tensor([0, 0, 30, 30, 290, n], dtype=torch.int32) if packed else None
    gen = torch.Generator().manual_seed(3)
    B, C = (torch.randn(batch, heads, n, r, generator=gen) / r ** 0.25 for _ in range(2))
    V, dO = (torch.randn(batch, heads, n, d, generator=gen) for _ in range(2))
    g = _gates(batch, heads, n, seed=4, strength=0.5)
    count = batch if cu is None else cu.numel() - 1
    S0, dS = (torch.randn(count, heads, r, d, generator=gen) for _ in range(2))
    turn = torch.zeros(batch, heads, n, a, dtype=torch.float64, requires_grad=True)
    gw = g.double().requires_grad_()
    o, sn = reference(rotate_pairs(B.double(), turn), rotate_pairs(C.double(), turn), V.double(),
                      None, g=gw, initial_state=S0.double(), output_final_state=True,
                      cu_seqlens=cu)
    dturn, dg_want = torch.autograd.grad((o * dO).sum() + (sn * dS).sum(), (turn, gw))
    want = torch.zeros_like(dturn)
    bounds = [0, n] if cu is None else cu.tolist()
    for s0, s1 in zip(bounds[:-1], bounds[1:]):
        want[:, :, s0:s1] = dturn[:, :, s0:s1].flip(2).cumsum(2).flip(2)
    dg, sums = chunk.gate_gradient(B, C, V, dO, g, initial_state=S0, dS=dS,
                                   final_state=sn.float(), cu_seqlens=cu, angles=a)
    assert sums.shape == want.shape and sums.dtype == torch.float32
    assert rel_error(dg.double(), dg_want) <= 1e-5
    assert torch.isfinite(sums).all() and rel_error(sums.double(), want) <= 1e-5
    with pytest.raises(ValueError, match="final_state"):
        chunk.gate_gradient(B, C, V, dO, g, initial_state=S0, dS=dS, cu_seqlens=cu, angles=a)


#: the sweeps' dg cases: (label, call's keyword changes, which inputs want gradients)
PIECE_CASES = [
    ("all", {}, "BCVg"),
    ("states", dict(states=True), "BCVg"),
    ("packed", dict(packed=True, states=True), "BCVg"),
    ("groups", dict(groups=True), "BCVg"),
    ("segments", dict(options=dict(segment=16), states=True), "BCVg"),
    ("column-blocks", dict(d=40, options=dict(config={"BLOCK_D": 16})), "BVg"),  # (no dual)
    ("capped-columns", dict(piece_cols=4, states=True), "BVg"),  # (chunk.tables.PIECE_COLS; no dual)
    ("dC-sweep", {}, "Cg"),
    ("dB-only", {}, "Bg"),
    ("hard-reset", dict(reset=True, states=True), "BCVg"),
    ("segments-reset", dict(options=dict(segment=32), reset=True), "BCVg"),
]


# (all in the full lane: fp32's default is the straddle kernel; the quick lane keeps the pieces
# in fp16, test_the_gates_gradient_never_reads_the_forwards_final_state)
@pytest.mark.parametrize("label, change, want", quick_lane(PIECE_CASES, keep=(), unpack=True),
                         ids=[c[0] for c in PIECE_CASES])
def test_the_gates_gradient_from_the_sweeps_pieces(monkeypatch, label, change, want):
    """Chunk's gated backward in fp32 with exact products, asked for the pieces
    (``gate_grad="sweeps"``; fp32's default is the straddle kernel), takes dg from the pieces its
    sweeps hold (never the straddle kernel), within GATE_GRAD_TOLERANCE of float64 with states, packed
    sequences, groups, segments, lanes of value-column blocks (the caller's, or each sweep's
    own past ``chunk.tables.PIECE_COLS``), a hard reset, any subset of gradients; the same inputs give
    the same bits."""
    from leetrepro.methods import chunk
    patch_chunk(monkeypatch, "gate_gradient", lambda *a, **k: pytest.fail("straddle kernel"))
    if change.get("piece_cols"):  # (both sweeps in lanes of value-column blocks of their own)
        monkeypatch.setattr(chunk.tables, "PIECE_COLS", change["piece_cols"])
    dtype = torch.float32
    n, heads, batch, cu, d = 70, 4, 2, None, change.get("d", 12)
    if change.get("packed"):  # (lengths 0, 9, 40, 21, 70: shorter and longer than a chunk)
        n, batch, cu = 140, 1, torch.tensor([0, 0, 9, 49, 70, 140])
    B, C, V = make_inputs(batch, heads, n, 8, d, seed=91)
    if change.get("groups"):
        B, C = B[:, :2], C[:, 1:3]
    g = _gates(batch, heads, n, seed=92)
    if change.get("reset"):
        g[:, :, 37] = -1e4
    seqs = B.shape[0] if cu is None else cu.numel() - 1
    gen = torch.Generator().manual_seed(93)
    S0 = torch.randn(seqs, heads, 8, d, generator=gen) if change.get("states") else None
    dO = torch.randn(*V.shape, generator=gen, dtype=torch.float64)
    dS = torch.randn(seqs, heads, 8, d, generator=gen, dtype=torch.float64) \
        if change.get("states") else None

    def grads(inputs, method, **options):
        xs = [x.clone().requires_grad_(name in want) for x, name in zip(inputs[:4], "BCVg")]
        out = causal_linear_decoder(*xs[:3], g=xs[3], method=method,
                                    cu_seqlens=None if cu is None else cu.to(xs[0].device),
                                    initial_state=None if S0 is None else inputs[4],
                                    output_final_state=S0 is not None, **options)
        o, sn = out if S0 is not None else (out, None)
        loss = (o.double() * dO.to(o.device)).sum() + \
            (0.0 if sn is None else (sn.double() * dS.to(sn.device)).sum())
        return torch.autograd.grad(loss, [x for x in xs if x.requires_grad])

    ref = grads([t.double() for t in (B, C, V, g)] + [None if S0 is None else S0.double()],
                "LA_torch")
    dev = KERNEL_DEVICE
    ours = [t.to(dev, dtype) for t in (B, C, V)] + [g.to(dev)] + \
        [None if S0 is None else S0.to(dev, dtype)]
    options = dict(fp32_precision="ieee", gate_grad="sweeps", **change.get("options", {}))
    got = grads(ours, "Chunk", **options)
    for name, a, b in zip([x for x in "BCVg" if x in want], got, ref):
        tol = GATE_GRAD_TOLERANCE[dtype] if name == "g" else tolerance(dtype)
        assert torch.isfinite(a).all(), name
        assert rel_error(a.cpu(), b) <= tol, f"{label} d{name}: {rel_error(a.cpu(), b):.2e}"
    # (the same bits twice: interpreted, the programs run one after another and cannot race, so
    # on the CPU two cases hold it for the launch plans cached between calls; on a GPU, every case)
    if not INTERPRETED or label in ("all", "segments-reset"):
        again = grads(ours, "Chunk", **options)
        assert all(torch.equal(a, b) for a, b in zip(got, again))


@pytest.mark.slow  # (~10 s: Triton's code generation for sm_90 and ptxas)
def test_the_gates_gradient_s_sweeps_compile_for_hopper_within_their_spills():
    """The sweeps that carry the gates' gradient's pieces (fp32 with exact products, asked for:
    the dB sweep, the reverse dual sweep), as the GPU will run them, compile for sm_90 without
    one; their spills stay under a ceiling (3.1 and 3.4 KB a thread when it was set: the
    portable kernel's fp32-exact sweeps spill already, NOTES.md)."""
    code = ("from leetrepro.probes.regs import compile_ptx, ptxas_usage, spill_bytes\n"
            "for rev in (False, True):\n"
            "    use = ptxas_usage(compile_ptx('fp32', False, 16, 1, precision='ieee',\n"
            "                                  gate_grad=True, reverse=rev, dual=rev))\n"
            "    print(rev, spill_bytes(use), use.strip()[-120:])\n")
    res = real_codegen("-c", code)
    lines = res.stdout.split("\n")[:2]
    assert [int(line.split()[1]) <= 4096 for line in lines] == [True, True], res.stdout


@pytest.mark.slow  # (~15 s: three kernels compiled twice)
def test_the_hopper_consumers_add_their_rows_with_relaxed_atomics_where_switched_on():
    """With ``chunk.tables.HOPPER_ROWS_SUMMED`` the Hopper kernel's pieces' sweeps (the dB sweep
    at Mamba-2's 64 × 128, with its own pairs late at 128 × 128, the reverse sweep with the dual
    output) add each consumer's part of the rows into its program's block with relaxed atomic
    adds (acquire-release ones, Gluon's default, ordered every earlier access and doubled a
    sweep's time: notes/gates.md), at 168 registers and no spill; off, no atomic add."""
    code = (
        "import re\n"
        "from leetrepro.methods.chunk import tables\n"
        "from leetrepro.probes.regs import compile_hopper, ptxas_usage, spill_bytes\n"
        "for kw in (dict(r=64, d=128), dict(r=128, d=128, late_pairs=True),\n"
        "           dict(reverse=True, dual=True, r=64, d=64)):\n"
        "    for on in (False, True):\n"
        "        tables.HOPPER_ROWS_SUMMED = on\n"
        "        k = compile_hopper('bf16', False, split=False, gates=True, gate_grad=True, **kw)\n"
        "        ptx = k.asm['ptx']\n"
        "        use = ptxas_usage(ptx)\n"
        "        adds = sorted(set(re.findall(r'\\batom\\.[\\w.]+', ptx))) or ['none']\n"
        "        print(on, ','.join(adds), spill_bytes(use), 'Used 168 registers' in use)\n")
    res = real_codegen("-c", code)
    lines = [line.split() for line in res.stdout.splitlines()]
    assert len(lines) == 6, res.stdout
    for off, on in (lines[0:2], lines[2:4], lines[4:6]):
        assert off == ["False", "none", "0", "True"], lines
        assert on == ["True", "atom.global.gpu.relaxed.add.f32", "0", "True"], lines


@pytest.mark.slow  # (~20 s interpreted)
def test_the_pieces_in_16_bit_are_as_accurate_as_the_straddle_kernel():
    """The pieces telescope across the chunks, so any rounding of the states their totals come
    from adds up (√chunks of it): with the state as a plain 16-bit operand and its update's
    weighted rows rounded to 16 bits, fp16 dg was 2.3e-3 from float64 at 64 chunks, the straddle
    kernel's 4.3e-4. The 16-bit sweeps take both roundings' remainders as second products, and
    ⟨dS_N, S_N⟩, which joins every row's dg, is taken from the dB sweep's exact state rather
    than the forward's rounded S_N (that rounding put bf16 dg at 1.2e-2 on the GPU, the straddle
    kernel's 1.7e-3). Measured against float64 on the same rounded inputs (the kernel's own
    error, not hidden under the inputs' rounding), the initial state in fp32 as a model keeps
    it, states in and out: dg within 1.3× of the straddle kernel's."""
    n = 2048  # (32 chunks of 64 rows in fp16)
    gen = torch.Generator().manual_seed(17)
    B, C, V = (torch.randn(1, 2, n, 16, generator=gen).half().double() for _ in range(3))
    g = torch.nn.functional.logsigmoid(torch.randn(1, 2, n, generator=gen) + 4).double()
    S0, dS = (torch.randn(1, 2, 16, 16, generator=gen, dtype=torch.float64) for _ in range(2))
    dO = torch.randn(1, 2, n, 16, generator=gen, dtype=torch.float64)

    def dg(dtype, method, **options):
        # (B's gradient too: dg alone takes the straddle kernel)
        wide = torch.float64 if dtype == torch.float64 else torch.float32
        xs = [t.to(KERNEL_DEVICE, dtype).requires_grad_() for t in (B, C, V)] + \
            [g.to(KERNEL_DEVICE, wide).requires_grad_()]
        out, sn = causal_linear_decoder(*xs[:3], g=xs[3], method=method,
                                        initial_state=S0.to(KERNEL_DEVICE, wide),
                                        output_final_state=True, **options)
        loss = (out.double() * dO.to(out.device)).sum() + (sn.double() * dS.to(sn.device)).sum()
        return torch.autograd.grad(loss, xs)[3].cpu()
    want = dg(torch.float64, "LA_torch")
    errors = {source: rel_error(dg(torch.float16, "Chunk", gate_grad=source), want)
              for source in ("straddle", "sweeps")}
    assert errors["sweeps"] <= 1.3 * errors["straddle"], errors
    assert errors["sweeps"] <= GATE_GRAD_TOLERANCE[torch.float16] / 10, errors


@pytest.mark.slow  # (seconds a case: the full lane runs it)
@pytest.mark.parametrize("source", ["sweeps", "straddle"])
def test_the_gates_gradient_never_reads_the_forwards_final_state(source):
    """⟨dS_N, S_N⟩ joins every row's dg, so the forward's S_N, rounded as a 16-bit sweep rounds
    it, would put that rounding into each row (bf16 dg 1.2e-2 from float64 on the H200): either
    source takes S_N from states it carries exactly. A final state handed to the backward 1 %
    off changes no bit of dg."""
    from leetrepro.ops import causal_linear_backward, encode_options
    B, C, V = make_inputs(2, 2, 150, 8, 6, dtype=torch.float16, device=KERNEL_DEVICE, seed=91)
    g = _gates(2, 2, 150, seed=92, device=KERNEL_DEVICE)
    gen = torch.Generator().manual_seed(93)
    S0, dS = (torch.randn(2, 2, 8, 6, generator=gen).to(KERNEL_DEVICE) for _ in range(2))
    dO = torch.randn(2, 2, 150, 6, generator=gen).to(KERNEL_DEVICE, torch.float16)
    SN = causal_linear_decoder(B, C, V, g=g, initial_state=S0, output_final_state=True,
                               method="Chunk")[1]

    def dg(final):
        return causal_linear_backward(dO, B, C, V, None, S0, dS, "Chunk",
                                      encode_options({"gate_grad": source}), False, True, True,
                                      True, True, None, 1.0, g, final, True)[4]
    assert torch.equal(dg(SN), dg(SN * 1.01))


@pytest.mark.parametrize("dtype, options, straddle", quick_lane([
    (torch.float16, {}, False), (torch.float32, {}, True),
    (torch.float32, dict(fp32_precision="ieee"), True),
    (torch.float16, dict(gate_grad="straddle"), True),
    (torch.float32, dict(gate_grad="sweeps"), False)], keep=(0, 1), unpack=True),
    ids=["fp16", "fp32-tf32", "fp32-ieee", "asked-straddle", "asked-sweeps"])
def test_where_the_gates_gradient_comes_from(monkeypatch, dtype, options, straddle):
    """``gate_grad="auto"``: from the sweeps' pieces in 16 bits (with the state's remainders);
    fp32 at every precision from the straddle kernel (the pieces' running sums put Mamba-2's
    dA 1.9e-3 from float64 at 8192 rows even with exact dots); the option names either source
    outright."""
    from leetrepro.methods import chunk
    calls = []
    real = chunk.gate_gradient
    patch_chunk(monkeypatch, "gate_gradient", lambda *a, **k: calls.append(1) or real(*a, **k))
    B, C, V = (t.requires_grad_() for t in make_inputs(1, 2, 40, 8, 8, dtype=dtype,
                                                         device=KERNEL_DEVICE, seed=5))
    g = _gates(1, 2, 40, seed=6, device=KERNEL_DEVICE).requires_grad_()
    out = causal_linear_decoder(B, C, V, g=g, method="Chunk", **options)
    torch.autograd.grad(out.float().sum(), (B, g))
    assert calls == ([1] if straddle else [])


@pytest.mark.slow  # (two interpreted backwards: the quick lane keeps the source's choice above)
def test_the_gates_gradient_takes_the_products_asked_for(monkeypatch):
    """``gate_grad_precision`` (taken with ``method="auto"`` too) reaches the straddle kernel:
    fp32's products there are tf32x3 unless a caller asks otherwise."""
    from leetrepro.methods import chunk
    seen = []
    real = chunk.gate_gradient
    patch_chunk(monkeypatch, "gate_gradient", lambda *a, **k: seen.append(k["precision"]) or real(*a, **k))
    B, C, V = (t.requires_grad_() for t in make_inputs(1, 2, 40, 8, 8, device=KERNEL_DEVICE,
                                                         seed=5))
    g = _gates(1, 2, 40, seed=6, device=KERNEL_DEVICE).requires_grad_()
    for options in ({}, dict(gate_grad_precision="tf32")):
        out = causal_linear_decoder(B, C, V, g=g, method="Chunk", **options)
        torch.autograd.grad(out.sum(), (B, g))
    assert seen == [None, "tf32"]


@pytest.mark.slow
def test_past_the_pieces_widest_state_the_gates_gradient_comes_from_the_straddle_kernel(
        monkeypatch):
    """``gate_grad="auto"`` keeps the straddle kernel where r or d exceeds
    ``ops.PIECES_MAX_WIDTH`` (a 256-wide tile beside the pieces spills: Falcon-H1's d_state 256
    ran 9× slower on the sweeps); ``"sweeps"`` still takes them there. (The width lowered to
    this test's r so that the interpreter runs a small state.)"""
    from leetrepro import ops
    from leetrepro.methods import chunk
    patch_package(monkeypatch, ops, "PIECES_MAX_WIDTH", 6)
    calls = []
    real = chunk.gate_gradient
    patch_chunk(monkeypatch, "gate_gradient", lambda *a, **k: calls.append(1) or real(*a, **k))
    B, C, V = (t.requires_grad_() for t in make_inputs(1, 2, 40, 8, 4, dtype=torch.float16,
                                                         device=KERNEL_DEVICE, seed=5))
    g = _gates(1, 2, 40, seed=6, device=KERNEL_DEVICE).requires_grad_()
    for options, want in (({}, [1]), (dict(gate_grad="sweeps"), [])):
        calls.clear()
        out = causal_linear_decoder(B, C, V, g=g, method="Chunk", **options)
        torch.autograd.grad(out.float().sum(), (B, g))
        assert calls == want


def test_a_bad_gate_grad_option_is_an_error_that_names_it():
    B, C, V = make_inputs(1, 2, 8, 4, 4, device=KERNEL_DEVICE)
    with pytest.raises(ValueError, match="gate_grad.*'auto', 'sweeps', 'straddle'"):
        causal_linear_decoder(B, C, V, g=_gates(1, 2, 8, seed=1, device=KERNEL_DEVICE),
                              method="Chunk", gate_grad="pieces")


def test_a_backward_asked_for_the_gates_alone_runs_no_sweep(monkeypatch):
    """dg alone (B, C, V frozen): the straddle kernel only, no operator sweep."""
    from leetrepro import ops
    B, C, V = make_inputs(2, 3, 90, 8, 5, device=KERNEL_DEVICE, seed=81)
    g = _gates(2, 3, 90, seed=82, device=KERNEL_DEVICE).requires_grad_()
    out = causal_linear_decoder(B, C, V, g=g, method="Chunk", fp32_precision="ieee")
    calls = []
    real = ops.run
    patch_package(monkeypatch, ops, "run", lambda *a, **k: calls.append(1) or real(*a, **k))
    dO = torch.randn_like(out)
    got, = torch.autograd.grad(out, g, dO)
    assert calls == []
    wide = g.detach().double().requires_grad_()
    want, = torch.autograd.grad(reference(*(t.double() for t in (B, C, V)), g=wide), wide,
                                dO.double())
    assert rel_error(got, want) <= GATE_GRAD_TOLERANCE[torch.float32]


def test_without_the_straddle_kernel_the_row_dots_give_the_same_gradient(monkeypatch):
    """Where the straddle kernel cannot run (a CPU without Triton's interpreter), the row dots'
    running sum on fp32 copies gives dg within the same contract, fp16 inputs with γ and a final
    state in the loss."""
    from leetrepro import ops
    patch_package(monkeypatch, ops, "_straddles", lambda m, V: False)
    B, C, V = make_inputs(2, 3, 150, 8, 5, dtype=torch.float16, seed=91)
    g = _gates(2, 3, 150, seed=92)
    gam = random_gammas(3, 93)
    leaves = [t.detach().clone().requires_grad_() for t in (B, C, V, g)]
    out, s = causal_linear_decoder(*leaves[:3], gam, g=leaves[3], output_final_state=True,
                                   method="LA_torch")
    wide = [t.detach().double().requires_grad_() for t in leaves]
    want_o, want_s = reference(*wide[:3], gam, g=wide[3], output_final_state=True)
    gen = torch.Generator().manual_seed(94)
    dO, dS = (torch.randn(x.shape, generator=gen, dtype=torch.float64) for x in (want_o, want_s))
    got = torch.autograd.grad((out.double() * dO).sum() + (s.double() * dS).sum(), leaves)
    want = torch.autograd.grad((want_o * dO).sum() + (want_s * dS).sum(), wide)
    for name, a, b in zip("BCVg", got, want):
        assert rel_error(a, b) <= (2e-3 if name == "g" else 1e-2), f"d{name}: {rel_error(a, b):.2e}"


@pytest.mark.slow
def test_the_straddle_kernels_compile_for_hopper_within_its_shared_memory():
    """The gates' gradient's two kernels through Triton's real code generation for sm_90 and
    ptxas (the interpreter checks their numbers, not their resources): each program's shared
    memory within Hopper's 227 KiB (the unrolled block pairs once asked for 546 KiB, and every
    gated backward failed on the GPU), with Mamba-3's turned pairs' sums too, and their spills
    held at what was measured (NOTES.md:
    the pairs' tiles and the carried state exceed 255 registers a thread at any warp count);
    and the kernel taking dg from the Hopper kernel's rows (``kernels/gate_rows.py``) without
    spills."""
    from leetrepro.probes.regs import STRADDLE_JOBS, spill_bytes
    res = real_codegen("-m", "leetrepro.probes.regs", "--straddle", timeout=900)
    rows = [line for line in res.stdout.splitlines() if line.startswith("rows ")]
    assert len(rows) == 2 and all(spill_bytes(line) == 0 for line in rows), rows
    lines = [line for line in res.stdout.splitlines() if line.startswith("straddle ")]
    assert len(lines) == len(STRADDLE_JOBS)
    for line in lines:
        shared = int(line.split("shared=")[1].split()[0])
        assert 0 < shared <= 232448, line
        budget = {"segment_states": 400, "straddle_gradient": 1900}[line.split()[1]]
        if " angles=" in line:  # (Mamba-3's turned pairs' sums too: 3.4-4.6 KB)
            budget = 5000
        assert spill_bytes(line) <= (3 * budget if " fp32 " in line else budget), line


@pytest.mark.parametrize("reverse", [False, True])
def test_the_hopper_kernel_s_rows_become_the_sweeps_pieces(reverse):
    """``chunk.hopper_row_pieces``: the Hopper kernel's rows q (a block per consumer's columns)
    summed over the blocks, then per chunk of physical rows each row's sum of q over the rows
    from it to the chunk's end (forward in time: I + II) or over the rows before it (reverse:
    III, the rows logically after it), and each chunk's total, as the portable kernel's sweeps
    write their pieces; N not a multiple of the chunk."""
    from leetrepro.methods import chunk
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(2, 2, 3, 150, generator=gen)
    rows, totals = chunk.hopper_row_pieces(q, 64, reverse)
    assert rows.shape == (1, 2, 3, 150) and totals.shape == (1, 6, 3)
    s = q.double().sum(0)
    for t in (0, 1, 63, 64, 100, 128, 149):
        first = t // 64 * 64
        want = s[1, 2, first:t] if reverse else s[1, 2, t:first + 64]
        assert abs(rows[0, 1, 2, t].item() - want.sum().item()) <= 1e-4
    want = torch.stack([s[..., c * 64:(c + 1) * 64].sum(-1) for c in range(3)], -1)
    assert torch.allclose(totals[0].double(), want.reshape(6, 3), atol=1e-4)


@pytest.mark.parametrize("n, tail", [(150, False), (2100, True)])
def test_the_gates_gradient_from_the_hopper_rows_in_one_pass(n, tail):
    """``chunk.gate_gradient_from_rows`` (``kernels/gate_rows.py``, interpreted on the CPU): each
    row's dg from both sweeps' rows (blocks summed), their sums within its chunk, the later
    chunks' totals in float64 and the final state's pairs, times the scale, as the definition in
    float64 has it and as ``hopper_row_pieces`` then ``gate_gradient_from_pieces`` give it; N
    not a multiple of the chunk, several steps of chunks a program; the same bits twice."""
    from leetrepro.methods import chunk
    gen = torch.Generator().manual_seed(5)
    q_f = torch.randn(2, 2, 3, n, generator=gen).to(KERNEL_DEVICE)
    q_r = torch.randn(1, 2, 3, n, generator=gen).to(KERNEL_DEVICE)
    t_n = torch.randn(2, 3, generator=gen, dtype=torch.float64).to(KERNEL_DEVICE) if tail else None
    got = chunk.gate_gradient_from_rows(q_f, q_r, 64, t_n, scale=0.5)
    assert got.shape == (2, 3, n) and got.dtype == torch.float32
    f, r = q_f.double().sum(0).cpu(), q_r.double().sum(0).cpu()
    want = torch.empty(2, 3, n, dtype=torch.float64)
    chunks = -(-n // 64)
    e = torch.stack([f[..., c * 64:(c + 1) * 64].sum(-1) for c in range(chunks)], -1)
    fr = torch.stack([r[..., c * 64:(c + 1) * 64].sum(-1) for c in range(chunks)], -1)
    for t in range(n):
        c, first = t // 64, t // 64 * 64
        want[..., t] = (f[..., t:first + 64].sum(-1) + r[..., first:t].sum(-1)
                        + (e - fr)[..., c + 1:].sum(-1) - fr[..., c]
                        + (0.0 if t_n is None else t_n.cpu()))
    want *= 0.5
    assert (got.cpu().double() - want).abs().max() <= 1e-5 * want.abs().max()
    composed = chunk.gate_gradient_from_pieces(chunk.hopper_row_pieces(q_f, 64, False),
                                               chunk.hopper_row_pieces(q_r, 64, True), 64, None,
                                               t_n, 0.5)
    assert (got - composed).abs().max() <= 1e-5 * composed.abs().max()
    assert torch.equal(got, chunk.gate_gradient_from_rows(q_f, q_r, 64, t_n, scale=0.5))
    # written in the gates' layout and dtype where they are given (a time-major g's dg
    # time-major: no copy after), the same values
    for dtype in (torch.float32, torch.float16):
        g = torch.empty(2, n, 3, dtype=dtype, device=KERNEL_DEVICE).transpose(1, 2)
        laid = chunk.gate_gradient_from_rows(q_f, q_r, 64, t_n, scale=0.5, like=g)
        assert laid.dtype == dtype and laid.stride() == g.stride()
        assert torch.equal(laid, got.to(dtype))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or INTERPRETED, reason="needs a CUDA GPU")
def test_the_gates_gradient_from_the_hopper_rows_on_the_gpu(monkeypatch):
    """``chunk.gate_gradient_from_rows``' kernel on a GPU (``chunk.tables.GATE_ROWS_ON_GPU``) against
    the composition it replaces, at Mamba-2's lanes and N = 8192 + 5, with the final state's
    pairs; the same bits twice."""
    from leetrepro.methods import chunk
    monkeypatch.setattr(chunk.tables, "GATE_ROWS_ON_GPU", True)
    gen = torch.Generator().manual_seed(6)
    n = 8197
    q_f = torch.randn(2, 2, 64, n, generator=gen).cuda()
    q_r = torch.randn(1, 2, 64, n, generator=gen).cuda()
    t_n = torch.randn(2, 64, generator=gen, dtype=torch.float64).cuda()
    got = chunk.gate_gradient_from_rows(q_f, q_r, 64, t_n, scale=0.5)
    want = chunk.gate_gradient_from_pieces(chunk.hopper_row_pieces(q_f, 64, False),
                                           chunk.hopper_row_pieces(q_r, 64, True), 64, None,
                                           t_n, 0.5)
    assert (got - want).abs().max() <= 1e-5 * want.abs().max()
    assert torch.equal(got, chunk.gate_gradient_from_rows(q_f, q_r, 64, t_n, scale=0.5))


def test_the_sweeps_pieces_take_the_hopper_kernel_at_the_widest_columns_one_wave_allows(
        monkeypatch):
    """``chunk.hopper_pieces``: where the Hopper kernel can take the pieces (here said so), a
    program holds as many value columns as it can (at most ``chunk.tables.PIECES_DC``), halved (down to
    32) only while twice the programs still run in one wave; fewer programs than half the SMs
    even then, the switch off, or the portable kernel forced: None (the portable sweeps). That is
    the rule with one segment a lane; in segments (``HOPPER_PIECES_SEGMENTS``, the default) the
    widest, whatever the lanes."""
    from leetrepro.methods import chunk
    patch_chunk(monkeypatch, "hopper_pieces_unfit", lambda *a, **k: None)
    patch_chunk(monkeypatch, "sm_count", lambda device: 132)
    monkeypatch.setattr(chunk.tables, "HOPPER_PIECES_SEGMENTS", False)

    def dc(batch, heads, r, d, reverse=True):
        B = torch.empty(batch, heads, 64, r, dtype=torch.bfloat16)
        V = torch.empty(batch, heads, 64, d, dtype=torch.bfloat16)
        return chunk.hopper_pieces(B, B, V, V, reverse=reverse)
    assert dc(2, 128, 128, 64) == 64  # (256 programs of 64 columns)
    assert dc(2, 64, 128, 64) == 64  # (128 lanes on 132 SMs: one program a lane)
    assert dc(1, 64, 128, 64) == 32  # (64 lanes: two programs a lane, still one wave)
    assert dc(8, 32, 128, 128) == 128  # (the most a program holds beside the pieces)
    assert dc(8, 32, 128, 128, reverse=False) == 128  # (forward too, spilling: measured faster)
    assert dc(2, 64, 64, 128, reverse=False) == 128
    assert dc(2, 64, 256, 64) == 32  # (in reverse at r = 256: the most that fits)
    assert dc(2, 64, 64, 256, reverse=False) == 128
    B, V = (torch.empty(4, 80, 64, 64, dtype=torch.bfloat16) for _ in range(2))
    monkeypatch.setattr(chunk.tables, "HOPPER_DUAL_PIECES", False)
    assert chunk.hopper_pieces(B, B, V, V, reverse=True, dual=True) is None  # (the switch off)
    monkeypatch.setattr(chunk.tables, "HOPPER_DUAL_PIECES", True)
    assert chunk.hopper_pieces(B, B, V, V, reverse=True, dual=True) == 64  # (the whole state)
    assert chunk.hopper_pieces(B[:1, :32], B[:1, :32], V[:1, :32], V[:1, :32], reverse=True,
                               dual=True) is None  # (32 lanes: the plain sweep splits)
    assert chunk.hopper_pieces(B[:1, :48], B[:1, :48], V[:1, :48], V[:1, :48], reverse=True,
                               dual=True) == 64  # (48 lanes: HOPPER_DUAL_PIECES_SHARE)
    assert chunk.hopper_pieces(B[:2, :64], B[:2, :64], V[:2, :64], V[:2, :64], reverse=True,
                               dual=True) == 64  # (128 lanes)
    assert dc(1, 16, 128, 64) is None  # (32 programs at 32 columns)
    chunk.force_kernel("hopper")  # (the correctness matrix's switch: whatever the lanes)
    try:
        assert dc(1, 16, 128, 64) == 64
    finally:
        chunk.force_kernel(None)
    monkeypatch.setattr(chunk.tables, "HOPPER_PIECES_SEGMENTS", True)  # (segments: the widest)
    assert (dc(1, 64, 128, 64), dc(1, 16, 128, 64), dc(8, 32, 128, 128)) == (64, 64, 128)
    assert dc(2, 64, 256, 64) == 32 and dc(1, 4, 64, 256, reverse=False) == 128
    assert chunk.hopper_pieces(B[:1, :32], B[:1, :32], V[:1, :32], V[:1, :32], reverse=True,
                               dual=True) == 64
    # (the dual sweep with Mamba-2's row dots keeps one segment a lane: the share rule still)
    assert chunk.hopper_pieces(B[:1, :24], B[:1, :24], V[:1, :24], V[:1, :24], reverse=True,
                               dual=True, rows=True) is None
    assert chunk.hopper_pieces(B[:1, :48], B[:1, :48], V[:1, :48], V[:1, :48], reverse=True,
                               dual=True, rows=True) == 64
    monkeypatch.setattr(chunk.tables, "HOPPER_DUAL_ROWS_ANY_LANES", True)
    assert chunk.hopper_pieces(B[:1, :24], B[:1, :24], V[:1, :24], V[:1, :24], reverse=True,
                               dual=True, rows=True) == 64
    monkeypatch.setattr(chunk.tables, "HOPPER_PIECES", False)
    assert dc(2, 128, 128, 64) is None
    monkeypatch.setattr(chunk.tables, "HOPPER_PIECES", True)
    chunk.force_kernel("portable")
    try:
        assert dc(2, 128, 128, 64) is None
    finally:
        chunk.force_kernel(None)


def test_the_gates_gradient_at_r_256_takes_the_hopper_pieces_only_where_switched_on(monkeypatch):
    """``ops.gate_sweeps._in_sweeps`` past ``ops.PIECES_MAX_WIDTH`` (Falcon-H1's d_state 256): the straddle
    kernel, unless ``chunk.tables.HOPPER_PIECES_WIDE`` and the Hopper kernel takes both sweeps' pieces
    (here said to fit), not with packed sequences or the portable kernel asked for."""
    from leetrepro import ops
    from leetrepro.methods import chunk
    from leetrepro.registry import get
    patch_chunk(monkeypatch, "hopper_pieces_unfit", lambda *a, cu_seqlens=None, **k: "packed" if cu_seqlens is not None
                        else None)
    patch_chunk(monkeypatch, "sm_count", lambda device: 132)
    patch_package(monkeypatch, ops, "_straddles", lambda m, V: True)
    m = get("Chunk")
    B, C = (torch.empty(2, 1, 64, 256, dtype=torch.bfloat16) for _ in range(2))
    V, dO = (torch.empty(2, 64, 64, 64, dtype=torch.bfloat16) for _ in range(2))
    monkeypatch.setattr(chunk.tables, "HOPPER_PIECES_WIDE", False)
    assert not ops.gate_sweeps._in_sweeps(m, {}, dO, B, C, V)  # (the switch off)
    monkeypatch.setattr(chunk.tables, "HOPPER_PIECES_WIDE", True)
    assert ops.gate_sweeps._in_sweeps(m, {}, dO, B, C, V)
    assert not ops.gate_sweeps._in_sweeps(m, {"kernel": "portable"}, dO, B, C, V)
    assert not ops.gate_sweeps._in_sweeps(m, {}, dO, B, C, V, torch.tensor([0, 64], dtype=torch.int32))


def test_the_hopper_kernel_takes_e_and_the_gates_through_its_ring_where_no_slot_is_lost(
        monkeypatch):
    """``chunk.hopper_constants``: the pieces' row vectors E come through the Hopper kernel's
    ring where two slots of it fit, the gates' tile sums where they cost the ring no slot with
    1152 bytes kept for their padding; a launch whose slots and fixed buffers left under 2.1 KB
    took more shared memory than the GPU has (H200): that one keeps them out."""
    from leetrepro._device import SM90_SHARED_BYTES
    from leetrepro.methods import chunk

    def consts(r, d, reverse, dc, pieces=True):
        return chunk.hopper_constants(r=r, d=d, dtype=torch.bfloat16, decay=False, has_s0=True,
                                      store_sn=True, split=False, reverse=reverse, dual=False,
                                      dc=dc, gates=True, gate_grad=pieces)
    k = consts(64, 128, False, 128)  # (Mamba-2's dB sweep)
    assert (k.E_RING, k.G_RING, k.STAGES) == (True, True, 2)
    k = consts(128, 64, True, 64)  # (its dV sweep)
    assert (k.E_RING, k.G_RING, k.STAGES) == (True, True, 3)
    k = consts(128, 128, True, 128)  # (no two slots with E at 128 × 128: its loads)
    assert (k.E_RING, k.G_RING, k.STAGES) == (False, True, 2)
    k = consts(128, 128, False, 128, pieces=False)  # (the gated forward, three slots)
    assert (k.E_RING, k.G_RING, k.STAGES) == (False, True, 3)
    monkeypatch.setattr(chunk.tables, "HOPPER_E_RING", False)
    k = consts(64, 128, False, 128)  # (the launch that asked 72 bytes over)
    assert (k.E_RING, k.G_RING, k.STAGES) == (False, False, 4)
    # (the bytes as counted, with the gates' padding, within the GPU's)
    bn, slot = 64, 64 * (2 * 64 + 128 + 128) * 2 + 4 * 64
    fixed = (2 * 64 * 64 + 4 * bn * 64 + 2 * bn * 64 + 2 * 64 * 64 + 2 * bn * 64) * 2
    assert 2 * slot + fixed + 1024 + 1152 <= SM90_SHARED_BYTES


def test_a_hopper_launch_over_shared_memory_is_made_again_without_the_rings(monkeypatch):
    """``chunk.HopperLaunch.launch``: where the kernel asks for more shared memory than the SM
    has (Triton's OutOfResources, raised as it loads), the gates' tile sums, then E, leave the
    ring (each a kernel of its own key) and the launch is made again; with neither there the
    error is the caller's."""
    from leetrepro.methods import chunk
    launch = chunk.hopper_launch._hopper_launch(n=640, r=64, d=128, heads=2, lanes=2, segment=640, dc=128,
                                  dtype=torch.bfloat16, decay=False, has_s0=False,
                                  store_sn=False, reverse=False, dual=False,
                                  serial=next(chunk.tables._SERIALS),
                                  gates=True, gate_grad=True)
    assert launch.consts.E_RING and launch.consts.G_RING and launch.blocks[4] == 64
    tried = []

    def fake(self, *a, **k):
        tried.append((self.consts.E_RING, self.consts.G_RING, self.key))
        raise chunk.hopper_launch.OutOfResources(232520, 232448, "shared memory")
    monkeypatch.setattr(chunk.HopperLaunch, "_launch", fake)
    with pytest.raises(chunk.hopper_launch.OutOfResources):
        launch.launch(None, sn=None, flags=None, sync=None, ws=None, scale=1.0)
    assert [t[:2] for t in tried] == [(True, True), (True, False), (False, False)]
    assert len({t[2] for t in tried}) == 3  # (a kernel of its own for each)
    assert launch.blocks[4] is None and launch.layouts[4] is None and launch.descriptors is None
    tried.clear()
    monkeypatch.setattr(chunk.HopperLaunch, "_launch",
                        lambda self, *a, **k: tried.append(self.consts.G_RING))
    launch.launch(None, sn=None, flags=None, sync=None, ws=None, scale=1.0)
    assert tried == [False]  # (from then on)


def test_the_hopper_kernel_s_pieces_say_why_they_cannot_run():
    from leetrepro.methods import chunk
    B, C, V = make_inputs(1, 2, 64, 64, 64, dtype=torch.bfloat16)
    assert "dual output" in chunk.hopper_pieces_unfit(B, C, V, V, dual=True, reverse=False)
    assert "GPU" in chunk.hopper_pieces_unfit(B, C, V, V)


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.skipif(not torch.cuda.is_available() or INTERPRETED, reason="needs a CUDA GPU")
@pytest.mark.parametrize("r, d, dtype, states, reset, dual, late, segments", [
    (128, 64, torch.bfloat16, False, False, False, False, False),
    (64, 64, torch.float16, True, False, False, False, False),
    (128, 128, torch.bfloat16, False, True, False, False, False),
    (128, 128, torch.float16, True, False, False, False, False),
    (64, 64, torch.bfloat16, True, True, True, False, False),
    (64, 64, torch.float16, False, False, True, False, False),
    (256, 64, torch.bfloat16, True, False, False, False, False),
    (128, 128, torch.bfloat16, True, True, False, True, False),
    (128, 64, torch.float16, False, False, False, True, False),
    (64, 64, torch.bfloat16, True, True, True, False, True),
    (64, 64, torch.float16, False, False, True, False, True),
    (128, 128, torch.float16, True, False, False, False, True),
    (128, 64, torch.bfloat16, False, True, False, True, True),
    (256, 64, torch.bfloat16, True, False, False, False, True)])
def test_the_hopper_kernel_s_pieces_give_the_gates_gradient(monkeypatch, request, r, d, dtype,
                                                            states, reset, dual, late, segments):
    """On an sm_90 GPU, both sweeps' pieces taken on the Hopper kernel (forced at a small
    shape: ``force_kernel("hopper")`` waives the lanes' rule) give every gradient within the
    contract of float64 (dg within GATE_GRAD_TOLERANCE), B and C in groups, N not a multiple of
    the chunk, states in and out, a hard reset, and the reverse sweep with dC's dual output
    (``chunk.tables.HOPPER_DUAL_PIECES``), at r = 256 (Falcon-H1's d_state:
    ``chunk.tables.HOPPER_PIECES_WIDE``), and with the dB sweep's own pairs after O's store
    (``chunk.tables.HOPPER_LATE_PAIRS``); the same bits twice. ``segments``: the pieces' sweeps in
    256-row segments chained through the ring (``chunk.tables.HOPPER_PIECES_SEGMENTS``, Chunk's
    ``segment`` option), four a lane here."""
    from leetrepro.methods import chunk
    from leetrepro.reference import rel_error
    if chunk.hopper_unfit(*make_inputs(1, 1, 64, 64, 64, dtype=dtype, device="cuda"), None):
        pytest.skip("needs an sm_90 GPU")
    monkeypatch.setattr(chunk.tables, "HOPPER_DUAL_PIECES", dual)
    monkeypatch.setattr(chunk.tables, "HOPPER_PIECES_WIDE", True)
    # (the dB sweep's r is the operator's d, and its columns a program the operator's r)
    monkeypatch.setattr(chunk.tables, "HOPPER_LATE_PAIRS", frozenset({(d, r)} if late else ()))
    monkeypatch.setattr(chunk.tables, "HOPPER_PIECES_SEGMENTS", segments)
    chunk.force_kernel("hopper")  # (the lanes' rule waived at this small shape)
    request.addfinalizer(lambda: chunk.force_kernel(None))
    calls = []
    real, real_rows = chunk.hopper_row_pieces, chunk.gate_gradient_from_rows
    patch_chunk(monkeypatch, "hopper_row_pieces", lambda *a, **k: calls.append(a[2]) or real(*a, **k))
    patch_chunk(monkeypatch, "gate_gradient_from_rows", lambda *a, **k: calls.append("both") or real_rows(*a, **k))
    b, h, n = 2, 4, 1000
    gen = torch.Generator().manual_seed(11)
    B, C = (torch.randn(b, 2, n, r, generator=gen) / r ** 0.5 for _ in range(2))
    V = torch.randn(b, h, n, d, generator=gen)
    g = _gates(b, h, n, seed=12)
    if reset:
        g[:, :, n // 3] = -1e4
    S0 = torch.randn(b, h, r, d, generator=gen) if states else None
    dO = torch.randn(b, h, n, d, generator=gen, dtype=torch.float64)
    dS = torch.randn(b, h, r, d, generator=gen, dtype=torch.float64) if states else None

    def grads(xs, method):
        xs = [x.to("cuda").requires_grad_() for x in xs]
        opts = dict(segment=256) if segments and method == "Chunk" else {}
        out = causal_linear_decoder(*xs[:3], g=xs[3], method=method, output_final_state=states,
                                    **opts,
                                    initial_state=None if S0 is None else
                                    S0.to("cuda", torch.float64 if method == "LA_torch" else
                                          torch.float32))
        o, sn = out if states else (out, None)
        loss = (o.double() * dO.cuda()).sum() + \
            (0.0 if sn is None else (sn.double() * dS.cuda()).sum())
        return [t.double().cpu() for t in torch.autograd.grad(loss, xs)]
    want = grads([t.double() for t in (B, C, V, g)], "LA_torch")
    got = grads([t.to(dtype) for t in (B, C, V)] + [g], "Chunk")
    # (both sweeps' rows taken in one pass, by the rows' kernel or, where it is off, by each
    # sweep's rows summed)
    assert calls == (["both"] if chunk.tables.GATE_ROWS_ON_GPU else ["both", False, True]), calls
    for name, a, w in zip("BCVg", got, want):
        tol = GATE_GRAD_TOLERANCE[dtype] if name == "g" else tolerance(dtype)
        assert rel_error(a, w) <= tol, f"d{name}: {rel_error(a, w):.2e}"
    again = grads([t.to(dtype) for t in (B, C, V)] + [g], "Chunk")
    assert all(torch.equal(a, w) for a, w in zip(got, again))


@pytest.mark.slow  # (seconds: two layer-sized calls of each decay on the CPU)
def test_the_gates_folded_shifted_and_summed_in_one_launch_are_the_passes_values(monkeypatch):
    """``hopper_launch.folded_gate_sums`` (``tables.GATE_FOLD_FUSED``; interpreted here): the
    folded gates, the reverse sweeps' shifted ones and both tile sums from one launch equal
    ``fold_gates``, ``shift_gates`` and ``tile_gate_sums`` of them bit for bit, hard resets
    (−1e4, −inf) raised to the floor and NaN kept, any strides, bf16 gates, N past a whole tile;
    the sweeps' ``tile_gate_sums`` finds the sums while the gates live, and a call folds as
    before where it does not apply (the switch off, float64)."""
    from leetrepro.decay.per_token import fold_gates, shift_gates
    from leetrepro.methods.chunk import hopper_launch, tables
    if not INTERPRETED:
        pytest.skip("the CPU's interpreted launch")
    monkeypatch.setattr(tables, "GATE_FOLD_FUSED", True)
    launched = []
    real = hopper_launch.launch
    monkeypatch.setattr(hopper_launch, "launch",
                        lambda kernel, grid, args, **kw: (launched.append(grid),
                                                          real(kernel, grid, args, **kw))[1])
    for n, dtype, time_major in ((150, torch.float32, True), (64, torch.bfloat16, False),
                                 (1, torch.float32, False)):
        g = _gates(2, 3, n, seed=n).to(dtype)
        if n > 8:
            g[0, 1, 5], g[1, 2, 70 % n], g[0, 0, n - 1], g[1, 0, 3] = -1e4, -torch.inf, 0.0, torch.nan
        if time_major:
            g = g.transpose(1, 2).contiguous().transpose(1, 2)
        launched.clear()
        gate, rev = hopper_launch.folded_gate_sums(g, twin=True)
        assert len(launched) == 1
        want = fold_gates(g, None, torch.float32)
        assert torch.equal(gate.nan_to_num(1.0), want.nan_to_num(1.0))
        assert torch.equal(rev.nan_to_num(1.0), shift_gates(want).nan_to_num(1.0))
        assert gate.is_contiguous() and rev.is_contiguous()
        sums = [hopper_launch.tile_gate_sums(x, 64, r) for x, r in ((gate, False), (rev, True))]
        assert len(launched) == 1  # (found, not made again)
        alone = [hopper_launch._tile_sums((x.clone(), r), block=64, unit=hopper_launch.LOG2E)[0]
                 for x, r in ((want, False), (shift_gates(want), True))]
        assert all(torch.equal(a.nan_to_num(1.0), b.nan_to_num(1.0)) for a, b in zip(sums, alone))
        assert hopper_launch.tile_gate_sums(gate, 64, True) is not sums[0]  # (not made: anew)
        one, none = hopper_launch.folded_gate_sums(g, twin=False)
        assert none is None and torch.equal(one.nan_to_num(1.0), gate.nan_to_num(1.0))
    kept = len(hopper_launch._FOLDED)
    del gate, rev, one, sums
    assert len(hopper_launch._FOLDED) < kept  # (an entry leaves with its gates)
    assert hopper_launch.folded_gate_sums(g.double(), twin=True) is None
    monkeypatch.setattr(tables, "GATE_FOLD_FUSED", False)
    assert hopper_launch.folded_gate_sums(g, twin=True) is None


@pytest.mark.slow  # (5-18 s on two cores: kept out of the quick lane)
def test_a_gated_call_with_its_gates_folded_in_the_sums_launch_gives_the_same_bits(monkeypatch):
    """``tables.GATE_FOLD_FUSED`` on and off (interpreted, Chunk's portable sweeps, which read
    the folded and shifted gates as tensors): a gated forward and backward give the same bits."""
    from leetrepro.compat import chunk_simple_gla
    from leetrepro.methods.chunk import tables
    if not INTERPRETED:
        pytest.skip("the CPU's interpreted launch")
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 90, 3, 16, generator=gen).requires_grad_() for _ in range(3))
    g = torch.nn.functional.logsigmoid(torch.randn(2, 90, 3, generator=gen))
    g[0, 40, 1] = -1e4
    g.requires_grad_()
    dO = torch.randn(2, 90, 3, 16, generator=gen)
    got = []
    for on in (False, True):
        monkeypatch.setattr(tables, "GATE_FOLD_FUSED", on)
        o = chunk_simple_gla(q, k, v, g=g, method="Chunk")[0]
        got.append((o, *torch.autograd.grad(o, (q, k, v, g), dO)))
    assert all(torch.equal(a, b) for a, b in zip(*got))


def test_a_layer_call_launches_what_the_census_counted(monkeypatch):
    """The kernels one eager forward and backward of a 125M model's layer launches on an H200
    (``probes.launches``: its tables and SMs, the launches recorded, not run), and the ATen
    operators it issues, held at what they are: a launch costs tens of microseconds of an eager
    step's host time (notes/gates.md), so a change that adds one shows here. The gated call:
    the per-head decay's sweeps and repair launches (dC's in the dual sweep beside the pieces:
    48 lanes pass ``HOPPER_DUAL_PIECES_SHARE``), the gates summed by tiles (the forward's, and
    the backward's sweeps' in one launch), the gates' gradient's one pass; and the Python
    functions each call runs, against a budget."""
    from leetrepro.probes.launches import census
    sweep = ["chunk_hopper_kernel", "chunk_scan_kernel repair"]
    gated = census("h200", (4, 4096, 12, 64, 64), gated=True)
    assert gated["forward"] == ["tile_sums_kernel"] + sweep
    assert gated["backward"] == ["tile_sums_kernel"] + sweep * 2 + ["gate_rows_kernel"]
    per_head = census("h200", (4, 4096, 12, 64, 64), gated=False)
    assert per_head["forward"] == sweep and per_head["backward"] == sweep * 2
    # (the CPU's own reads of the gates' values, none on a GPU, left out)
    host_only = {"max", "_local_scalar_dense", "detach"}
    ops = {f"{decay} {phase}": sum(c for op, c in res[phase + "_ops"].items()
                                   if op not in host_only)
           for decay, res in (("gated", gated), ("per_head", per_head))
           for phase in ("forward", "backward")}
    # (the gated backward's reverse sweeps share one shift of the gates: 31 when each shifted;
    # its sweeps one launch of the tile sums: 29 when each launched its own; dg written in the
    # gates' layout by its pass: 28 when copied there after; dC in the dual sweep: 26 apart)
    # (and the gates folded and shifted in their tile sums' launch, ``tables.GATE_FOLD_FUSED``,
    # the default: 23 with the floor's, the shift's and the pad's operators)
    # (the pieces' sweeps in segments, ``tables.HOPPER_PIECES_SEGMENTS``: each its ring's
    # workspace of segment states, 22 with one segment a lane)
    assert ops == {"gated forward": 14, "gated backward": 24, "per_head forward": 10,
                   "per_head backward": 14}, ops
    # the backward's Python: the gates' pieces decided once per signature (391 calls when
    # decided on every call; 221 and 153 when this budget was set)
    assert gated["backward_calls"] <= 230 and per_head["backward_calls"] <= 160, \
        (gated["backward_calls"], per_head["backward_calls"])
    # the forward's: autograd Functions entered by their C entry (``_direct.apply``: 266 and 278
    # when Function.apply bound their defaults by inspect.signature; 99 and 111 when set)
    assert gated["forward_calls"] <= 115 and per_head["forward_calls"] <= 105, \
        (gated["forward_calls"], per_head["forward_calls"])
    # the gates folded and shifted apart (``tables.GATE_FOLD_FUSED`` off): the same launches,
    # with the floor's, the shift's and the pad's operators and their kernels
    from leetrepro.methods.chunk import tables
    gone = {"clamp_min", "slice", "constant_pad_nd"}
    assert not gone & (set(gated["forward_ops"]) | set(gated["backward_ops"]))
    monkeypatch.setattr(tables, "GATE_FOLD_FUSED", False)
    apart = census("h200", (4, 4096, 12, 64, 64), gated=True)
    assert (apart["forward"], apart["backward"]) == (gated["forward"], gated["backward"])
    assert gone <= set(apart["backward_ops"])
    assert sum(c for op, c in apart["backward_ops"].items() if op not in host_only) == 25


def _layer_inputs(batch, n, heads, dim):
    """A layer's q, k, v (fp16, time-major ``(batch, n, heads, dim)``) and its log gates, all
    requiring grad, for the launch census on the CPU (fp16 stands for bf16 there)."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(batch, n, heads, dim, generator=gen, dtype=torch.float16,
                           requires_grad=True) for _ in range(3))
    g = torch.nn.functional.logsigmoid(torch.randn(batch, n, heads, generator=gen))
    return q, k, v, g.requires_grad_()


def _hopper_launches_as(monkeypatch, describe) -> None:
    """``probes.launches`` records each Hopper kernel's launch as ``describe(arguments, K)`` (its
    size, constants), every other launch by its name."""
    from leetrepro.probes import launches
    name = launches._kernel_name

    def recorded(kernel, arguments):
        if name(kernel, arguments) != "chunk_hopper_kernel":
            return name(kernel, arguments)
        return describe(arguments, arguments["K"])
    monkeypatch.setattr(launches, "_kernel_name", recorded)


@pytest.mark.parametrize("summed", [False, True])
def test_the_summed_rows_reach_the_pieces_sweeps_and_their_buffers(monkeypatch, summed):
    """``chunk.tables.HOPPER_ROWS_SUMMED``: every Hopper launch carrying the gates' pieces has
    ``ROWS_SUMMED`` as the switch says, and its rows' buffer a block a program (zeros when it
    launches: the consumers add into it) or a block a consumer; no other launch has it."""
    from leetrepro.compat import chunk_simple_gla
    from leetrepro.methods.chunk import tables
    from leetrepro.probes import launches
    monkeypatch.setattr(tables, "HOPPER_ROWS_SUMMED", summed)

    def describe(a, k):
        rows = a["PIECES"][4] if k.GATE_GRAD else None
        return (bool(k.GATE_GRAD), bool(k.ROWS_SUMMED), None if rows is None else
                (rows.shape[0] * k.DC // k.D, bool(torch.count_nonzero(rows) == 0)))
    _hopper_launches_as(monkeypatch, describe)
    q, k, v, g = _layer_inputs(2, 1000, 4, 64)
    recorded = []
    with launches.as_gpu("h200", recorded):
        o = chunk_simple_gla(q, k, v, g=g, method="Chunk")[0]
        o.backward(torch.ones_like(o))
    hopper = [x for x in recorded if isinstance(x, tuple)]
    pieces = [x for x in hopper if x[0]]
    assert len(pieces) >= 2 and len(hopper) > len(pieces), hopper
    # (blocks × DC / D: 1 a program summed, 2 a consumer each)
    assert all(x[1] == summed and x[2][0] == (1 if summed else 2) for x in pieces), pieces
    assert all(x[2][1] for x in pieces) or not summed, pieces
    assert not any(x[1] for x in hopper if not x[0]), hopper


def test_a_gated_backward_lets_its_folded_gates_go_before_dg_is_made(monkeypatch):
    """With the pieces' sweeps (the Hopper kernel's, ``probes.launches``), the backward's folded
    gates (and with them their tile sums) are freed once the sweeps are done, before dg's
    buffer is made: with every gradient buffer alive that moment is a gated backward's peak
    (8 MiB of gates and 8 of sums at Mamba-2's 2 × 64 heads × 8192)."""
    import weakref
    from leetrepro.compat import chunk_simple_gla
    from leetrepro.ops import forward, gate_sweeps
    from leetrepro.probes import launches
    made, alive = [], []
    fold, from_pieces = forward.folded_gates, gate_sweeps.gradient_from_pieces

    def folded(*a, **k):
        out = fold(*a, **k)
        made.extend(weakref.ref(x) for x in out if isinstance(x, torch.Tensor))
        return out

    def pieces(*a, **k):
        alive.append([ref() is not None for ref in made])
        return from_pieces(*a, **k)
    monkeypatch.setattr(forward, "folded_gates", folded)
    monkeypatch.setattr(gate_sweeps, "gradient_from_pieces", pieces)
    q, k, v, g = _layer_inputs(2, 1000, 4, 64)
    with launches.as_gpu("h200", []):
        o = chunk_simple_gla(q, k, v, g=g, method="Chunk")[0]
        made.clear()  # (the backward's own)
        o.backward(torch.ones_like(o))
    assert made and alive == [[False] * len(made)], (len(made), alive)


def test_the_ssd_s_dual_sweep_with_row_dots_keeps_the_share_rule_in_segments(monkeypatch):
    """Mamba-2's SSD at batch 1 of a 125M model (24 lanes of 64 × 64 on an H200's 132 SMs,
    ``probes.launches``): the pieces' sweeps in segments, but the reverse sweep with the dual
    output and the row dots (one segment a lane) only past ``HOPPER_DUAL_PIECES_SHARE``: dV's and
    dC's sweeps apart in segments, and no launch of one program a lane over the whole sequence;
    with ``HOPPER_DUAL_ROWS_ANY_LANES`` that launch (measured slower, notes/gates.md)."""
    from leetrepro.compat import mamba_chunk_scan_combined
    from leetrepro.methods.chunk import tables
    from leetrepro.probes import launches
    # (the Hopper launches' segment, dual output and rows)
    _hopper_launches_as(monkeypatch, lambda a, k: (a["SIZE"][3], bool(k.GATE_GRAD), bool(k.DUAL),
                                                   k.ROWS))
    gen = torch.Generator().manual_seed(0)
    b, n, h = 1, 4096, 24
    x = torch.randn(b, n, h, 64, generator=gen).half().requires_grad_()
    dt = (torch.randn(b, n, h, generator=gen) - 2).requires_grad_()
    A = (-torch.rand(h, generator=gen)).requires_grad_()
    B, C = (torch.randn(b, n, 1, 64, generator=gen).half().requires_grad_() for _ in range(2))
    got = {}
    for any_lanes in (False, True):
        monkeypatch.setattr(tables, "HOPPER_DUAL_ROWS_ANY_LANES", any_lanes)
        recorded = []
        with launches.as_gpu("h200", recorded):
            y = mamba_chunk_scan_combined(x, dt, A, B, C, chunk_size=256, dt_softplus=True,
                                          D=torch.ones(h), method="Chunk")
            recorded.clear()
            y.backward(torch.ones_like(y))
        got[any_lanes] = [x for x in recorded if isinstance(x, tuple)]
    assert got[False] == [(832, True, False, 0), (832, True, False, 0), (832, False, False, 0)]
    assert got[True] == [(832, True, False, 0), (n, True, True, 2)]


def test_the_hopper_pieces_sweeps_take_segments_where_the_switch_says(monkeypatch):
    """A 125M model's layer (48 lanes of 64/64 on an H200's 132 SMs, ``probes.launches``): with
    ``chunk.tables.HOPPER_PIECES_SEGMENTS`` both backward sweeps carrying the gates' pieces split
    each lane's rows into the segments the forward takes (832 rows), at the widest value columns
    (DC 64); without it, one segment a lane, the dB sweep at half the columns (two programs a
    lane) and the dual sweep one program a lane. The forward is the same either way. The switch
    turned within one process (an A/B's) takes effect: the plans are kept per value (the dual
    sweep's signature is the same under both)."""
    from leetrepro.methods.chunk import tables
    from leetrepro.probes import launches
    # (the Hopper launches' rows, segments and columns)
    _hopper_launches_as(monkeypatch, lambda a, k: ("chunk_hopper_kernel", tuple(a["SIZE"]), k.DC,
                                                   bool(k.SPLIT), bool(k.GATE_GRAD), bool(k.DUAL)))
    one = [("chunk_hopper_kernel", (4096, 12, 48, 4096), dc, False, True, dual)
           for dc, dual in ((32, False), (64, True))]
    split = [("chunk_hopper_kernel", (4096, 12, 48, 832), 64, True, True, dual)
             for dual in (False, True)]
    shape = (4, 4096, 12, 64, 64)
    for segments, want in ((False, one), (True, split)):
        monkeypatch.setattr(tables, "HOPPER_PIECES_SEGMENTS", segments)
        got = launches.census("h200", shape, gated=True)
        hopper = [x for x in got["forward"] + got["backward"] if isinstance(x, tuple)]
        assert hopper == [("chunk_hopper_kernel", (4096, 12, 48, 832), 64, True, False, False)] \
            + want
    # (one process: the switch turned between two calls, each backward the value's own plans)
    from leetrepro.compat import chunk_simple_gla
    q, k, v, g = _layer_inputs(4, 4096, 12, 64)
    recorded = []
    with launches.as_gpu("h200", recorded):
        for segments, want in ((False, one), (True, split), (False, one)):
            monkeypatch.setattr(tables, "HOPPER_PIECES_SEGMENTS", segments)
            o = chunk_simple_gla(q, k, v, g=g, method="Chunk")[0]
            recorded.clear()
            o.backward(torch.ones_like(o))
            assert [x for x in recorded if isinstance(x, tuple)] == want, segments


def test_the_packed_mask_reaches_the_gated_bf16_sweeps_whose_scores_are_only_an_operand(
        monkeypatch):
    """``chunk.tables.HOPPER_PACKED_MASK`` (the causal mask as an ``and`` on the rounded scores'
    bits) is a constant of the gated bf16 Hopper sweeps whose masked scores are read only as the
    product's operand (the forward, the reverse sweeps without the dual output), never of the
    dB sweep (its own pairs read them in float32), fp16's (its scaled range reads their
    maximum), γ's, the dual output's or normalised attention's, nor with the switch or the lean
    mask off. ``HOPPER_CUT_SPLIT`` (the exact copies cut from their bits) is one of the bf16
    sweeps carrying the pieces without the dual output (whose O2 reads the hi copy alone), and
    of none with the switch off."""
    import itertools
    from leetrepro.methods.chunk import hopper_constants, tables
    seen = set()
    for packed, lean in ((True, True), (False, True), (True, False)):
        monkeypatch.setattr(tables, "HOPPER_PACKED_MASK", packed)
        monkeypatch.setattr(tables, "HOPPER_LEAN_MASK", lean)
        for dtype, gates, reverse, pieces, dual, rows in itertools.product(
                (torch.bfloat16, torch.float16), *[(False, True)] * 5):
            if (pieces and not gates) or (rows and reverse):
                continue
            k = hopper_constants(r=128, d=64, dtype=dtype, decay=not gates, has_s0=True,
                                 store_sn=True, split=False, reverse=reverse, dual=dual,
                                 gates=gates, gate_grad=pieces, rows=rows)
            want = (packed and lean and gates and dtype == torch.bfloat16 and not dual and
                    not (pieces and not reverse))
            assert bool(k.PACKED_MASK) == want, (packed, lean, dtype, gates, reverse, pieces, dual)
            assert bool(k.CUT_SPLIT) == (pieces and dtype == torch.bfloat16 and not dual)
            seen.add(want)
        k = hopper_constants(r=64, d=128, dtype=torch.bfloat16, decay=False, has_s0=False,
                             store_sn=False, split=False, reverse=False, dual=False, norm=1)
        assert not k.PACKED_MASK
    assert seen == {False, True}
    monkeypatch.setattr(tables, "HOPPER_CUT_SPLIT", False)
    k = hopper_constants(r=64, d=64, dtype=torch.bfloat16, decay=False, has_s0=True,
                         store_sn=True, split=False, reverse=False, dual=False, gates=True,
                         gate_grad=True)
    assert not k.CUT_SPLIT


def test_the_half_pairs_reach_the_db_sweep_whose_own_pairs_come_before_o_s_store(monkeypatch):
    """``chunk.tables.HOPPER_HALF_PAIRS`` (each consumer half the own pairs' columns) is a
    constant of the forward-time sweeps carrying the pieces with E's tiles in the ring and the
    own pairs taken before O's store (Mamba-2's dB sweep, 64 × 128 value columns; 64/64), never
    of the late pairs' (r = d = 128), the reverse sweeps or a sweep without the pieces, nor with
    the switch off."""
    import itertools
    from leetrepro.methods.chunk import hopper_constants, tables
    seen = set()
    for on, (r, d), reverse, pieces in itertools.product(
            (True, False), ((64, 128), (64, 64), (128, 128)), (False, True), (False, True)):
        monkeypatch.setattr(tables, "HOPPER_HALF_PAIRS", on)
        k = hopper_constants(r=r, d=d, dtype=torch.bfloat16, decay=False, has_s0=True,
                             store_sn=True, split=False, reverse=reverse, dual=False, gates=True,
                             gate_grad=pieces)
        want = on and pieces and not reverse and bool(k.E_RING) and not k.LATE_PAIRS
        assert bool(k.HALF_PAIRS) == want, (on, r, d, reverse, pieces)
        seen.add((want, (r, d)))
    assert (True, (64, 128)) in seen and (False, (128, 128)) in seen


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or INTERPRETED, reason="needs a CUDA GPU")
def test_the_packed_mask_gives_the_select_s_bits(monkeypatch):
    """On an sm_90 GPU, ``chunk.tables.HOPPER_PACKED_MASK`` on and off give the same bits: a
    gated bf16 forward and backward (time-major, N past a whole chunk, states in and out) and
    the SSD's forward with V's row weights."""
    from leetrepro.compat import mamba_chunk_scan_combined
    gen = torch.Generator().manual_seed(11)
    x = torch.randn(2, 1000, 8, 64, generator=gen).cuda().bfloat16()
    dt = torch.rand(2, 1000, 8, generator=gen).cuda()
    A = -torch.rand(8, generator=gen).cuda() - 0.5
    B, C = (torch.randn(2, 1000, 1, 128, generator=gen).cuda().bfloat16() for _ in range(2))
    runs = _gated_hopper_runs(monkeypatch, "HOPPER_PACKED_MASK", 11, lambda: (
        mamba_chunk_scan_combined(x, dt, A, B, C, chunk_size=256),))
    for got, want in zip(*runs):
        assert torch.equal(got, want)


def _gated_hopper_runs(monkeypatch, switch: str, seed: int, more=lambda: (),
                       strong_head: int | None = None, inputs: bool = False) -> list:
    """A gated bf16 forward and backward on the Hopper kernel (time-major 2 × 1000 rows × 4
    heads, 128/64, a hard reset, states in and out; ``strong_head``'s gates −3 a row) with
    ``chunk.tables.<switch>`` off and on: for each, the outputs, the gradients and ``more()``'s;
    with ``inputs`` the inputs (q, k, v, g, s0) last."""
    from leetrepro.compat import chunk_simple_gla
    from leetrepro.methods.chunk import hopper_unfit, tables
    gen = torch.Generator().manual_seed(seed)
    b, n, h, dk, dv = 2, 1000, 4, 128, 64
    q, k = (torch.randn(b, n, h, dk, generator=gen).cuda().bfloat16().requires_grad_()
            for _ in range(2))
    v = torch.randn(b, n, h, dv, generator=gen).cuda().bfloat16().requires_grad_()
    g = torch.nn.functional.logsigmoid(torch.randn(b, n, h, generator=gen) + 3)
    if strong_head is not None:
        g[:, :, strong_head] = -3.0
    g[0, 300, 1] = -1e4  # (a hard reset)
    g = g.cuda().requires_grad_()
    s0 = torch.randn(b, h, dk, dv, generator=gen).cuda().requires_grad_()
    if hopper_unfit(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), None, gates=True):
        pytest.skip("the Hopper kernel does not take these operands here")
    runs = []
    for on in (False, True):
        monkeypatch.setattr(tables, switch, on)
        o, s_n = chunk_simple_gla(q, k, v, g=g, initial_state=s0, output_final_state=True)
        grads = torch.autograd.grad((o.float().square().sum() + s_n.square().sum()),
                                    (q, k, v, g, s0))
        runs.append((o, s_n) + grads + tuple(more()))
    return runs + [(q, k, v, g, s0)] if inputs else runs


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or INTERPRETED, reason="needs a CUDA GPU")
@pytest.mark.parametrize("switch", ["HOPPER_CUT_SPLIT", "HOPPER_HALF_PAIRS", "HOPPER_COLUMN_SUMS"])
def test_the_pieces_switches_keep_every_gradient_against_float64(monkeypatch, switch):
    """On an sm_90 GPU, a switch of the sweeps carrying the gates' pieces on against off:
    ``chunk.tables.HOPPER_CUT_SPLIT`` (the exact 16-bit operands cut from the float32 bits, not
    rounded), ``HOPPER_HALF_PAIRS`` (each consumer half the own pairs' columns over every
    column of E) and ``HOPPER_COLUMN_SUMS`` (their columns' sums a column's rows a thread); a
    gated bf16 forward and backward (gates −3 a row on one head, a hard reset,
    states in and out); every output and gradient finite, within 2e-3 of the switch off's, and
    each no further from float64 than it is (to 1.2×, at least 1e-4: the pieces' floor is the
    inputs' rounding either way)."""
    from leetrepro.reference import reference
    *runs, inputs = _gated_hopper_runs(monkeypatch, switch, 12, strong_head=2, inputs=True)
    x = [t.detach().double().requires_grad_() for t in inputs]
    q, k, v, g, s0 = x
    o, s_n = reference(q.transpose(1, 2) * q.shape[-1] ** -0.5, k.transpose(1, 2),
                       v.transpose(1, 2), g=g.transpose(1, 2), initial_state=s0,
                       output_final_state=True)
    o = o.transpose(1, 2)
    ref = (o, s_n) + torch.autograd.grad((o.square().sum() + s_n.square().sum()), x)
    for name, got, want, exact in zip(("o", "s_n", "dq", "dk", "dv", "dg", "ds0"), runs[1],
                                      runs[0], ref):
        assert torch.isfinite(got).all(), name
        got, want, exact = got.detach(), want.detach(), exact.detach()
        apart = rel_error(got, want.double())  # (the denominator in float64, as the others')
        err, floor = rel_error(got, exact), rel_error(want, exact)
        assert apart <= 2e-3, (name, apart)
        assert err <= max(1.2 * floor, 1e-4), (name, err, floor)


def test_the_column_sums_come_with_the_half_pairs_and_leave_with_e_s_ring(monkeypatch):
    """``chunk.tables.HOPPER_COLUMN_SUMS`` is a constant of the sweeps that take the half pairs
    (Mamba-2's dB sweep) and of no other; a launch that gives E's tiles' ring up for shared
    memory (``HopperLaunch._without_ring``) gives up the half pairs and their column sums with
    it, whose operands are E's both tiles in that ring."""
    from leetrepro.methods.chunk import hopper_constants, tables
    from leetrepro.methods.chunk.hopper_launch import HopperLaunch
    monkeypatch.setattr(tables, "HOPPER_COLUMN_SUMS", True)
    for half in (True, False):
        monkeypatch.setattr(tables, "HOPPER_HALF_PAIRS", half)
        for (r, d), reverse in (((64, 128), False), ((64, 128), True), ((128, 128), False)):
            k = hopper_constants(r=r, d=d, dtype=torch.bfloat16, decay=False, has_s0=True,
                                 store_sn=True, split=False, reverse=reverse, dual=False,
                                 gates=True, gate_grad=True)
            assert k.COL_SUMS == k.HALF_PAIRS == (half and (r, d, reverse) == (64, 128, False))
    monkeypatch.setattr(tables, "HOPPER_HALF_PAIRS", True)
    k = hopper_constants(r=64, d=128, dtype=torch.bfloat16, decay=False, has_s0=True,
                         store_sn=True, split=False, reverse=False, dual=False, gates=True,
                         gate_grad=True)
    h = HopperLaunch(units=1, grid=(1,), size=(64, 1, 1, 64), consts=k,
                     blocks=(64, 64, 64, 64, 64, None), layouts=(None,) * 6, serial=0)
    seen = []
    while h._without_ring():
        seen.append((h.consts.G_RING, h.consts.E_RING, h.consts.HALF_PAIRS, h.consts.COL_SUMS))
    assert seen[-1] == (False, False, False, False) and h.blocks[4] is None
    assert all(c[2] == c[3] == c[1] for c in seen)


def test_the_lean_mask_reaches_every_gated_hopper_launch_and_no_other(monkeypatch):
    """``chunk.tables.HOPPER_LEAN_MASK`` (the gated mask's ``ex2.approx.ftz`` and the own pairs
    without a select) is a constant of every Hopper launch of a gated call, forward and backward,
    as the switch says when the call is made: turned between calls in one process (an A/B's),
    each value has its own plans. No launch of a call with the per-head decay has it (γ's
    kernels keep their bits: notes/gates.md)."""
    from leetrepro.compat import chunk_simple_gla
    from leetrepro.methods.chunk import tables
    from leetrepro.probes import launches
    _hopper_launches_as(monkeypatch, lambda a, k: (bool(k.HAS_GATE), bool(k.LEAN_MASK)))
    q, k, v, g = _layer_inputs(2, 1000, 4, 64)
    recorded = []
    with launches.as_gpu("h200", recorded):
        for lean in (True, False, True):
            monkeypatch.setattr(tables, "HOPPER_LEAN_MASK", lean)
            for decay in (dict(g=g), dict(g_gamma=torch.full((4,), -0.05))):
                recorded.clear()
                o = chunk_simple_gla(q, k, v, method="Chunk", **decay)[0]
                o.backward(torch.ones_like(o))
                hopper = [x for x in recorded if isinstance(x, tuple)]
                gated = "g" in decay
                assert len(hopper) >= (3 if gated else 1), hopper
                assert set(hopper) == {(gated, gated and lean)}, (lean, decay.keys(), hopper)
