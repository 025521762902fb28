"""Generation in the paper's two models (tiny shapes, float64): packed prefill and decode steps
give the tokens that running the whole growing sequence through the model gives."""
import pytest
import torch

from leetrepro.models import build, config
from leetrepro.models.generate import decode, positions_of, prefill


def _greedy_full(model, ids, method):
    h = model(ids[None], attention_method=method)
    return (h[0, -1] @ model.embed.weight.t()).argmax(-1)


@pytest.mark.parametrize("name", ["transnormer", "retnet"])
@pytest.mark.parametrize("method", ["LA_torch", "Chunk", "original"])
def test_prefill_then_decode_equals_the_whole_sequence(name, method):
    # Chunk: fp32 (the interpreted kernel on the CPU, the kernel itself on a GPU); else float64
    dtype = torch.float32 if method == "Chunk" else torch.float64
    device = "cuda" if method == "Chunk" and torch.cuda.is_available() else "cpu"
    model = build(name, config(name, tiny=True)).to(device=device, dtype=dtype)
    lengths = [7, 1, 12]
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 100, (n,), generator=gen) for n in lengths]
    cu = torch.tensor([0, 7, 8, 20], dtype=torch.int32)
    assert positions_of(cu).tolist() == list(range(7)) + [0] + list(range(12))
    pools = model.state_pools(5, device)
    slots = torch.tensor([3, 0, 4], dtype=torch.int32, device=device)
    tokens = prefill(model, torch.cat(prompts)[None].to(device), cu.to(device), pools, slots,
                     method)
    seqs = [p.tolist() + [t] for p, t in zip(prompts, tokens.tolist())]
    for step in range(3):
        positions = torch.tensor([len(s) - 1 for s in seqs], device=device)
        tokens = decode(model, tokens, positions, pools, slots, method)
        for s, t in zip(seqs, tokens.tolist()):
            s.append(t)
    ref_method = "reference" if name == "transnormer" else "LA_torch"
    for s in seqs:  # the whole sequence, one forward pass each, greedy at every generated position
        ids = torch.tensor(s, device=device)
        for cut in range(len(s) - 4, len(s)):
            assert _greedy_full(model, ids[:cut], ref_method).item() == s[cut]


@pytest.mark.parametrize("name", ["transnormer", "retnet"])
def test_a_cast_model_keeps_its_decays_in_float64(name):
    """``model.half()`` and friends cast parameters, not the decays: RetNet's γ = 1 − 2⁻¹² is 1.0
    in fp16 (its row normalisation then 0/0); they still follow the model's device."""
    model = build(name, config(name, tiny=True, heads=8))
    exact = {n: b.clone() for n, b in model.named_buffers()}
    for cast in (torch.float16, torch.bfloat16, "meta"):
        moved = model.to(cast)
        for n, b in moved.named_buffers():
            assert b.dtype == torch.float64, (n, cast)
            if cast == "meta":
                assert b.is_meta, n
            else:
                assert torch.equal(b, exact[n]), n


