"""B and C shared by groups of heads (Mamba-2's grouped B and C, grouped-query attention): every
method forward and backward against the float64 oracle, the gradients summed over each group's
heads; Chunk reads a group's rows in place (its kernel takes each tensor's head through its
group, no expanded copy), the others get them expanded; the custom op; the errors. The Chunk
kernel runs under Triton's interpreter without a GPU."""
import pytest
import torch

from leetrepro import causal_linear_decoder, reference, rel_error
from leetrepro import ops
from leetrepro.registry import methods

from conftest import KERNEL_DEVICE, make_inputs, patch_package, quick_lane, random_gammas

OPTIONS = {"Bb": dict(block_size=16), "LA_torch": dict(block_size=16), "Recur": dict(base=8),
           "Chunk": dict(fp32_precision="ieee")}
HEADS, GROUPS = 4, 2


def _device(abbr):
    return KERNEL_DEVICE if abbr == "Chunk" else "cpu"


def _grouped(batch, n, r, d, seed, device):
    """B, C of GROUPS heads and V of HEADS, the per-token gates of HEADS."""
    B, C, _ = make_inputs(batch, GROUPS, n, r, d, device=device, seed=seed)
    V = make_inputs(batch, HEADS, n, r, d, device=device, seed=seed + 1)[2]
    gen = torch.Generator().manual_seed(seed + 2)
    g = torch.nn.functional.logsigmoid(torch.randn(batch, HEADS, n, generator=gen) * 2)
    return B, C, V, g.to(device)


def test_only_chunk_reads_groups_in_place():
    assert {m.abbr for m in methods() if m.groups} == {"Chunk"}


@pytest.mark.parametrize("abbr", quick_lane(["Chunk", "LA_torch", "Vanilla", "Bb", "Recur",
                                             "Cdotp_torch", "FA_torch"]))
@pytest.mark.parametrize("gated", quick_lane([True, False], keep=(1,)), ids=["gates", "gamma"])
def test_forward_and_gradients_against_the_oracle(abbr, gated, monkeypatch):
    m = next(x for x in methods() if x.abbr == abbr)
    if gated and not m.gates:
        pytest.skip(f"{abbr} takes no gates (test_gates.py says why)")
    if abbr == "Chunk":  # read in place: never an expanded copy
        def refuse(x, heads):
            if x is not None and x.shape[1] != heads:
                raise AssertionError("Chunk expanded a group")
            return x
        patch_package(monkeypatch, ops, "expand_groups", refuse)
    dev = _device(abbr)
    B, C, V, g = _grouped(2, 77, 8, 6, seed=21, device=dev)
    gam = random_gammas(HEADS, 22).to(dev)
    g = g if gated else None
    leaves = [t.clone().requires_grad_() for t in (B, C, V)] + \
        ([g.clone().requires_grad_()] if gated else [])
    out = causal_linear_decoder(*leaves[:3], gam, g=leaves[3] if gated else None, method=abbr,
                                **OPTIONS.get(abbr, {}))
    ref = [t.detach().double().requires_grad_() for t in leaves]
    want = reference(*ref[:3], gam, g=ref[3] if gated else None)
    assert rel_error(out, want) <= 1e-5
    dO = torch.randn(want.shape, generator=torch.Generator().manual_seed(23),
                     dtype=torch.float64).to(dev)
    got = torch.autograd.grad((out.double() * dO).sum(), leaves)
    exact = torch.autograd.grad((want * dO).sum(), ref)
    for name, a, b in zip("BCVg", got, exact):
        assert a.shape == b.shape
        tol = 5e-5 if name == "g" else 1e-5
        assert rel_error(a, b) <= tol, f"{abbr} d{name}: {rel_error(a, b):.2e}"


# (the quick lane keeps "CS": the gates' gradient with groups is the oracle test's, above)
@pytest.mark.parametrize("wanted", quick_lane(["BCVgS", "B", "CS", "gV"], keep=(2,)))
@pytest.mark.parametrize("packed", quick_lane([False, True]))
def test_chunk_states_packing_and_subsets_of_gradients(wanted, packed):
    """Initial and final states, packed sequences (an empty one among them), any subset of the
    inputs asked for, time-major B and C read in place."""
    dev = KERNEL_DEVICE
    lengths = [30, 0, 47] if packed else [77]
    batch, n = (1, sum(lengths)) if packed else (2, 77)
    count = len(lengths) if packed else batch
    B, C, V, g = _grouped(batch, n, 8, 6, seed=31, device=dev)
    B, C = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (B, C))  # time-major
    S0 = torch.randn(count, HEADS, 8, 6, generator=torch.Generator().manual_seed(32)).to(dev)
    cu = torch.tensor([0, 30, 30, 77], dtype=torch.int32, device=dev) if packed else None
    names = "BCVgS"
    leaves = [t.clone().requires_grad_(k in wanted) for k, t in zip(names, (B, C, V, g, S0))]
    out, s = causal_linear_decoder(*leaves[:3], g=leaves[3], initial_state=leaves[4],
                                   output_final_state=True, cu_seqlens=cu, method="Chunk",
                                   fp32_precision="ieee")
    ref = [t.detach().double().requires_grad_(k in wanted) for k, t in zip(names, leaves)]
    want_o, want_s = reference(*ref[:3], g=ref[3], initial_state=ref[4], output_final_state=True,
                               cu_seqlens=cu)
    assert rel_error(out, want_o) <= 1e-5 and rel_error(s, want_s) <= 1e-5
    gen = torch.Generator().manual_seed(33)
    dO, dS = (torch.randn(x.shape, generator=gen, dtype=torch.float64).to(dev)
              for x in (want_o, want_s))
    got = torch.autograd.grad((out.double() * dO).sum() + (s.double() * dS).sum(),
                              [t for t in leaves if t.requires_grad])
    exact = torch.autograd.grad((want_o * dO).sum() + (want_s * dS).sum(),
                                [t for t in ref if t.requires_grad])
    for name, a, b in zip([k for k in names if k in wanted], got, exact):
        tol = 5e-5 if name == "g" else 1e-5
        assert rel_error(a, b) <= tol, f"d{name}: {rel_error(a, b):.2e}"


def test_groups_that_do_not_divide_the_heads_are_an_error():
    B, C, V = make_inputs(1, 3, 8, 4, 4)
    V4 = make_inputs(1, 4, 8, 4, 4)[2]
    with pytest.raises(ValueError, match="groups dividing"):
        causal_linear_decoder(B, C, V4)
    with pytest.raises(ValueError, match="heads"):
        causal_linear_decoder(B, C[:, :1], V)


@pytest.mark.slow  # seconds: the op's schema, fake tensor and autograd checks
def test_opcheck_with_groups():
    from leetrepro.ops import causal_linear
    B, C, V, g = _grouped(2, 21, 4, 5, seed=41, device="cpu")
    on = [t.to(KERNEL_DEVICE) for t in (B, C, V)]  # (Chunk on its kernels' device)
    for args in [(B, C, V, None, None, "LA_torch", "", False, True, None, 1.0, True, g),
                 (*on, None, None, "Chunk", '{"fp32_precision": "ieee"}', False, False,
                  None, 1.0, True, None)]:
        args = tuple(a.clone().requires_grad_() if isinstance(a, torch.Tensor) else a
                     for a in args)
        torch.library.opcheck(causal_linear, args)
