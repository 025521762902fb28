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
    if method == "Chunk" and torch.cuda.is_available() is False:
        dtype = torch.float32          # the interpreted kernel: fp32 (ieee products not needed)
    else:
        dtype = torch.float64 if method != "Chunk" else torch.float32
    model = build(name, config(name, tiny=True)).to(dtype)
    lengths = [7, 1, 12]
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 100, (n,), generator=gen) for n in lengths]
    cu = torch.tensor([0, 7, 8, 20], dtype=torch.int32)
    assert positions_of(cu).tolist() == list(range(7)) + [0] + list(range(12))
    pools = model.state_pools(5, "cpu")
    slots = torch.tensor([3, 0, 4], dtype=torch.int32)
    tokens = prefill(model, torch.cat(prompts)[None], cu, pools, slots, method)
    seqs = [p.tolist() + [t] for p, t in zip(prompts, tokens.tolist())]
    for step in range(3):
        positions = torch.tensor([len(s) - 1 for s in seqs])
        tokens = decode(model, tokens, positions, pools, slots, method)
        for s, t in zip(seqs, tokens.tolist()):
            s.append(t)
    ref_method = "reference" if name == "transnormer" else "LA_torch"
    for s in seqs:  # the whole sequence, one forward pass each, greedy at every generated position
        ids = torch.tensor(s)
        for cut in range(len(s) - 4, len(s)):
            assert _greedy_full(model, ids[:cut], ref_method).item() == s[cut]
