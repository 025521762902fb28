"""The model benchmark's machinery on the CPU: every mixer's model trains a step eager and
compiled (dynamo only: one graph for all blocks, no break), rows as the GPU run writes them,
and the operator's share from kernel names."""
import pytest
import torch

from leetrepro.bench import model as M

TINY = dict(vocab=64, dim=32, layers=3, heads=2, mlp=48, batch=2, seq=40,
            mamba=dict(headdim=16, d_state=8, ngroups=1))
OURS = [m for m in M.MIXERS if not m.startswith("fla") and not m.endswith("mamba_ssm")]


@pytest.mark.parametrize("name", OURS)
def test_each_mixer_s_model_steps_eager_and_compiled_in_one_graph(name):
    torch._dynamo.utils.counters.clear()
    rows = M.measure("tiny", TINY, [name], M.MODES, 1, torch.device("cpu"),
                     compile_backend="eager")
    assert [(r["mixer"], r["mode"], r["status"]) for r in rows] == \
        [(name, m, "ok") for m in M.MODES]
    for r in rows:
        assert r["ms"] > 0 and r["tokens_per_s"] == pytest.approx(2 * 40 / (r["ms"] / 1e3))
        assert r["params"] > 0 and r["size"] == "tiny"
    # the blocks are alike: one graph serves them all (a break or a recompile per block would
    # time PyTorch's eager path under the name of torch.compile)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1


def test_rows_compare_with_the_operator_s_row_in_the_same_mode_and_peers_absent_are_rows():
    rows = M.measure("tiny", TINY, ["leetrepro", "softmax SDPA", "Mamba-2 mamba_ssm"],
                     ("eager",), 1, torch.device("cpu"), peer=None)
    by = {r["mixer"]: r for r in rows}
    assert by["leetrepro"]["vs_leetrepro"] == 1.0
    assert by["softmax SDPA"]["vs_leetrepro"] == pytest.approx(
        by["softmax SDPA"]["tokens_per_s"] / by["leetrepro"]["tokens_per_s"])
    assert by["Mamba-2 mamba_ssm"]["status"] == "not installed"


@pytest.mark.slow  # (5-18 s on two cores: kept out of the quick lane)
def test_mixers_together_take_turns_step_by_step(monkeypatch):
    """``together``: every mixer's model built at once, one interleaved timing of every (mixer,
    mode) step; the rows as apart; more mixers than dynamo's recompile limit allows refused,
    naming the limit."""
    seen = []
    real = M.interleaved_medians

    def spy(fns, *args, **kwargs):
        seen.append(sorted(fns))
        return real(fns, *args, **kwargs)
    monkeypatch.setattr(M, "interleaved_medians", spy)
    mixers = ["leetrepro", "leetrepro gated", "Mamba-2 mamba_ssm"]
    rows = M.measure("tiny", TINY, mixers, M.MODES, 1, torch.device("cpu"), peer=None,
                     compile_backend="eager", together=True)
    assert seen == [sorted((n, m) for n in mixers[:2] for m in M.MODES)]
    assert [(r["mixer"], r["mode"], r["status"]) for r in rows] == \
        [(n, m, "ok") for n in mixers[:2] for m in M.MODES] + \
        [(mixers[2], m, "not installed") for m in M.MODES]
    assert all(r["ms"] > 0 for r in rows[:4])
    with pytest.raises(ValueError, match="at most 3 mixers"):
        M.measure("tiny", TINY, M.MIXERS[:4], M.MODES, 1, torch.device("cpu"), together=True)


def test_a_mixer_s_peak_counts_its_own_weights_and_optimizer_state():
    """The static part of a row's peak (``together`` keeps other models in memory): the model's
    parameters and its AdamW moments, not another model's."""
    layer = torch.nn.Linear(8, 4).to(torch.bfloat16)
    opt = torch.optim.AdamW(layer.parameters())
    assert M._own_bytes(layer, opt) == (8 * 4 + 4) * 2  # (no step yet: no moments)
    layer(torch.randn(3, 8, dtype=torch.bfloat16)).sum().backward()
    opt.step()
    steps = sum(opt.state[p]["step"].numel() * opt.state[p]["step"].element_size()
                for p in layer.parameters())
    assert M._own_bytes(layer, opt) == 3 * (8 * 4 + 4) * 2 + steps


