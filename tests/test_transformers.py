"""transformers' Mamba-2 family on this project (``leetrepro.integrations.transformers``): tiny
configurations with random weights, the same model with and without :func:`enable`, in float32
on the CPU (transformers' own path is the reference: its chunk scan computes in float32)."""
import functools
import inspect

import pytest
import torch

from leetrepro.reference import rel_error

from conftest import quick_lane

transformers = pytest.importorskip("transformers")
lt = pytest.importorskip("leetrepro.integrations.transformers")

#: the comparisons against transformers' own path hold for the release the integration was
#: tested with (5.17's Mamba-2, say, normalises all channels at once outside the fused call)
on_tested_release = pytest.mark.skipif(
    ".".join(transformers.__version__.split(".")[:2]) != lt.TESTED,
    reason=f"transformers {transformers.__version__}: the comparisons need {lt.TESTED}")

TOL = 2e-4  # (float32 both ways, different summation orders over chunks of 16 rows)


#: a tiny configuration of each family: 8 heads of 16, d_state 16, 2 groups, chunks of 16, one
#: Mamba-2 layer and (in the hybrids) an attention layer
CONFIGS = {
    "mamba2": lambda: transformers.Mamba2Config(
        vocab_size=97, hidden_size=64, num_heads=8, head_dim=16, state_size=16, n_groups=2,
        num_hidden_layers=2, chunk_size=16, expand=2, conv_kernel=4),
    "zamba2": lambda: transformers.Zamba2Config(
        vocab_size=97, hidden_size=64, num_hidden_layers=2, layers_block_type=["mamba", "hybrid"],
        mamba_d_state=16, mamba_ngroups=2, mamba_expand=2, n_mamba_heads=8,
        num_attention_heads=4, num_key_value_heads=4, intermediate_size=64, chunk_size=16,
        use_mem_rope=False, num_mem_blocks=1),
    "falcon_h1": lambda: transformers.FalconH1Config(
        vocab_size=97, hidden_size=64, num_hidden_layers=2, mamba_d_ssm=128, mamba_d_state=16,
        mamba_d_head=16, mamba_n_groups=2, mamba_expand=2, mamba_n_heads=8,
        num_attention_heads=4, num_key_value_heads=2, intermediate_size=64, mamba_chunk_size=16),
    "bamba": lambda: transformers.BambaConfig(
        vocab_size=97, hidden_size=64, num_hidden_layers=2, mamba_d_state=16, mamba_d_head=16,
        mamba_n_groups=2, mamba_expand=2, mamba_n_heads=8, num_attention_heads=4,
        num_key_value_heads=2, intermediate_size=64, mamba_chunk_size=16, attn_layer_indices=[1]),
    "granitemoehybrid": lambda: transformers.GraniteMoeHybridConfig(
        vocab_size=97, hidden_size=64, num_hidden_layers=2, mamba_d_state=16, mamba_d_head=16,
        mamba_n_groups=2, mamba_expand=2, mamba_n_heads=8, num_attention_heads=4,
        num_key_value_heads=2, intermediate_size=64, mamba_chunk_size=16,
        layer_types=["mamba", "attention"], num_local_experts=2, num_experts_per_tok=1,
        shared_intermediate_size=64),
    "nemotron_h": lambda: transformers.NemotronHConfig(
        vocab_size=97, hidden_size=64, num_hidden_layers=3, ssm_state_size=16, mamba_head_dim=16,
        n_groups=2, mamba_num_heads=8, expand=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, intermediate_size=64, chunk_size=16, hybrid_override_pattern="M*-"),
}


def _model(family="mamba2", seed=0):
    torch.manual_seed(seed)
    return transformers.AutoModelForCausalLM.from_config(CONFIGS[family]()).float()


def _mamba2(seed=0):
    return _model("mamba2", seed)


@pytest.fixture
def restored():
    yield
    lt.disable()


