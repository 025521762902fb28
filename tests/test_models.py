"""The LLM blocks of Tables 7-8 on tiny shapes: every attention path gives the float64 reference
path's hidden states; the stored prompt set and how batches are formed."""
import pytest
import torch

from leetrepro.models import build, config
from leetrepro.bench.llm import batches, load_prompts, make_prompt_lengths

PATHS = ["original", "Vanilla", "Bb", "Cdotp_torch", "Recur", "LA_torch", "FA_torch"]


@pytest.mark.parametrize("name", ["transnormer", "retnet"])
def test_every_attention_path_matches_the_reference_path(name):
    model = build(name, tiny=True).double().eval()
    ids = torch.randint(1, 100, (2, 150), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = model(ids, "reference")
        for path in PATHS:
            out = model(ids, path)
            err = ((out - ref).norm() / ref.norm()).item()
            # RetNet's own path normalises scores before the group norm, which removes that scale
            # up to the norm's eps; TransNormerLLM's own loop keeps an fp32 state
            assert err < (1e-4 if path == "original" else 1e-10), (path, err)


def test_published_shapes_and_layer_specifics():
    t = config("transnormer")
    assert (t["dim"], t["heads"], t["glu_dim"], t["vocab"], t["layers"]) == (4096, 32, 11008, 64000, 2)
    r = config("retnet")
    assert (r["dim"], r["heads"], r["ffn_dim"], r["value_factor"]) == (2048, 8, 4096, 2)
    m = build("transnormer", tiny=True)
    a0, a1 = m.layers[0].attn, m.layers[1].attn
    assert a0.lrpe and not a1.lrpe                      # LRPE on the first layer: r = 2·d_head
    assert torch.all(a1.gamma > a0.gamma) and torch.all(a0.gamma < 1)  # deeper layers decay less


def test_prompt_set_and_batches():
    p = load_prompts()
    assert p.equals(make_prompt_lengths())  # the stored set is the seeded one
    assert len(p) == 100 and p.length.between(6000, 8192).all() and p.token_seed.is_unique
    small = load_prompts(3, max_len=50)
    b = batches(small, 2, vocab=100, device="cpu")
    assert [t.shape for t in b] == [(2, 50), (1, 50)]
    assert (b[0] > 0).all()  # prompts of equal (cut) length: no padding
    b1 = batches(load_prompts(2), 2, vocab=100, device="cpu")[0]
    short = int(load_prompts(2).length.min())
    row = int(load_prompts(2).length.argmin())
    assert (b1[row, short:] == 0).all() and (b1[row, :short] > 0).all()  # right-padded with 0


def test_slow_methods_timed_on_a_prefix_scaled_by_tokens(monkeypatch):
    """``set_limit``: a slow linear-time method runs on the first batches only (at least two) and
    its total is scaled by tokens; a quadratic one (Vanilla) always runs the whole set."""
    from leetrepro.bench import llm
    assert llm._timed_batches(1.0, 50, None) == 50
    assert llm._timed_batches(1.0, 50, 100.0) == 50      # fits: the whole set
    assert llm._timed_batches(1.0, 50, 10.0) == 10
    assert llm._timed_batches(100.0, 50, 10.0) == 2      # at least two
    seen = []

    def fake_run(model, method, inputs, device):         # 1 s per token-thousand, recorded
        seen.append((method, len(inputs)))
        return sum(int(t.numel()) for t in inputs) / 1000

    monkeypatch.setattr(llm, "one_run", fake_run)
    df = llm.measure("transnormer", ["LA_torch", "Vanilla"], batch_sizes=(1,), n_prompts=6, runs=2,
                     device="cpu", tiny=True, max_len=None, set_limit=0.5, progress=False)
    tokens = int(load_prompts(6).length.sum())
    for r in df.itertuples():  # scaled to the whole set: the same total either way
        assert r.mean_s == pytest.approx(tokens / 1000)
    la, va = df.set_index("method").loc["LA_torch"], df.set_index("method").loc["Vanilla"]
    assert bool(la.extrapolated) and la.prompts_timed == 2 and not bool(va.extrapolated)
    assert ("LA_torch", 2) in seen and ("Vanilla", 6) in seen


def test_progress_line_prints_a_spread_only_where_there_is_one():
    """One run has no standard deviation: its progress line says "1 run", never "± nan"."""
    from leetrepro.bench.llm import _progress
    one = _progress(dict(mean_s=13.25, std_s=float("nan"), runs=1, prompts_timed=70, extrapolated=True))
    assert one == "   13.250 s (1 run, 70 prompts timed, total scaled by tokens)"
    seven = _progress(dict(mean_s=13.25, std_s=0.012, runs=7, prompts_timed=100, extrapolated=False))
    assert seven == "   13.250 s ± 0.012 (7 runs)"


@pytest.mark.parametrize("batch_size", [1, 2])
def test_warm_up_compiles_every_shape_of_the_set(monkeypatch, batch_size):
    """A Triton method's attention runs at every (batch, length) of the set before timing, with
    inputs in the layout the model gives it: a run of one must not time the compiler (Triton
    specialises N on divisibility by 16). PyTorch methods and ``original`` warm up on one batch."""
    from leetrepro.bench import llm
    from leetrepro.models import build
    from leetrepro.reference import reference
    seen = []

    def attention(B, C, V, gamma, method):
        assert method == "LA" and torch.isfinite(B).all() and (B != 0).any()
        seen.append((B.shape[0], B.shape[2], tuple(sorted(range(4), key=lambda i: -B.stride(i)))))
        return reference(B, C, V, gamma).to(V.dtype)

    monkeypatch.setattr(llm, "linear_attention", attention)
    model = build("transnormer", tiny=True).eval()
    g = torch.Generator().manual_seed(0)
    inputs = [torch.randint(1, model.cfg["vocab"], (batch_size, n), generator=g) for n in (33, 40, 17, 40)]
    repeated = llm.warm_up(model, "LA", inputs, "cpu")
    layers = len(model.layers)
    first, again = seen[:layers], seen[layers:]   # the model pass on the first batch, then the rest
    assert {s[:2] for s in first} == {(batch_size, 33)}
    assert sorted({s[:2] for s in again}) == [(batch_size, 17), (batch_size, 40)]
    assert repeated == len(again) == 2 * layers
    assert [s[2] for s in again] == [s[2] for s in first] * 2   # each call's layout, kept
    seen.clear()
    assert llm.warm_up(model, "LA_torch", inputs, "cpu") == 0
    assert llm.warm_up(model, "Original", inputs, "cpu") == 0
    assert seen == []


@pytest.mark.parametrize("name", ["retnet", "transnormer"])
def test_equivalence_holds_each_method_to_its_own_formulation(name):
    """Original is judged against the model's own computation in float64, the operator methods
    against the reference path; the gap between the two formulations is a float64 row of its own,
    reported and not judged (RetNet's differs by design: the score normalisation and the norm's eps)."""
    from leetrepro.bench import llm
    e = llm.equivalence(name, ["Original", "LA_torch", "Vanilla"], n_prompts=2, device="cpu",
                        tiny=True, max_len=300).set_index(["method", "dtype"])
    gap = e.loc[("Original", "float64")]
    assert gap.against == "reference path, float64" and gap.within_tol == "not judged"
    assert 0 <= gap.rel_diff < 1e-3
    assert e.loc[("Original", "float32")].against == "original path, float64"
    assert e.loc[("LA_torch", "float32")].against == "reference path, float64"
    judged = e[e.within_tol != "not judged"]
    assert len(judged) == 3 and (judged.within_tol == "yes").all()
    assert (judged.rel_diff > 0).all() and (judged.rel_diff <= judged.tol).all()


def test_judge_equivalence_fails_a_method_beyond_its_tolerance():
    """A tolerance that can fail: fp32 beyond 1e-4 is NO, tf32 kernels get 5e-3, half 1e-2."""
    import pandas as pd
    from leetrepro.bench.llm import judge_equivalence
    e = judge_equivalence(pd.DataFrame(dict(
        method=["Bb", "LA", "LA", "FA_modify", "Original"],
        dtype=["float32", "float32", "float16", "float32", "float64"],
        rel_diff=[2e-4, 2e-4, 2e-2, 0.5, 3e-4], status="ok")))
    assert e.within_tol.tolist() == ["NO", "yes", "NO", "not judged", "not judged"]
