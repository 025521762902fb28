"""The public API: the paper's Listing 2, the registry, and a clear error for every bad input."""
import warnings

import pytest
import torch

import leetrepro
from leetrepro import causal_linear_decoder, ops, reference
from leetrepro.methods import available, register, unregister

from conftest import KERNEL_DEVICE, assert_close_to_reference, make_inputs, patch_package, quick_lane


def test_listing2_runs_unchanged_on_cpu():
    batch_size, heads, seqlen, rank = 1, 4, 300, 16
    dim = 24
    B = torch.randn((batch_size, heads, seqlen, rank))
    C = torch.randn((batch_size, heads, seqlen, rank))
    V = torch.randn((batch_size, heads, seqlen, dim))
    gamma = torch.full((heads, 1), 0.9)
    out = causal_linear_decoder(B, C, V)
    assert_close_to_reference(out, B, C, V, None)
    out = causal_linear_decoder(B, C, V, is_mask_weight=True, gamma=gamma)
    assert_close_to_reference(out, B, C, V, gamma)
    out = causal_linear_decoder(B, C, V, attn_method="block-based")
    assert_close_to_reference(out, B, C, V, None)


@pytest.mark.parametrize("gamma", [0.875, torch.tensor(0.875), torch.tensor([0.875]),
                                   torch.full((3,), 0.875), torch.full((3, 1), 0.875),
                                   torch.full((1, 1), 0.875, dtype=torch.float16)])
def test_gamma_shapes_accepted(gamma):  # 0.875 is exact in every float dtype
    B, C, V = make_inputs(2, 3, 20, 4, 5)
    out = causal_linear_decoder(B, C, V, gamma, method="Vanilla")
    torch.testing.assert_close(out.double(), reference(B, C, V, 0.875), rtol=1e-5, atol=1e-5)


def test_python_float_gamma_keeps_double_precision():
    from leetrepro.decay.per_head import normalize_gamma
    assert normalize_gamma(0.9, 2, "cpu")[0].item() == 0.9  # not 0.8999999762 (float32)
    B, C, V = (t.double() for t in make_inputs(1, 1, 200, 4, 4))
    out = causal_linear_decoder(B, C, V, 0.9, method="FA_torch")
    assert_close_to_reference(out, B, C, V, 0.9, tol=1e-12)


def test_abbreviations_and_names_are_interchangeable():
    B, C, V = make_inputs(1, 2, 30, 4, 4)
    for m in leetrepro.methods.methods():
        if m.language == "torch":
            a = causal_linear_decoder(B, C, V, method=m.abbr)
            b = causal_linear_decoder(B, C, V, method=m.name.upper())
            torch.testing.assert_close(a, b)


def test_auto_picks_a_correct_method_on_cpu():
    for n in (1, 128, 129, 500):
        B, C, V = make_inputs(2, 2, n, 8, 4)
        out = causal_linear_decoder(B, C, V, 0.95)
        assert_close_to_reference(out, B, C, V, 0.95)
    assert leetrepro.auto_method(64, torch.float32, torch.device("cpu")).abbr == "Vanilla"
    assert leetrepro.auto_method(4096, torch.float32, torch.device("cpu")).abbr == "LA_torch"


def test_auto_method_reads_the_call_off_its_tensors():
    """``auto_method(B, C, V)``: the method ``method="auto"`` runs for those tensors (once a
    ``torch.device()`` TypeError from inside); anything else is a TypeError saying both forms."""
    for n, kw in ((64, {}), (4096, {}), (4096, dict(state=True)), (4096, dict(gates=True))):
        B, C, V = make_inputs(1, 2, n, 8, 4)
        assert leetrepro.auto_method(B, C, V, **kw) is leetrepro.auto_method(
            n, torch.float32, "cpu", heads=2, r=8, d=4, **kw)
    with pytest.raises(TypeError, match=r"\(n, dtype, device\) or the tensors \(B, C, V\)"):
        leetrepro.auto_method(300)
    with pytest.raises(TypeError, match=r"the tensors \(B, C, V\)"):
        leetrepro.auto_method(B, C)


