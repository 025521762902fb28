"""The other papers' claims machinery and benchmarks on the CPU: the verdict rules, the ECA paper's
tables read from its text, the claims on constructed and measured rows, the bench's cells."""
import os

import pandas as pd
import pytest
import torch

from leetrepro import _paths
from leetrepro.bench import related as R
from leetrepro.models.decoder import DecoderLM
from leetrepro.reproduce import other_papers as O

FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "eca_tables.txt")


def test_verdict_rules():
    assert O.faster_verdict([1.5, 2.0]) == ("supported", 0.5)
    assert O.faster_verdict([0.5, 0.9])[0] == "not shown"
    assert O.faster_verdict([0.995, 1.3])[0] == "inconclusive"
    assert O.at_least_verdict([3.4, 4.0], 3.3)[0] == "supported"
    assert O.at_least_verdict([3.28], 3.3)[0] == "supported"  # within the noise
    assert O.at_least_verdict([1.0, 2.0], 3.3)[0] == "not shown"
    assert O.at_least_verdict([2.0, 3.5], 3.3)[0] == "inconclusive"


def test_eca_tables_read_from_the_papers_text_are_the_committed_ones():
    with open(FIXTURE, encoding="utf-8") as f:
        times, errors = O.parse_eca_tables(f.read())
    assert len(times) == 8 and len(errors) == 12
    for name, df in ((O.PAPER_TIMES, times), (O.PAPER_ERRORS, errors)):
        committed = pd.read_csv(_paths.data("paper", name))
        pd.testing.assert_frame_equal(df.reset_index(drop=True), committed, check_dtype=False)
    assert times.set_index(["stage", "d", "entry"]).mean_ms[("I", 8192, "ECA")] == 22.3
    assert set(errors.table) == {3, 4}


@pytest.mark.slow  # (seconds a case: the full lane runs it)
def test_eca_claims_from_constructed_rows():
    counts = O.eca_counts((64, 256), r=16, depths=(0, 1))
    assert counts.equal.all()
    times = pd.DataFrame([dict(entry=e, N=n, r=64, median_s=t, status="ok")
                          for n in (256, 1024) for e, t in (("ECA", 2.0), ("standard", 1.0),
                                                           ("Vanilla", 1.5))])
    errors = pd.DataFrame([dict(entry=e, arithmetic="in-dtype", dtype=d, rel_error=x, status="ok")
                           for d in ("float16", "bfloat16") for e, x in (("ECA", 2e-3), ("standard", 1e-3))])
    cpu = O.eca_claims(counts, True, errors, times, machine="cpu").set_index("claim").holds
    assert list(cpu.iloc[:4]) == ["supported"] * 4
    assert cpu.iloc[4] == "not shown"  # ECA twice the faster standard product's time
    gpu = O.eca_claims(counts, True, errors, times, machine="h100").set_index("claim").holds
    assert gpu.iloc[4] == "supported"  # no gain on a GPU
    faster = times.assign(median_s=lambda d: d.median_s.where(d.entry != "ECA", 0.5))
    assert O.eca_claims(counts, True, None, faster, machine="h100").holds.iloc[-1] == "not shown"