def _step(model, ids, **kwargs):
    """Logits, loss and every parameter's gradient of one training step on ids."""
    model.zero_grad(set_to_none=True)
    out = model(ids, labels=ids, use_cache=False, **kwargs)  # (no cache: the fused training call)
    out.loss.backward()
    return out.logits.detach(), out.loss.detach(), \
        {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


@on_tested_release
@pytest.mark.parametrize("family", quick_lane(list(lt.FAMILIES)))
@pytest.mark.parametrize("train", [True, False])
def test_each_family_trains_as_transformers_own_path(restored, monkeypatch, family, train):
    """Training mode takes the fused split-conv-scan call where the family makes it (None in
    transformers' fallback, so its unfused path is the reference); eval mode the convolution
    and the chunk scan apart: logits, loss and every gradient as transformers' own path, and
    the scan was this project's."""
    calls = []
    for name, fn in list(lt._OURS.items()):
        monkeypatch.setitem(lt._OURS, name,
                            lambda *a, _fn=fn, _n=name, **k: calls.append(_n) or _fn(*a, **k))
    ref_model = _model(family)
    model = _model(family)
    model.load_state_dict(ref_model.state_dict())
    ref_model.train(train)
    model.train(train)
    ids = torch.randint(0, 97, (2, 45), generator=torch.Generator().manual_seed(1))
    want = _step(ref_model, ids)
    assert lt.enable(family) == [family]
    got = _step(model, ids)
    assert rel_error(got[0], want[0]) <= TOL and rel_error(got[1], want[1]) <= TOL
    assert got[2].keys() == want[2].keys()
    for name in want[2]:
        assert rel_error(got[2][name], want[2][name]) <= 10 * TOL, name
    assert "mamba2_chunk_scan" in calls or (train and "mamba2_split_conv1d_scan_combined" in calls)


@on_tested_release
@pytest.mark.parametrize("family", quick_lane(list(lt.FAMILIES)))
def test_each_family_generates_the_same_tokens(restored, family):
    """``generate`` (the prompt through the chunk scan with its final state, then one token at a
    time through the convolution's update and the state update) gives transformers' tokens."""
    model = _model(family).eval()
    ids = torch.randint(0, 97, (2, 13), generator=torch.Generator().manual_seed(2))
    kw = dict(max_new_tokens=8, do_sample=False, pad_token_id=0)
    want = model.generate(ids, **kw)
    lt.enable(family)
    got = model.generate(ids, **kw)
    assert torch.equal(got, want)


@on_tested_release
@pytest.mark.slow  # (a compilation)
def test_a_compiled_model_trains_as_eager(restored):
    """``torch.compile`` of a Mamba-2 model with the integration enabled: loss and gradients as
    eager's (the operator's custom ops in the graph)."""
    model = _mamba2()
    lt.enable("mamba2")
    ids = torch.randint(0, 97, (2, 45), generator=torch.Generator().manual_seed(3))
    want = _step(model, ids)
    compiled = torch.compile(model, backend="aot_eager")
    got = _step(compiled, ids)
    assert rel_error(got[1], want[1]) <= 1e-5
    for name in want[2]:
        key = name if name in got[2] else f"_orig_mod.{name}"
        assert rel_error(got[2][key], want[2][name]) <= 1e-4, name


@on_tested_release
@pytest.mark.slow
def test_packed_sequences_train_as_each_alone(restored):
    """Two sequences packed into one row with ``seq_idx`` (which transformers' fallback refuses):
    the hidden states as each sequence alone, in training mode (fused call) and eval mode, and
    their gradients. (Mamba2ForCausalLM does not pass its keyword arguments on to its backbone in
    5.24: the backbone takes seq_idx.)"""
    model = _mamba2().backbone
    a, b = (torch.randint(0, 97, (1, n), generator=torch.Generator().manual_seed(n))
            for n in (21, 30))
    seq_idx = torch.cat([torch.zeros(1, 21), torch.ones(1, 30)], 1).int()
    # (a random projection: the squares' sum of RMS-normalised states is nearly constant, its
    # gradient cancellation)
    proj = torch.randn(1, 51, 64, generator=torch.Generator().manual_seed(5))
    lt.enable("mamba2")
    for train in (True, False):
        model.train(train)
        model.zero_grad(set_to_none=True)
        alone = torch.cat([model(a).last_hidden_state, model(b).last_hidden_state], 1)
        (alone * proj).sum().backward()
        want = [p.grad.clone() for p in model.parameters()]
        model.zero_grad(set_to_none=True)
        packed = model(torch.cat([a, b], 1), seq_idx=seq_idx).last_hidden_state
        (packed * proj).sum().backward()
        assert rel_error(packed, alone) <= TOL, train
        for g, w in zip((p.grad for p in model.parameters()), want):
            assert rel_error(g, w) <= 10 * TOL, train


@on_tested_release
@pytest.mark.slow
def test_the_causal_lm_hands_packed_sequences_to_its_backbone(restored):
    """5.24's ``Mamba2ForCausalLM`` drops its keyword arguments: a ``seq_idx`` given to it ran
    the packed batch as one sequence, silently. Enabled, its logits (eval) and its loss's
    gradients (training, the fused call) are each sequence's alone; disabled, its own forward
    is back."""
    model = _mamba2()
    forward = type(model).forward
    a, b = (torch.randint(0, 97, (1, n), generator=torch.Generator().manual_seed(n))
            for n in (21, 30))
    ids = torch.cat([a, b], 1)
    seq_idx = torch.cat([torch.zeros(1, 21), torch.ones(1, 30)], 1).int()
    lt.enable("mamba2")
    assert type(model).forward is not forward
    model.eval()
    with torch.no_grad():
        alone = torch.cat([model(a).logits, model(b).logits], 1)
        assert rel_error(model(ids, seq_idx=seq_idx).logits, alone) <= TOL
        assert rel_error(model(ids).logits, alone) > 100 * TOL  # (without it: one sequence)
    model.train()
    proj = torch.randn(1, 51, 97, generator=torch.Generator().manual_seed(5))
    (torch.cat([model(a).logits, model(b).logits], 1) * proj).sum().backward()
    want = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    (model(ids, seq_idx=seq_idx).logits * proj).sum().backward()
    for g, w in zip((p.grad for p in model.parameters()), want):
        assert rel_error(g, w) <= 10 * TOL
    lt.disable()
    assert type(model).forward is forward


def test_enable_warns_of_another_release_and_of_a_norm_over_all_channels(restored, monkeypatch):
    """:func:`enable` warns of another transformers release than :data:`TESTED`, naming it;
    where a family's gated norm takes no groups (5.17's Mamba-2), the warning says training and
    evaluation then differ; the tested release warns of nothing."""
    import warnings
    mod = lt._module("mamba2")

    class WholeRowNormGated(torch.nn.Module):  # (5.17's signature)
        def __init__(self, hidden_size, eps=1e-6):
            super().__init__()

    class GroupedNormGated(torch.nn.Module):  # (the tested release's, whatever is installed)
        def __init__(self, hidden_size, group_size=None, eps=1e-6):
            super().__init__()
    monkeypatch.setattr(mod, "MambaRMSNormGated", GroupedNormGated, raising=False)
    with pytest.warns(UserWarning, match=r"tested with transformers .*not 5\.17\.0$"):
        lt._warn_of_release({"mamba2": mod}, "5.17.0")
    monkeypatch.setattr(mod, "MambaRMSNormGated", WholeRowNormGated, raising=False)
    with pytest.warns(UserWarning, match=r"mamba2 \(MambaRMSNormGated\) normalises all channels"):
        lt._warn_of_release({"mamba2": mod}, "5.17.0")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        lt._warn_of_release({"mamba2": mod}, lt.TESTED + ".1")


def test_the_families_are_every_one_that_calls_mamba_2_s_kernels():
    """:data:`FAMILIES` is every modeling file of the installed transformers that routes
    Mamba-2's chunk scan through the hub (read as text: importing them all is slow), so a
    family added by a new release is named here."""
    import glob
    import os
    root = os.path.join(os.path.dirname(transformers.__file__), "models")
    calls = set()
    for path in glob.glob(os.path.join(root, "*", "modeling_*.py")):
        with open(path, encoding="utf-8") as f:
            if '("mamba_chunk_scan_combined", "mamba_ssm")' in f.read():
                calls.add(os.path.basename(os.path.dirname(path)))
    assert calls == set(lt.FAMILIES)


def test_enable_names_what_it_cannot_patch(restored, monkeypatch):
    """A family outside :data:`FAMILIES` is refused by name; a modeling module without one of
    the patched names (another release) raises, naming it, and patches nothing."""
    with pytest.raises(ValueError, match="unknown families"):
        lt.enable("llama")
    mod = lt._module("mamba2")
    before = mod.mamba2_chunk_scan
    monkeypatch.delattr(mod, "causal_conv1d_update")
    with pytest.raises(RuntimeError, match="causal_conv1d_update"):
        lt.enable("mamba2")
    assert mod.mamba2_chunk_scan is before


@pytest.mark.slow
def test_the_benchmark_s_machinery_writes_a_row_per_cell(restored, monkeypatch):
    """``bench.hf.measure`` on the CPU with a tiny model: a training row and the generation rows
    for each entry this host has, in order; an entry whose peer is absent is a row saying so;
    the entries take turns on one model (interleaved); an entry that raises is a row with its
    error and the others go on; one whose training raised still generates."""
    from leetrepro.bench import hf
    routed = []
    real_route = hf._route
    monkeypatch.setattr(hf, "_route", lambda f, e, p: routed.append(e) or real_route(f, e, p))
    kw = dict(reps=1, train=dict(batch=2, seq=24), prompt=6, new_tokens=3, batches=(1, 2),
              dtype=torch.float32)
    rows = hf.measure("mamba2", CONFIGS["mamba2"](), ["leetrepro", "fallback", "mamba_ssm"],
                      torch.device("cpu"), **kw)
    got = [(r["entry"], r["what"], r.get("batch"), r["status"]) for r in rows]
    assert got == [(e, w, b, "ok") for e in ("leetrepro", "fallback")
                   for w, b in (("train", 2), ("generate", 1), ("generate", 2))] + \
        [("mamba_ssm", "train", None, "not installed")]
    for r in rows[:-1]:
        assert r["ms"] > 0 and r["tokens_per_s"] > 0
    assert not lt._SAVED  # (each entry's routing undone)
    # (after the probe of which entries are present: leetrepro and fallback in turn, every call:
    # reps + 2 training steps, and reps + 1 generate calls a batch)
    turns = routed[3:]
    assert len(turns) == 2 * (3 + 2 * 2) and turns == ["leetrepro", "fallback"] * (len(turns) // 2)

    def broken(*args, **kwargs):
        raise RuntimeError("a peer that fails")
    rows = hf.measure("mamba2", CONFIGS["mamba2"](), ["leetrepro", "mamba_ssm"],
                      torch.device("cpu"), peer_functions={"mamba2_chunk_scan": broken,
                                                           "mamba2_selective_state_update": broken},
                      **kw)
    got = [(r["entry"], r["what"], r["status"][:40]) for r in rows]
    assert got[:3] == [("leetrepro", w, "ok") for w in ("train", "generate", "generate")]
    assert got[3:] == [("mamba_ssm", w, "error: RuntimeError: a peer that fails")
                       for w in ("train", "generate", "generate")]

    torch_scan = inspect.unwrap(lt._module("mamba2").mamba2_chunk_scan)

    @functools.wraps(torch_scan)  # (its signature: the keywords transformers hands on)
    def fails_training(*args, **kwargs):  # (the scan raises with gradients, as an OOM would)
        if torch.is_grad_enabled():
            raise RuntimeError("out of memory")
        return torch_scan(*args, **kwargs)
    rows = hf.measure("mamba2", CONFIGS["mamba2"](), ["leetrepro", "mamba_ssm"],
                      torch.device("cpu"), peer_functions={
                          "mamba2_chunk_scan": fails_training,
                          "mamba2_selective_state_update": inspect.unwrap(
                              lt._module("mamba2").mamba2_selective_state_update)}, **kw)
    got = [(r["entry"], r["what"], r["status"][:30]) for r in rows]
    assert got[3:] == [("mamba_ssm", "train", "OOM")] + \
        [("mamba_ssm", "generate", "ok")] * 2


def test_the_benchmark_s_entries_are_what_they_say_whatever_transformers_resolved(restored,
                                                                                monkeypatch):
    """transformers resolves each name when its modeling module is imported: to mamba_ssm's
    kernels where mamba_ssm imports then (the peer's source the bench registers counts, which
    once made the ``fallback`` rows mamba_ssm's). ``bench.hf._route`` sets every name itself:
    ``fallback`` the PyTorch references, ``mamba_ssm`` the peer's scan and state update (the
    rest PyTorch's), each called as transformers calls what it resolved (keywords the function
    does not name dropped: Zamba2's mixer hands ``position_embeddings`` on); both undone."""
    from leetrepro.bench import hf
    mod = lt._module("zamba2")
    own = {n: getattr(mod, n) for n in lt.NAMES}
    torch_fns = {n: inspect.unwrap(f) for n, f in own.items()}
    assert all(f.__module__ == mod.__name__ for f in torch_fns.values())

    def resolved(fn):  # (as transformers wraps what it found installed)
        @functools.wraps(fn)
        def kernel(*args, **kwargs):
            raise AssertionError("the module's resolved kernel was called")
        return kernel
    for n, f in torch_fns.items():
        monkeypatch.setattr(mod, n, resolved(f))
    assert hf._route("zamba2", "fallback", None)
    assert {n: inspect.unwrap(getattr(mod, n)) for n in lt.NAMES} == torch_fns

    seen = []

    def scan(x, dt, A, B, C, chunk_size, D=None):  # (a peer naming fewer keywords)
        seen.append((chunk_size, D))
        return x
    assert not hf._route("zamba2", "mamba_ssm", None)  # (no peer: not present)
    assert hf._route("zamba2", "mamba_ssm", {"mamba2_chunk_scan": scan,
                                             "mamba2_selective_state_update": len})
    assert mod.mamba2_chunk_scan(1, 2, 3, 4, 5, chunk_size=8, D=9, position_embeddings=0,
                                 dt_softplus=True) == 1
    assert seen == [(8, 9)]
    assert inspect.unwrap(mod.mamba2_selective_state_update) is len
    assert inspect.unwrap(mod.causal_conv1d_fn) is torch_fns["causal_conv1d_fn"]
    lt.disable()
    assert all(inspect.unwrap(getattr(mod, n)) is torch_fns[n] for n in lt.NAMES)
    assert not lt._SAVED


@pytest.mark.slow
def test_the_benchmark_s_models_build():
    """``bench.hf.MODELS``' configurations build (on the meta device: no weights), 0.5-2.5B
    parameters each, with Mamba-2 layers."""
    from leetrepro.bench import hf
    for family, make in hf.MODELS.items():
        with torch.device("meta"):
            model = transformers.AutoModelForCausalLM.from_config(make(transformers))
        params = sum(p.numel() for p in model.parameters())
        assert 0.5e9 < params < 2.5e9, family
        assert any("mixer" in n or "mamba" in n for n, _ in model.named_modules()), family


@on_tested_release
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("family", ["mamba2", "zamba2", "falcon_h1"])
def test_each_family_trains_on_the_gpu_as_transformers_own_path(restored, monkeypatch, family):
    """On a GPU (this project's kernels: the fused split-conv-scan, the convolution, the norm,
    the SSD), in float32 weights with tf32 off: the loss and every gradient as transformers'
    fallback, and ``generate``'s tokens (the state update's kernel)."""
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    ref_model = _model(family).cuda()
    model = _model(family).cuda()
    model.load_state_dict(ref_model.state_dict())
    ids = torch.randint(0, 97, (2, 300), generator=torch.Generator().manual_seed(1)).cuda()
    want = _step(ref_model.train(), ids)
    prompt = ids[:, :13]
    kw = dict(max_new_tokens=8, do_sample=False, pad_token_id=0)
    want_tokens = ref_model.eval().generate(prompt, **kw)
    lt.enable(family)
    got = _step(model.train(), ids)
    assert rel_error(got[1], want[1]) <= 1e-3  # (the kernels' tf32 products)
    for name in want[2]:
        assert rel_error(got[2][name], want[2][name]) <= 5e-3, name
    assert torch.equal(model.eval().generate(prompt, **kw), want_tokens)