def test_n_zero_returns_empty_and_non_contiguous_inputs_work():
    B, C, V = make_inputs(2, 3, 0, 4, 5)
    out = causal_linear_decoder(B, C, V, 0.5, method="Bb")
    assert out.shape == (2, 3, 0, 5)
    B, C, V = make_inputs(3, 2, 41, 6, 5)
    Bt = B.transpose(0, 1).contiguous().transpose(0, 1)   # same values, other strides
    Vt = V[..., ::1].transpose(-1, -2).contiguous().transpose(-1, -2)
    assert not Bt.is_contiguous() and not Vt.is_contiguous()
    for m in ("Vanilla", "Bb", "Cdotp_torch", "Recur", "LA_torch", "FA_torch"):
        assert_close_to_reference(causal_linear_decoder(Bt, C, Vt, 0.8, method=m), B, C, V, 0.8)


def test_rank_zero_gives_zeros():
    B, C, V = make_inputs(1, 2, 10, 0, 3)
    assert torch.equal(causal_linear_decoder(B, C, V), torch.zeros_like(V))


def test_method_options_are_checked():
    B, C, V = make_inputs(1, 1, 10, 2, 2)
    with pytest.raises(TypeError, match="block_size"):
        causal_linear_decoder(B, C, V, method="Bb", blocksize=4)


BAD = [
    (lambda: make_inputs(2, 3, 10, 4, 5), dict(V=torch.randn(1, 3, 10, 5)), "batch"),
    (lambda: make_inputs(2, 3, 10, 4, 5), dict(C=torch.randn(2, 4, 10, 4)), "heads"),
    (lambda: make_inputs(2, 3, 10, 4, 5), dict(V=torch.randn(2, 3, 11, 5)), "N"),
    (lambda: make_inputs(2, 3, 10, 4, 5), dict(C=torch.randn(2, 3, 10, 6)), "rank"),
    (lambda: make_inputs(2, 3, 10, 4, 5), dict(B=torch.randn(3, 10, 4)), "4-D"),
]


@pytest.mark.parametrize("make,replace,word", BAD)
def test_shape_errors_name_the_problem_and_the_shapes(make, replace, word):
    B, C, V = make()
    args = {**dict(B=B, C=C, V=V), **replace}
    with pytest.raises(ValueError, match=word) as info:
        causal_linear_decoder(args["B"], args["C"], args["V"])
    assert "(" in str(info.value)  # the shapes are in the message


def test_dtype_and_device_errors():
    B, C, V = make_inputs(1, 2, 8, 3, 3)
    with pytest.raises(TypeError, match="dtype"):
        causal_linear_decoder(B.to(torch.int64), C, V)
    with pytest.raises(TypeError, match="one dtype"):
        causal_linear_decoder(B.double(), C, V)
    with pytest.raises(ValueError, match="device"):
        causal_linear_decoder(B.to("meta"), C, V)


@pytest.mark.parametrize("gamma,word", [
    (torch.full((3,), 0.9), "not broadcastable"), (torch.full((2, 2), 0.9), "not broadcastable"),
    (0.0, r"\(0, 1\]"), (1.5, r"\(0, 1\]"), (-0.1, r"\(0, 1\]"), (float("nan"), "NaN"),
    (torch.tensor([0.5, float("nan")]), "NaN"), (torch.tensor([1, 1]), "floating"),
    ("0.9", "float or a tensor"),
])
def test_gamma_errors(gamma, word):
    B, C, V = make_inputs(1, 2, 8, 3, 3)
    with pytest.raises((ValueError, TypeError), match=word):
        causal_linear_decoder(B, C, V, gamma)


def test_paper_keywords():
    B, C, V = make_inputs(1, 2, 8, 3, 3)
    with pytest.raises(ValueError, match="needs gamma"):
        causal_linear_decoder(B, C, V, is_mask_weight=True)
    with pytest.warns(UserWarning, match="ignored"):
        out = causal_linear_decoder(B, C, V, 0.5, is_mask_weight=False)
    assert_close_to_reference(out, B, C, V, None)
    with pytest.raises(ValueError, match="disagree"):
        causal_linear_decoder(B, C, V, method="Bb", attn_method="Recur")


def test_unknown_method_lists_the_available_ones():
    B, C, V = make_inputs(1, 1, 4, 2, 2)
    with pytest.raises(ValueError, match="available:.*block-based \\(Bb\\)"):
        causal_linear_decoder(B, C, V, method="flash")