def test_the_operator_s_share_counts_its_own_kernels_only():
    step = {"_chunk_fwd_kernel": 300.0, "void at::native::vectorized_elementwise_kernel": 100.0,
            "sm90_xmma_gemm_bf16": 500.0, "triton_poi_fused_add": 100.0}
    # what the mixer alone launched: its kernel, and a copy PyTorch also makes elsewhere
    alone = {"_chunk_fwd_kernel", "void at::native::vectorized_elementwise_kernel"}
    ms, share = M.op_share(step, alone)
    assert ms == pytest.approx(0.3) and share == pytest.approx(0.3)
    flash = "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, cutlass::bfloat16_t>>"
    assert M.op_share({flash: 2.0, "void cutlass::Kernel2<cutlass_80_tensorop_gemm>": 2.0},
                      {flash})[1] == 0.5
    cudnn = "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wmma_f16_knob_3_64x64x128_4x1x1"
    assert M.op_share({cudnn: 1.0, "void at::native::conv_depthwise2d_forward_kernel": 1.0},
                      {cudnn, "void at::native::conv_depthwise2d_forward_kernel"})[1] == 0.5


def test_an_unknown_mixer_is_named():
    with pytest.raises(ValueError, match="unknown mixer 'nope'"):
        M.mixer("nope", TINY, torch.device("cpu"))


@pytest.mark.slow  # (seconds a case: the full lane runs it)
def test_the_cuda_graph_mode_is_a_row_of_its_own():
    """``graphs``: the blocks under torch.compile(mode="reduce-overhead") on a GPU, a step
    marked as a new iteration each time (here dynamo alone: the plumbing, not the graphs)."""
    rows = M.measure("tiny", TINY, ["leetrepro"], M.ALL_MODES, 1, torch.device("cpu"),
                     compile_backend="eager")
    assert [(r["mode"], r["status"], r["vs_leetrepro"]) for r in rows] == \
        [(m, "ok", 1.0) for m in M.ALL_MODES]


def test_keep_takes_back_the_file_s_other_rows_with_their_commits_as_text(tmp_path):
    """``--keep`` (:func:`model.kept_rows`): a run of some sizes, mixers and modes leaves the
    file's other rows as they were, their commit a hash (a merge that read "801e919" as a number
    wrote inf), and the ratios to the γ mixer's row taken again over the merged rows."""
    import pandas as pd
    path = tmp_path / "model.csv"
    old = [dict(size="125M", mixer=m, mode=mode, tokens_per_s=t, vs_leetrepro=0.5, commit=c)
           for m, mode, t, c in (("leetrepro", "eager", 100.0, "801e919"),
                                 ("leetrepro gated", "eager", 80.0, "801e919"),
                                 ("leetrepro", "graphs", 120.0, "0123456"))]
    pd.DataFrame(old).to_csv(path, index=False)
    new = [dict(size="125M", mixer="leetrepro", mode="eager", tokens_per_s=200.0, commit="abcdef1")]
    rows = M.kept_rows(M.written_rows(str(path)), new)
    pd.DataFrame(rows).to_csv(path, index=False)
    back = pd.read_csv(path, dtype={"commit": str})
    got = {(r.mixer, r.mode): (r.commit, r.tokens_per_s, r.vs_leetrepro) for r in back.itertuples()}
    assert got == {("leetrepro gated", "eager"): ("801e919", 80.0, 0.4),
                   ("leetrepro", "graphs"): ("0123456", 120.0, 1.0),
                   ("leetrepro", "eager"): ("abcdef1", 200.0, 1.0)}
    assert M.kept_rows(M.written_rows(str(tmp_path / "none.csv")), new)[0]["vs_leetrepro"] == 1.0