@pytest.mark.parametrize("name", ["transnormer", "retnet"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_generation_is_finite_and_agrees_with_float64(name, dtype):
    """A model in fp16 or bf16 (eight heads: RetNet's decays reach 1 − 2⁻¹²) gives finite logits
    close to the float64 model's, and the same first tokens wherever float64's choice is clear."""
    cfg = config(name, tiny=True, heads=8)
    lengths = [40, 3, 1100]  # (positions past 256: bf16 holds integers exactly only up to 256)
    gen = torch.Generator().manual_seed(1)
    ids = torch.cat([torch.randint(0, cfg["vocab"], (n,), generator=gen) for n in lengths])[None]
    cu = torch.tensor([0, 40, 43, 1143], dtype=torch.int32)
    logits = {}
    for dt in (torch.float64, dtype):
        model = build(name, cfg).to(dt)
        pools = model.state_pools(3, "cpu")
        with torch.no_grad():
            h = model.hidden(ids, _packed(cu, pools, "LA_torch"), positions_of(cu))
            logits[dt] = (h[0, cu[1:].long() - 1] @ model.embed.weight.t()).double()
        # the generation loop's own first tokens, from the same prefill
        first = prefill(model, ids, cu, model.state_pools(3, "cpu"), torch.arange(3), "LA_torch")
        assert torch.equal(first, logits[dt].argmax(-1))
    _agree(logits[dtype], logits[torch.float64], 3e-2)


def _agree(got, ref, bound, some_clear=True):
    """Finite logits within ``bound`` of the float64 model's largest, and the same greedy token
    wherever float64's top two are further apart than twice the error (``some_clear``: and
    somewhere they are)."""
    assert torch.isfinite(got).all()
    err = (got - ref).abs().max().item()
    assert err <= bound * ref.abs().max().item(), err
    top2 = ref.topk(2, -1).values
    clear = (top2[:, 0] - top2[:, 1]) > 2 * err
    assert clear.any() or not some_clear
    assert torch.equal(got.argmax(-1)[clear], ref.argmax(-1)[clear])


def _packed(cu, pools, method):
    from leetrepro.api import causal_linear_decoder

    def attend_for(i):
        def attend(q, k, v, gamma):
            return causal_linear_decoder(q, k, v, gamma, method=method, cu_seqlens=cu)
        return attend
    return attend_for


def test_the_serving_benchmark_loops_generate_the_same_tokens():
    """``bench.serve``'s two generation loops (every prompt decoding together; prompt by prompt
    through one slot, as its batch-1 rows time them) give each prompt the same tokens."""
    from leetrepro.bench.serve import _Batch1, _batched

    model = build("retnet", config("retnet", tiny=True, heads=4)).double()
    gen = torch.Generator().manual_seed(2)
    ids = [torch.randint(0, 100, (n,), generator=gen) for n in (9, 1, 30, 17)]
    _, steps, together = _batched(model, ids, 3, 6, "LA_torch", "cpu")
    assert len(steps) == 5 and together.shape == (4, 6)
    one = _Batch1(model, "LA_torch", "cpu", 4)
    for prompt, expected in zip(ids, together):
        assert torch.equal(one.generate(prompt, 6), expected)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="the published shapes on the GPU kernels")
@pytest.mark.parametrize("name", ["transnormer", "retnet"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_published_models_generate_finite_tokens_on_the_gpu(name, dtype):
    """The published shapes (RetNet's eight heads, γ up to 1 − 2⁻¹²) in fp16/bf16 through the GPU
    kernels, prefill (Chunk, packed) and a decode step: finite logits and states, and the float64
    model's first tokens wherever its choice is clear."""
    lengths = [300, 77, 1200, 5]
    gen = torch.Generator().manual_seed(3)
    vocab = config(name)["vocab"]
    ids = torch.cat([torch.randint(0, vocab, (n,), generator=gen) for n in lengths])[None].cuda()
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32).cuda()
    last = cu[1:].long() - 1
    logits = {}
    for dt, method in ((torch.float64, "LA_torch"), (dtype, "Chunk")):
        model = build(name).to(device="cuda", dtype=dt).eval()
        pools = model.state_pools(4, "cuda")
        with torch.no_grad():
            h = model.hidden(ids, _packed(cu, pools, method), positions_of(cu))
            logits[dt] = (h[0, last] @ model.embed.weight.t()).double()
        if dt != torch.float64:
            slots = torch.arange(4, dtype=torch.int32, device="cuda")
            first = prefill(model, ids, cu, pools, slots, "Chunk")
            assert torch.equal(first, logits[dt].argmax(-1))
            decode(model, first, cu[1:] - cu[:-1], pools, slots, "Chunk")
            assert all(torch.isfinite(p).all() for p in pools)
        del model
    _agree(logits[dtype], logits[torch.float64], 5e-2, some_clear=False)