def test_unsupported_dtype_or_device_is_an_error():
    @register("fp32-only", abbr="F32", dtypes=[torch.float32], devices=["cuda"])
    def fp32_only(B, C, V, gamma):
        return V

    @register("fp32-cpu", abbr="F32cpu", dtypes=[torch.float32], devices=["cpu"])
    def fp32_cpu(B, C, V, gamma):
        return V
    try:
        B, C, V = make_inputs(1, 1, 4, 2, 2)
        with pytest.raises(ValueError, match="runs on cuda tensors only, and these are on cpu"):
            causal_linear_decoder(B, C, V, method="F32")  # the device is what is wrong
        # the dtype is what is wrong: it says which methods take it here (no "on ['cpu', …]")
        with pytest.raises(ValueError, match=r"does not take torch.float16 inputs: it takes "
                           r"torch.float32; methods that take torch.float16 on cpu: .*Bb") as err:
            causal_linear_decoder(*(t.half() for t in (B, C, V)), method="F32cpu")
        assert "['cpu'" not in str(err.value)
        # a Vanilla call whose N × N matrices cannot fit is refused before it allocates them
        from leetrepro.methods import vanilla
        big = torch.empty(1, 1, 5, 2)
        real = vanilla.free_bytes
        try:
            vanilla.free_bytes = lambda device: 100
            with pytest.raises(MemoryError, match=r"N × N = 5 × 5 .*linear memory"):
                causal_linear_decoder(big.normal_(), big, big, method="Vanilla")
        finally:
            vanilla.free_bytes = real
    finally:
        unregister("F32")
        unregister("F32cpu")


def test_register_a_users_method_and_list_it():
    @register("my-cumsum", abbr="Mine", complexity="O(N r d)")
    def mine(B, C, V, gamma):
        """Delegates to Bb."""
        return causal_linear_decoder(B, C, V, gamma, method="Bb")
    try:
        table = available()
        assert table.loc["my-cumsum", "abbr"] == "Mine"
        assert {"abbr", "complexity", "dtypes", "devices"} <= set(table.columns)
        B, C, V = make_inputs(1, 2, 9, 3, 3)
        assert_close_to_reference(causal_linear_decoder(B, C, V, 0.7, method="mine"), B, C, V, 0.7)
        with pytest.raises(ValueError, match="already registered"):
            register("other", abbr="Mine")(mine)
    finally:
        unregister("my-cumsum")
    assert "my-cumsum" not in available().index