def test_kernel_paper_claims_from_constructed_rows():
    def cell(entry, s, peak):
        return dict(entry=entry, mode="fwd+bwd", N=4096, batch=2, heads=16, head_dim=128,
                    median_s=s, peak_bytes=peak, status="ok")
    layer = pd.DataFrame([cell("leetrepro (1+x)", 1.0, 100), cell("fla chunk_gla", 4.0, 200)])
    c = O.kernel_paper_claims(layer, None).set_index("claim").holds
    assert list(c) == ["supported", "not shown", "not measured", "not measured"]
    failed = layer.assign(status=["ok", "error: RuntimeError: refuses"])
    c = O.kernel_paper_claims(failed, None)
    assert c.holds.iloc[0] == "not measured" and "refuses" in c.evidence.iloc[0]
    # (the evidence names what computed the passes around the operator; rows without the
    # column predate the kernels)
    assert "PyTorch's composition" in O.kernel_paper_claims(layer, None).evidence.iloc[0]
    on_kernels = layer.assign(passes=["kernels", None])
    assert "Triton kernels" in O.kernel_paper_claims(on_kernels, None).evidence.iloc[0]
    in_sweeps = layer.assign(passes=["sweep+sweeps", None])
    assert "inside Chunk's sweeps, forward and backward" in \
        O.kernel_paper_claims(in_sweeps, None).evidence.iloc[0]
    # (graph times said beside the eager verdict, for the time claim alone, never judged)
    graphs = O.kernel_paper_claims(layer.assign(graph_s=[0.5, 3.0]), None)
    assert "CUDA graphs 6.00×" in graphs.evidence.iloc[0] and "graph" not in graphs.evidence.iloc[1]
    assert list(graphs.holds) == list(O.kernel_paper_claims(layer, None).holds)
    assert "graph" not in O.kernel_paper_claims(layer.assign(graph_s=[0.5, None]),
                                                None).evidence.iloc[0]


@pytest.mark.parametrize("tag", ["h100", "h200"])
def test_committed_gpu_rows_judge_every_claim(tag):
    read = lambda name: pd.read_csv(_paths.data(tag, name))  # noqa: E731
    layer, lm = read("kernel_paper_layer.csv"), read("kernel_paper_lm.csv")
    assert (layer.status == "ok").all() and (lm.status == "ok").all()
    assert set(O.kernel_paper_claims(layer, lm).holds) <= {"supported", "inconclusive", "not shown"}
    counts = O.eca_counts((1024,), r=64, depths=(0,))
    c = O.eca_claims(counts, True, read("eca_errors.csv"), read("eca.csv"), read("eca_stages.csv"),
                     machine=tag)
    assert "not measured" not in set(c.holds)


def test_bench_cells_on_the_cpu():
    cpu = torch.device("cpu")
    rows = R.measure_eca(cpu, [64, 96], reps=1)
    assert {r["entry"] for r in rows} == {"ECA", "ECA depth 1", "standard", "Vanilla"}
    assert all(r["status"] == "ok" and r["median_s"] > 0 for r in rows)
    errors = pd.DataFrame(R.measure_eca_errors(cpu, n=64, heads=1, r=16, d=16))
    ok = errors[errors.status == "ok"]
    assert (ok[ok.arithmetic == "accumulate"].rel_error < 1e-2).all()
    layer = R.measure_layer(cpu, cells=((1, 2, 16, 64),), reps=1, dtype=torch.float32)
    assert {r["entry"] for r in layer} >= {"leetrepro (1+x)", "softmax (SDPA)"}
    assert {r["passes"] for r in layer if r["entry"] == "leetrepro (1+x)"} == {"composition"}
    # (the passes' entry, where their kernels cannot run, says what ran instead)
    assert {r["passes"] for r in layer if r["entry"] == R.PASSES} == {"composition"}
    assert {r["entry"] for r in layer} == set(R.LAYER_ENTRIES) - {e for e in R.MIXERS if "fla" in e
                                                                 and R.mixer(e) is None}
    lm = R.measure_lm(cpu, dict(vocab=50, dim=32, layers=1, heads=2, mlp=64, batch=1, seq=16),
                      steps=1, warmup=1)
    assert all(r["status"] == "ok" for r in lm)
    # (the LM's label asked of its own layer's tensors, as the layer's is)
    assert [r["passes"] for r in lm if r["entry"] == "leetrepro (1+x)"] == ["composition"]


def test_the_decoder_mixes_with_gates_where_the_mixer_takes_them():
    seen = {}

    def mix(q, k, v, g):
        seen["g"] = g
        return v
    model = DecoderLM(mix, vocab=20, dim=16, layers=1, heads=2, mlp=32, gates="key")
    model(torch.randint(0, 20, (1, 8)))
    assert seen["g"].shape == (1, 8, 2, 8) and (seen["g"] <= 0).all()