def test_no_warnings_on_the_happy_path():
    B, C, V = make_inputs(1, 2, 8, 3, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        causal_linear_decoder(B, C, V, 0.9)


def test_gamma_cache_sees_new_values_and_in_place_changes():
    from leetrepro.decay.per_head import normalize_gamma
    g = torch.full((3,), 0.5, dtype=torch.float64)
    assert normalize_gamma(g, 3, "cpu").tolist() == [0.5] * 3
    g.fill_(0.25)  # in place: the value key changes
    assert normalize_gamma(g, 3, "cpu").tolist() == [0.25] * 3
    assert normalize_gamma(0.9, 3, "cpu").tolist() == [0.9] * 3
    with pytest.raises(ValueError, match=r"\(0, 1\]"):
        normalize_gamma(torch.full((3,), 1.5), 3, "cpu")


def test_auto_follows_the_dispatch_table(monkeypatch, tmp_path):
    import pandas as pd
    from leetrepro import dispatch, tuning
    table = pd.DataFrame(dict(dtype=["fp32"] * 5, decay=[False] * 4 + [True], batch=[1, 1, 16, 16, 1],
                              N=[128, 8192, 128, 8192, 128],
                              best=["Vanilla", "Bb", "LA_torch", "Recur", "FA"]))
    path = str(tmp_path / "dispatch.csv")
    table.to_csv(path, index=False)
    # the nearest lanes (batch × heads, heads 32 where the table does not say), then the nearest
    # N, on a log scale; the same dtype, mask, r and d; no Chunk time: any win is clear
    assert tuning.dispatch_row(path, 100, 32, "fp32", False) == ("Vanilla", float("inf"))
    assert tuning.dispatch_row(path, 20000, 64, "fp32", False)[0] == "Bb"
    assert tuning.dispatch_row(path, 5000, 12 * 32, "fp32", False)[0] == "Recur"
    assert tuning.dispatch_row(path, 5000, 2 * 128, "fp32", False)[0] == "Recur"  # 256 lanes
    assert tuning.dispatch_row(path, 5000, 12 * 32, "fp32", True)[0] == "FA"
    assert tuning.dispatch_row(path, 5000, 12 * 32, "fp16", False) is None
    assert tuning.dispatch_row(path, 5000, 32, "fp32", False, 64, 64) is None  # r = d = 128 only
    assert tuning.dispatch_row(str(tmp_path / "none.csv"), 5000, 32, "fp32", False) is None
    # where the table names a method, auto takes it; where that cannot run the inputs, the rule
    monkeypatch.setattr(dispatch, "choose", lambda *a, **k: "Bb")
    dispatch.clear_cache()  # auto caches its choices
    assert leetrepro.auto_method(4096, torch.float32, torch.device("cpu")).abbr == "Bb"
    assert leetrepro.auto_method(4096, torch.float32, torch.device("cpu"), state=True).abbr == "LA_torch"
    monkeypatch.setattr(dispatch, "choose", lambda *a, **k: "FA_modify")  # unsafe: never
    dispatch.clear_cache()
    assert leetrepro.auto_method(4096, torch.float32, torch.device("cpu")).abbr == "LA_torch"
    dispatch.clear_cache()


def _table_at(monkeypatch, tmp_path, rows):
    """Auto on a fake CUDA device of tag ``fake``, reading a dispatch table of these rows."""
    import pandas as pd
    from leetrepro import dispatch
    path = tmp_path / "dispatch.csv"
    pd.DataFrame(rows).to_csv(path, index=False)
    monkeypatch.setattr(dispatch, "gpu_tag", lambda device: "fake")
    dispatch.use_table(str(path))


def test_auto_takes_the_table_only_in_its_regime_and_for_a_clear_win(monkeypatch, tmp_path):
    """The table measured forwards of head-major inputs at heads 32, r = d = 128: a call with a
    backward, time-major views or another head shape gets the rule (Chunk); a method other than
    Chunk needs AUTO_MARGIN over Chunk's time in its row."""
    from leetrepro import dispatch
    from leetrepro.dispatch import Call
    row = dict(dtype="bf16", decay=True, batch=1)
    _table_at(monkeypatch, tmp_path, [
        dict(row, N=2048, best="LA", t_LA=1.0, t_Chunk=1.5),   # a clear win
        dict(row, N=8192, best="LA", t_LA=1.0, t_Chunk=1.04),  # inside the margin
        dict(row, N=8192, heads=32, r=64, d=64, best="Bb", t_Bb=1.0, t_Chunk=2.0)])
    try:
        cuda = torch.device("cuda")
        assert dispatch.choose(2048, torch.bfloat16, cuda, Call(decay=True)) == "LA"
        assert dispatch.choose(8192, torch.bfloat16, cuda, Call(decay=True)) == "Chunk"
        for call in (Call(decay=True, grad=True), Call(decay=True, head_major=False),
                     Call(decay=True, r=128, d=64), Call(decay=False)):
            assert dispatch.choose(2048, torch.bfloat16, cuda, call) is None, call
        assert dispatch.choose(8192, torch.bfloat16, cuda, Call(decay=True, r=64, d=64)) == "Bb"
        assert dispatch.choose(8192, torch.bfloat16, torch.device("cpu"), Call(decay=True)) is None
    finally:
        dispatch.use_table(None)


def test_auto_reads_the_call_signature_from_the_inputs():
    """Head-major with packed rows, or not; gradients or not: what the api hands auto."""
    from leetrepro import dispatch
    q = torch.randn(2, 9, 3, 4)  # (batch, N, heads, r): a model's projection
    hm = q.transpose(1, 2).contiguous()
    assert dispatch.packed_rows(hm) and not dispatch.packed_rows(q.transpose(1, 2))
    call = dispatch.call_of(q.transpose(1, 2), hm[..., :2].contiguous(), decay=True, state=False,
                            grad=True)
    assert call == dispatch.Call(2, 3, 4, 2, True, False, True, False)
    seen = []
    real = dispatch._auto
    dispatch.clear_cache()  # (calls of this signature seen before skip auto)
    try:
        dispatch._auto = lambda n, dtype, device, call: seen.append(call) or real(n, dtype, device, call)
        B, C, V = make_inputs(2, 3, 70, 4, 5)
        causal_linear_decoder(B, C, V, 0.9)
        causal_linear_decoder(*(t.requires_grad_() for t in (B, C, V)), 0.9).sum().backward()
        with torch.no_grad():
            causal_linear_decoder(B.transpose(2, 1).contiguous().transpose(1, 2), C, V, 0.9)
    finally:
        dispatch._auto = real
    assert [(c.grad, c.head_major) for c in seen] == [(False, True), (True, True), (False, False)]


#: the signatures models train and serve at: (batch, N, heads, r, d)
MODEL_CALLS = [(b, n, h, r, d) for b in (1, 2, 4) for n in (2048, 4096, 8192, 16384)
               for (r, d, h) in ((64, 64, 16), (64, 64, 64), (128, 64, 32), (128, 64, 128),
                                 (128, 128, 16), (128, 128, 32), (128, 128, 64))]


@pytest.mark.parametrize("gpu", ["h100", "h200"])
def test_auto_is_chunk_where_models_call_it_with_the_shipped_tables(monkeypatch, gpu):
    """With the committed tables, auto runs Chunk at every signature a model gives (batch 1-4,
    N = 2048-16384, heads 16-128, r/d 64/64, 128/64, 128/128; fp16, bf16, both masks; a
    forward alone or with its backward; time-major views or head-major), where ``make layouts``
    times Chunk fastest. Before the regime and the margin, the H100's table sent forwards at
    batch 1-2, N = 8192, bf16, decay to LA (timed 4 % faster than Chunk head-major), 4-7× slower
    in a model."""
    from leetrepro import dispatch
    monkeypatch.setattr(dispatch, "gpu_tag", lambda device: gpu)
    dispatch.clear_cache()
    cuda = torch.device("cuda")
    try:
        picked = {dispatch._auto(n, dtype, cuda, dispatch.Call(b, h, r, d, decay, False, grad, hm)).abbr
                  for (b, n, h, r, d) in MODEL_CALLS for dtype in (torch.float16, torch.bfloat16)
                  for decay in (False, True) for grad in (False, True) for hm in (False, True)}
        assert picked == {"Chunk"}
        # the cell behind the old choice: LA is in the table, inside the margin
        best, margin = leetrepro.tuning.dispatch_row(
            dispatch.table_path(gpu), 8192, 32, "bf16", True)
        assert margin < dispatch.AUTO_MARGIN or best == "Chunk"
        # the table still speaks where it measured a clear win (short prompts, head-major)
        wins = {dispatch.choose(128, dt, cuda, dispatch.Call(1, 32))
                for dt in (torch.float16, torch.bfloat16, torch.float32)}
        assert wins - {"Chunk"}, wins
    finally:
        dispatch.clear_cache()


@pytest.mark.parametrize("method", quick_lane(["auto", "AUTO", "Auto"]))
def test_auto_is_case_insensitive_and_rejects_method_specific_options(method):
    B, C, V = make_inputs(1, 2, 200, 4, 4)
    assert_close_to_reference(causal_linear_decoder(B, C, V, 0.9, method=method), B, C, V, 0.9)
    # the same answer at every N: a method-specific option is refused whatever auto would pick
    for n in (16, 200, 5000):
        B, C, V = make_inputs(1, 1, n, 2, 2)
        with pytest.raises(ValueError, match="method='auto' takes no method-specific option"):
            causal_linear_decoder(B, C, V, method=method, block_size=64)
        # fp32_precision is taken by every method (the PyTorch ones are exact fp32 anyway)
        out = causal_linear_decoder(B, C, V, 0.9, method=method, fp32_precision="tf32x3")
        assert_close_to_reference(out, B, C, V, 0.9)


@pytest.mark.parametrize("method, options, word", [
    ("Bb", {"block_size": 0}, "block_size"), ("Bb", {"block_size": -3}, "block_size"),
    ("Bb", {"block_size": 2.5}, "block_size"), ("Bb", {"block_size": True}, "block_size"),
    ("LA_torch", {"block_size": "64"}, "block_size"), ("Recur", {"base": 0}, "base"),
    ("Vanilla", {"fp32_precision": "fast"}, "fp32_precision"),
    ("auto", {"fp32_precision": "half"}, "fp32_precision"),
    ("auto", {"gate_grad_precision": "half"}, "gate_grad_precision"),
])
def test_bad_option_values_are_value_errors_naming_the_option(method, options, word):
    B, C, V = make_inputs(1, 1, 10, 2, 2)
    with pytest.raises(ValueError, match=f"{word}=.*{word} takes"):
        causal_linear_decoder(B, C, V, method=method, **options)


@pytest.mark.parametrize("flag", [0, 0.0, "", False])
def test_falsy_is_mask_weight_means_the_0_1_mask(flag):
    B, C, V = make_inputs(1, 2, 8, 3, 3)
    with pytest.warns(UserWarning, match="ignored"):
        out = causal_linear_decoder(B, C, V, 0.5, is_mask_weight=flag)
    assert_close_to_reference(out, B, C, V, None)
    with pytest.raises(ValueError, match="needs gamma"):
        causal_linear_decoder(B, C, V, is_mask_weight=1)


def test_method_names_match_case_insensitively_everywhere():
    B, C, V = make_inputs(1, 2, 8, 3, 3)
    a = causal_linear_decoder(B, C, V, method="bb", attn_method="BB")
    assert_close_to_reference(a, B, C, V, None)
    with pytest.raises(ValueError, match="disagree"):
        causal_linear_decoder(B, C, V, method="bb", attn_method="recur")


@pytest.mark.parametrize("shape", [(2, 3, 0, 4, 5), (0, 3, 7, 4, 5), (2, 3, 7, 0, 5), (2, 0, 7, 4, 5)])
def test_empty_shapes_keep_the_autograd_graph(shape):
    B, C, V = (t.requires_grad_() for t in make_inputs(*shape))
    out = causal_linear_decoder(B, C, V, 0.5, method="Bb")
    assert out.shape == V.shape and out.grad_fn is not None
    out.sum().backward()
    for t in (B, C, V):
        assert t.grad is not None and t.grad.shape == t.shape and not t.grad.any()


def test_gamma_that_requires_grad_is_a_clear_error():
    B, C, V = make_inputs(1, 2, 8, 3, 3)
    g = torch.full((2,), 0.9, requires_grad=True)
    with pytest.raises(ValueError, match="decays are fixed.*detach"):
        causal_linear_decoder(B, C, V, g)
    assert_close_to_reference(causal_linear_decoder(B, C, V, g.detach()), B, C, V, g.detach())


def test_a_seen_signature_skips_checks_but_never_a_wrong_call(monkeypatch):
    """The checks of a call signature already seen are skipped (host time); whatever differs from
    it (a shape, dtype, device, the mask, the options) is checked again, and a reloaded dispatch
    table forgets what auto resolved to."""
    from leetrepro import api, dispatch
    B, C, V = make_inputs(2, 3, 70, 4, 5)
    for _ in range(2):
        assert_close_to_reference(causal_linear_decoder(B, C, V, 0.9, method="auto"), B, C, V, 0.9)
    assert any(k[0] == "auto" for k in api._SEEN)
    with pytest.raises(ValueError, match="disagree on N"):
        causal_linear_decoder(B, C, V[:, :, :60], 0.9, method="auto")
    with pytest.raises(TypeError, match="share one dtype"):
        causal_linear_decoder(B, C.double(), V, 0.9, method="auto")
    with pytest.raises(TypeError, match="unknown option"):
        causal_linear_decoder(B, C, V, 0.9, method="Bb", nonsense=1)
    assert_close_to_reference(causal_linear_decoder(B, C, V, method="auto"), B, C, V, None)
    # auto's choice comes from the table: a reloaded table is looked up again
    monkeypatch.setattr(dispatch, "choose", lambda n, dtype, dev, call: "Recur" if call.decay else "Bb")
    dispatch.clear_cache()
    assert not api._SEEN
    picked = []
    real = ops.run
    patch_package(monkeypatch, ops, "run", lambda m, *a, **k: picked.append(m.abbr) or real(m, *a, **k))
    for g in (0.9, None, 0.9, None):  # the mask is part of the signature
        causal_linear_decoder(B, C, V, g, method="auto")
    assert picked == ["Recur", "Bb", "Recur", "Bb"]
    monkeypatch.undo()
    dispatch.clear_cache()


def test_a_refused_gamma_shows_what_was_typed_and_a_list_is_one_decay_per_head():
    """gamma = [0.9, 1.2] (a list, float64 as typed), a float32 or fp16 tensor: the refusal shows
    1.2, not the float32 round trip 1.2000000476837158; a list of valid decays is per head."""
    B, C, V = make_inputs(1, 2, 8, 4, 4)
    for g in ([0.9, 1.2], torch.tensor([0.9, 1.2]), torch.tensor([0.9, 1.2], dtype=torch.float16)):
        with pytest.raises(ValueError, match=r"got \[1\.2\] \(head\(s\) \[1\]\)"):
            causal_linear_decoder(B, C, V, g)
    from leetrepro.decay.per_head import check_gamma_values
    with pytest.raises(ValueError, match=r"got \[1\.2\] "):  # the op's own check: float64 already
        check_gamma_values(torch.tensor([0.9, 1.2]).double())
    with pytest.raises(TypeError, match="one per head"):
        causal_linear_decoder(B, C, V, ["a", 1])
    assert_close_to_reference(causal_linear_decoder(B, C, V, [0.9, 0.5]), B, C, V,
                              torch.tensor([0.9, 0.5], dtype=torch.float64))


def test_a_triton_method_refuses_float64_naming_the_methods_that_take_it():
    """A Triton method runs on its kernels' device (the GPU, or the CPU under the interpreter)
    but not in float64: the message names the dtype and the methods that take it there, not
    "cpu … on ['cpu', 'cuda']"."""
    B, C, V = (t.double() for t in make_inputs(1, 2, 8, 3, 3, device=KERNEL_DEVICE))
    with pytest.raises(ValueError, match=r"does not take torch.float64 inputs.*methods that take "
                       rf"torch.float64 on {KERNEL_DEVICE}: .*Vanilla") as err:
        causal_linear_decoder(B, C, V, 0.9, method="LA")
    assert "['cpu'" not in str(err.value)


def test_resolving_a_named_method_asks_the_others_only_to_refuse(monkeypatch):
    """A named method's resolution reads that method alone: the list of the methods that run
    these inputs is made for a refusal's message only (a compiled graph resolves on every call,
    and asking each registered method cost two dozen calls a forward and a backward)."""
    from leetrepro.ops import resolution
    from leetrepro.registry import Method
    asked = []
    real = Method.supports
    monkeypatch.setattr(Method, "supports", lambda m, *a: asked.append(m.abbr) or real(m, *a))
    B, C, V = make_inputs(1, 2, 8, 3, 3)
    assert resolution.resolve("Vanilla", B, torch.tensor([0.9, 0.8]), False, V).abbr == "Vanilla"
    assert asked == ["Vanilla"]
    with pytest.raises(ValueError, match=r"methods that (run|take) torch.float64"):
        resolution.resolve("LA", B.double(), None, False, V.double())
    assert len(asked) > 2


def test_a_meta_gamma_is_refused_by_name():
    B, C, V = make_inputs(1, 2, 8, 3, 3)
    with pytest.raises(ValueError, match="gamma is on the meta device"):
        causal_linear_decoder(B, C, V, torch.full((2,), 0.9, device="meta"))


def test_torch_func_grad_and_vjp_give_autograd_s_gradients_and_vmap_is_refused_by_name():
    """torch.func.grad / vjp over the eager call (functional training loops) give the gradients
    torch.autograd gives, per-head γ and per-token gates alike; a vmap over the backward (jacrev)
    is refused with the transform named, not an error about storage."""
    torch.manual_seed(0)
    B, C, V = (torch.randn(2, 2, 37, n, dtype=torch.float64) for n in (5, 5, 3))
    g = -torch.rand(2, 2, 37, dtype=torch.float64)
    for kw in ({"gamma": [0.9, 0.7]}, {"g": g}):
        by_func = torch.func.grad(lambda b, c: causal_linear_decoder(b, c, V, **kw).square().sum(),
                                  argnums=(0, 1))(B, C)
        b, c = B.clone().requires_grad_(), C.clone().requires_grad_()
        causal_linear_decoder(b, c, V, **kw).square().sum().backward()
        assert torch.allclose(by_func[0], b.grad) and torch.allclose(by_func[1], c.grad)
        out, pull = torch.func.vjp(lambda v: causal_linear_decoder(B, C, v, **kw), V)
        assert torch.allclose(out, causal_linear_decoder(B, C, V, **kw))
        assert pull(torch.ones_like(out))[0].abs().sum() > 0
    dg = torch.func.grad(lambda x: causal_linear_decoder(B, C, V, g=x).sum())(g)
    x = g.clone().requires_grad_()
    causal_linear_decoder(B, C, V, g=x).sum().backward()
    assert torch.allclose(dg, x.grad)
    with pytest.raises(NotImplementedError, match="vmap"):
        torch.func.jacrev(lambda v: causal_linear_decoder(B, C, v, gamma=0.9)[0, 0, 5])(V)
