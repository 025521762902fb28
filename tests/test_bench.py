import time
from pathlib import Path

import pandas as pd
import pytest
import torch

from leetrepro.bench import benchmark_method
from leetrepro.bench.harness import format_cell, provenance
from conftest import patch_chunk


def test_registered_method_on_cpu():
    df = benchmark_method("Bb", device="cpu", dtype="float32", batch_size=2, is_weight_decay=True,
                          seqlens=(16, 33), heads=2, rank=8, dim=4, reps=3, progress=False)
    assert isinstance(df, pd.DataFrame)
    assert list(df.N) == [16, 33] and (df.status == "ok").all()
    assert (df.mean_s > 0).all() and (df.std_s >= 0).all() and (df.reps == 3).all()
    assert df.decay.all() and (df.method == "Bb").all()
    assert df.cell.str.contains("±").all()


def test_callable_gets_the_gamma_of_listing1():
    seen = []

    def attn(q, k, v, gamma):
        seen.append(gamma)
        return v

    gamma = torch.full((2, 1), 0.9)
    benchmark_method(attn, device="cpu", batch_size=1, is_weight_decay=True, gamma=gamma,
                     seqlens=(8,), heads=2, rank=4, dim=4, reps=2, progress=False)
    assert all(torch.equal(g, gamma) for g in seen) and len(seen) == 3
    seen.clear()
    benchmark_method(attn, device="cpu", seqlens=(8,), heads=2, rank=4, dim=4, reps=1,
                     progress=False)
    assert seen == [None, None]


def test_oom_and_time_limit_cells_do_not_abort_the_sweep():
    def flaky(q, k, v, gamma):
        n = q.shape[2]
        if n == 16:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 1 GiB")
        if n >= 32:
            time.sleep(0.05)
        return v

    df = benchmark_method(flaky, device="cpu", seqlens=(8, 16, 24, 32, 64), heads=1, rank=2,
                          dim=2, reps=2, time_limit=0.03, progress=False)
    assert list(df.status) == ["ok", "OOM", "ok", ">limit", ">limit"]
    assert list(df.cell[1:2]) == ["OOM"] and "not run" in df.note.iloc[4]


def test_errors_other_than_out_of_memory_raise():
    def broken(q, k, v, gamma):
        raise ValueError("nope")
    with pytest.raises(ValueError, match="nope"):
        benchmark_method(broken, device="cpu", seqlens=(4,), heads=1, rank=2, dim=2, reps=1,
                         progress=False)


@pytest.mark.parametrize("kwargs, error, word", [
    (dict(method="flash"), ValueError, "unknown method"),
    (dict(method="Bb", options={"block_size": 0}), ValueError, "block_size"),
    (dict(method="Bb", options={"blocksize": 4}), TypeError, "blocksize"),
    (dict(method="Bb", dtype="int32"), ValueError, "dtype"),
    (dict(method="Bb", dtype=torch.int32), ValueError, "dtype"),
])
def test_configuration_errors_raise_before_anything_is_timed(kwargs, error, word):
    with pytest.raises(error, match=word):
        benchmark_method(device="cpu", seqlens=(4,), heads=1, rank=2, dim=2, reps=1,
                         progress=False, **kwargs)


def test_gamma_without_decay_warns():
    with pytest.warns(UserWarning, match="gamma is ignored"):
        df = benchmark_method("Bb", device="cpu", gamma=0.9, seqlens=(8,), heads=1, rank=2, dim=2,
                              reps=1, progress=False)
    assert not df.decay.any()


def test_cuda_without_gpu_is_a_clear_error():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(RuntimeError, match="no GPU"):
        benchmark_method("Bb", device="cuda", seqlens=(8,))


def test_helpers():
    assert format_cell(1.234e-3, 5.6e-5) == "1.23e-03 ± 5.6e-05"
    p = provenance("cpu")
    assert {"gpu", "commit", "date", "torch"} <= set(p)


def _git(cwd, *args):
    import subprocess
    subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", *args], cwd=cwd, check=True,
                   capture_output=True)


def test_provenance_names_only_this_checkouts_commit(tmp_path, monkeypatch):
    from leetrepro.bench import harness

    outer = tmp_path / "outer"
    (outer / "copy").mkdir(parents=True)
    (outer / "f.txt").write_text("x")
    _git(outer, "init", "-q")
    _git(outer, "add", "f.txt")
    _git(outer, "commit", "-qm", "outer")
    # a copy of the tree exported into another repository: not that repository's commit
    monkeypatch.setattr(harness, "ROOT", str(outer / "copy"))
    monkeypatch.delenv("LEETREPRO_COMMIT", raising=False)
    assert harness.commit_and_origin() == ("unknown", "unknown")
    # this checkout, modified: the commit and the hash of the diff
    monkeypatch.setattr(harness, "ROOT", str(outer))
    clean, origin = harness.commit_and_origin()
    assert len(clean) == 12 and origin == "git"
    (outer / "f.txt").write_text("y")
    first = harness.git_commit()
    (outer / "f.txt").write_text("z")
    second = harness.git_commit()
    assert first.startswith(clean + "-dirty-") and second.startswith(clean + "-dirty-")
    assert first != second
    # a declared commit says it was declared
    monkeypatch.setenv("LEETREPRO_COMMIT", "abc1234")
    assert harness.commit_and_origin() == ("abc1234", "declared")


def test_provenance_records_the_source_hash():
    from leetrepro.bench.harness import source_hash
    row = provenance("cpu")
    assert row["source"] == source_hash() and len(row["source"]) == 12
    assert row["commit_origin"] in ("git", "declared", "unknown")


def test_every_measuring_tool_imports():
    # the GPU scripts never run in CI: an import error would first show on a GPU host
    import importlib
    import pkgutil

    import leetrepro.bench as bench
    for mod in pkgutil.iter_modules(bench.__path__):
        importlib.import_module(f"leetrepro.bench.{mod.name}")


def test_tune_resume_keeps_measured_cells_and_their_provenance(tmp_path, monkeypatch):
    """``tune --resume`` times only the cells a cut-off run left, keeps the earlier rows as they
    were measured, and still skips at larger N a method the earlier run dropped."""
    import argparse

    from leetrepro.bench import tune

    def fake_main(script, doc, argv, configure, *, output):
        p = argparse.ArgumentParser()
        p.add_argument("--out")
        configure(p)
        args = p.parse_args(argv)
        return args, ("cpu", {"gpu": "GPU", "commit": "new"}, args.out)

    timed = []

    def fake_cell(dtype, batch, n, decay, names, reps, limit, device, dropped, publish):
        timed.append((tune.SHORT_NAMES[dtype], batch, decay, n, frozenset(dropped)))
        row = dict(dtype=tune.SHORT_NAMES[dtype], batch=batch, decay=decay, N=n, t_A=1e-3,
                   t_B=float("nan") if "B" in dropped else 2e-3, best="A", best_s=1e-3,
                   auto="A", regret=0.0)
        publish(row)
        return row

    monkeypatch.setattr(tune, "gpu_main", fake_main)
    monkeypatch.setattr(tune, "tune_cell", fake_cell)
    monkeypatch.setattr(tune, "candidates", lambda dt: ["A", "B"])
    # main points auto at the table it writes: undone after the test, never seen by the others
    monkeypatch.setenv("LEETREPRO_DISPATCH", "")  # records the variable's state to restore
    monkeypatch.delenv("LEETREPRO_DISPATCH")
    monkeypatch.setattr(tune.dispatch, "clear_cache", lambda: None)
    old = pd.DataFrame([dict(dtype="fp16", batch=1, decay=False, N=n, t_A=1e-3, t_B=b,
                             best="A", best_s=1e-3, auto="A", regret=0.0, gpu="GPU",
                             commit="old") for n, b in ((128, 2e-3), (256, 9.0))]
                       # cut off between publishing its best and timing auto: measured again
                       + [dict(dtype="fp16", batch=1, decay=True, N=128, t_A=1e-3, best="A",
                               best_s=1e-3, gpu="GPU", commit="old")])
    path = tmp_path / "dispatch.csv"
    old.to_csv(path, index=False)
    argv = ["--out", str(tmp_path), "--dtypes", "float16", "--batches", "1",
            "--seqlens", "128", "256", "512"]
    assert tune.main(argv + ["--resume"]) == 0
    # the two measured cells are not timed again; B (over the limit at N=256) stays dropped
    assert [t[:4] for t in timed] == [("fp16", 1, False, 512)] + [
        ("fp16", 1, True, n) for n in (128, 256, 512)]
    assert timed[0][4] == {"B"} and timed[1][4] == set()
    df = pd.read_csv(path)
    assert len(df) == 6 and df.drop_duplicates(tune.CELL).shape[0] == 6
    assert list(df.commit) == ["old"] * 2 + ["new"] * 4
    # without --resume the table is measured anew
    timed.clear()
    assert tune.main(argv) == 0
    assert len(timed) == 6 and set(pd.read_csv(path).commit) == {"new"}


def test_a_failed_cell_says_why_in_its_status():
    """One status text for a cell whose call raised: OOM, or the error's type and its message cut
    to the caller's width; the correctness matrix's FAIL keeps the message's first line."""
    from leetrepro.bench.gpu_check import _failed
    from leetrepro.bench.harness import failed_status
    assert failed_status(RuntimeError("CUDA out of memory. Tried to allocate 2 GiB")) == "OOM"
    assert failed_status(MemoryError()) == "OOM"
    assert failed_status(ValueError("x" * 300)) == "error: ValueError: " + "x" * 100
    assert failed_status(ValueError("x" * 300), 160) == "error: ValueError: " + "x" * 160
    assert _failed(ValueError("first\nsecond")) == "FAIL ValueError: first"
    assert _failed(ValueError()) == "FAIL ValueError: "


def test_gpu_check_gradient_rows_for_frozen_inputs():
    """The GPU matrix's gradient rows with only some inputs requiring grad, run here on the CPU
    through a PyTorch method: one row per gradient asked for, each within its tolerance."""
    from leetrepro.bench.gpu_check import check_grads, frozen_subsets
    from leetrepro.methods import get
    m = get("LA_torch")
    assert len(frozen_subsets(m)) == 14 and "BCVS" not in frozen_subsets(m)
    rows = []
    for wanted in ("V", "BS", "C"):
        check_grads(m, (2, 3, 37, 8, 5), torch.float32, True, torch.device("cpu"), 9, rows, {},
                    wanted)
    assert [r["quantity"] for r in rows] == ["dV", "dB", "dS0", "dC"]
    assert all(r["status"] == "pass" for r in rows), rows


def test_gpu_check_fp16_range_rows():
    """``--fp16-range``'s rows, run here through a PyTorch method in fp32: O and every gradient,
    each case's magnitudes putting the named state past fp16's 65504."""
    from leetrepro.bench.gpu_check import RANGE_CASES, check_grads
    from leetrepro.methods import get
    rows = []
    for case in RANGE_CASES:
        check_grads(get("LA_torch"), (1, 2, 300, 16, 16), torch.float32, True,
                    torch.device("cpu"), 7, rows, {}, magnitudes=case)
    assert [r["quantity"] for r in rows] == ["O", "dB", "dC", "dV"] * 2
    assert all(r["status"] == "pass" for r in rows), rows
    assert rows[0]["max_state"] > 65504 and rows[0]["note"].endswith(RANGE_CASES[0][0])


def test_gpu_check_time_major_gradient_rows(monkeypatch):
    """The gradient rows with time-major inputs, run here through a PyTorch method: the inputs
    really are time-major views, and every gradient is within its tolerance."""
    from leetrepro.bench import gpu_check
    from leetrepro.methods import get
    seen = []
    real = gpu_check.causal_linear_decoder

    def spy(B, *a, **k):
        seen.append(B.stride())
        return real(B, *a, **k)
    monkeypatch.setattr(gpu_check, "causal_linear_decoder", spy)
    rows = []
    gpu_check.check_grads(get("LA_torch"), (2, 3, 37, 8, 5), torch.float32, True,
                          torch.device("cpu"), 9, rows, {}, time_major=True)
    assert seen and all(st[1] == 8 and st[2] == 3 * 8 for st in seen), seen
    assert [r["quantity"] for r in rows] == ["dB", "dC", "dV", "dS0"]
    assert all(r["status"] == "pass" and r["note"].endswith("time-major inputs") for r in rows)


def test_gpu_check_exact_gradient_rows(monkeypatch):
    """fp32 gradients of a method with an fp32 precision switch are checked twice: through its
    default tf32 products (5e-3) and through ``tf32x3`` (1e-5, rows labelled so); a method
    without the switch once. Run here through a PyTorch method standing in for a kernel."""
    import dataclasses

    from leetrepro.bench import gpu_check
    from leetrepro.methods import get
    asked = []
    real = gpu_check.causal_linear_decoder

    def spy(*a, fp32_precision=None, **k):
        asked.append(fp32_precision)
        return real(*a, **k)
    monkeypatch.setattr(gpu_check, "causal_linear_decoder", spy)
    plain = get("LA_torch")
    switched = dataclasses.replace(plain, options={**plain.options, "fp32_precision": "tf32"})
    assert gpu_check.exact_modes(switched, torch.float32) == (False, True)
    assert gpu_check.exact_modes(switched, torch.float16) == (False,)
    assert gpu_check.exact_modes(plain, torch.float32) == (False,)
    rows = []
    for exact in gpu_check.exact_modes(switched, torch.float32):
        gpu_check.check_grads(switched, (2, 3, 37, 8, 5), torch.float32, True, torch.device("cpu"),
                              9, rows, {}, exact=exact)
    assert asked == [None, "tf32x3"]
    assert [(r["precision"], r["tol"]) for r in rows] == \
        [("", gpu_check.TF32_TOLERANCE)] * 4 + [("tf32x3", 1e-5)] * 4
    assert all(r["status"] == "pass" for r in rows), rows


def test_gpu_check_dtypes_option_takes_a_subset_in_the_matrix_order():
    """``--dtypes`` re-runs part of the matrix (a run cut off after some dtypes); a dtype the
    matrix does not have is refused by name."""
    import argparse

    from leetrepro.bench import gpu_check
    p = argparse.ArgumentParser()
    gpu_check._arguments(p)
    assert p.parse_args([]).dtypes == ["float32", "float16", "bfloat16"]
    assert p.parse_args(["--dtypes", "bfloat16"]).dtypes == ["bfloat16"]
    with pytest.raises(SystemExit):
        p.parse_args(["--dtypes", "float64"])


def test_gpu_check_head_shapes_cover_the_shapes_models_use():
    """``--heads-only``'s shapes: every r, d pair the Hopper kernel's targets name (64/64, 128/64,
    64/128, 128/256, 256/128, 256/256), N cut into segments and one pass per lane, odd N."""
    import argparse

    from leetrepro.bench import gpu_check
    p = argparse.ArgumentParser()
    gpu_check._arguments(p)
    assert p.parse_args(["--heads-only"]).heads_only and not p.parse_args([]).heads_only
    pairs = {(r, d) for _, _, _, r, d in gpu_check.HEAD_SHAPES}
    assert {(64, 64), (128, 64), (64, 128), (128, 256), (256, 128), (256, 256)} <= pairs
    assert any(b * h >= 256 for b, h, _, _, _ in gpu_check.HEAD_SHAPES)  # one pass per lane
    assert any(n % 64 for _, _, n, _, _ in gpu_check.HEAD_SHAPES)


def test_ncu_summary_of_a_real_profile():
    """``probes.ncu.summarize`` on Nsight Compute's raw page of one call (H200, fp16 b1 N = 8192,
    trimmed to the columns it reads): the longest kernel, its DRAM bytes against the floor's, the
    stall reasons largest first; the floor's bytes counted from the cell's shape."""
    from leetrepro.probes import ncu
    assert ncu.floor_bytes("f16_b16_01") == (16 * 32 * 25600 * 256 * 2 + 16 * 32 * 25600 * 128 * 2,
                                             16 * 32 * 25600 * 128 * 2)
    # a cell at another head shape: B, C (r = 128), V read (d = 256), O written, 16 heads
    assert ncu.floor_bytes("bf16_b8_8192_128x256") == (8 * 16 * 8192 * 512 * 2,
                                                       8 * 16 * 8192 * 256 * 2)
    raw = (Path(__file__).parent / "fixtures" / "ncu_raw_f16_b1_8192_01.csv").read_text()
    line = ncu.summarize(raw, "f16_b1_8192_01")
    assert line.split()[1] == "chunk_scan_kernel"  # not the 2 µs elementwise kernel beside it
    assert "DRAM read 1.500x floor reads" in line and "t=0.194ms" in line
    stalls = line.split("cycles/issue ")[1]
    assert stalls.startswith("7.05: barrier 2.74, wait 1.04") and stalls.count(",") == 4


def test_ncu_summary_of_a_backward_call_lists_each_kernel():
    """``probes.ncu.summarize_kernels`` on Nsight Compute's raw page of a gated backward (H200,
    Mamba-2's 2 × 64 heads × 8192, 128/64, bf16, the Hopper kernel's three sweeps, trimmed to
    the columns it reads): a line per kernel in launch order with its bytes and largest stalls,
    then the call's total; each backward cell names a shape the operator takes."""
    from leetrepro.probes import ncu
    raw = (Path(__file__).parent / "fixtures" / "ncu_raw_bf16_bwd_gates_mamba2.csv").read_text()
    lines = ncu.summarize_kernels(raw, "bf16_bwd_gates_mamba2")
    assert len(lines) == 4 and all(line.split()[1] == "chunk_hopper_kernel" for line in lines[:3])
    assert [line.split("t=")[1].split("ms")[0] for line in lines[:3]] == \
        ["0.700", "0.469", "0.312"]
    assert "DRAM read 811 MB, write 268 MB" in lines[0]
    assert "cycles/issue 7.13: long_scoreboard 3.24, selected 1.00" in lines[0]
    assert lines[3].endswith("every kernel: 3 launches, t=1.482ms")
    assert ncu.summarize_kernels(raw, "x", least_us=400.0)[:-1] == [
        line.replace("bf16_bwd_gates_mamba2", "x".ljust(21)) for line in lines[:2]]
    assert set(ncu.BACKWARD) & set(ncu.CELLS) == set() and set(ncu.FORWARD) & set(ncu.CELLS) == set()
    assert ncu.PASSES == {**ncu.BACKWARD, **ncu.FORWARD} and len(ncu.PASSES) == 9
    # (each forward cell's gated and γ twin at one shape)
    assert {v[:5] for k, v in ncu.FORWARD.items() if "gates" in k} == \
        {v[:5] for k, v in ncu.FORWARD.items() if "gamma" in k}
    assert all(r in (64, 128) and d in (64, 128) for *_, r, d, _ in ncu.BACKWARD.values())


def test_host_probe_reports_a_call_s_host_time_and_where_it_goes():
    """``probes.host.report`` on a small gated call on the CPU: the host and eager times, the
    ATen operators and launches a call issues, and the functions with the most host time of
    their own, largest first (no graph time without a GPU)."""
    from leetrepro.probes import host
    cpu = torch.device("cpu")
    fn = host.call_of("small", cpu, dtype=torch.float32, shape=(1, 2, 70, 16, 8, True))
    lines = host.report("small", fn, cpu, reps=3)
    assert lines[0].startswith("small") and " host " in lines[0] and " eager " in lines[0]
    assert "gpu" not in lines[0]
    ops = int(lines[0].split("; ")[1].split()[0])
    assert ops > 5 and lines[0].endswith("kernel launches a call")
    own = [float(line.split("µs")[0].split()[-1]) for line in lines[1:13]]
    assert len(own) == 12 and own == sorted(own, reverse=True) and own[0] > 0
    ours = lines[13:]
    cumulative = [float(line.split("µs")[0].split()[-1]) for line in ours]
    assert ours and all(line.endswith("(with what it calls)") for line in ours)
    assert cumulative == sorted(cumulative, reverse=True) and cumulative[0] >= own[-1]


def test_host_probe_takes_the_ssd_at_bench_ssd_s_shapes(monkeypatch):
    """``probes.host``'s ``ssd_<label>`` cells call ``compat.mamba_chunk_scan_combined`` and its
    backward on ``bench.ssd``'s inputs, gradients reaching every leaf (a shape made small)."""
    from leetrepro.bench import ssd
    from leetrepro.probes import host
    monkeypatch.setattr(ssd, "SHAPES", [("tiny", 1, 40, 2, 8, 16, 1)])
    fn = host.call_of("ssd_tiny", torch.device("cpu"))
    grads = fn()
    assert len(grads) == 7 and all(torch.isfinite(g).all() and g.abs().sum() > 0 for g in grads)


def test_ab_probe_compares_a_switch_s_values_and_restores_it(monkeypatch, tmp_path):
    """``probes.ab``: each value of a module-level switch set in turn for the same calls, their
    results compared with the first value's bit for bit (NaN where NaN) and checked finite, the
    host and back-to-back times of each round recorded (no graph without a GPU), the switch
    restored, even after a failing call; a switch that names no module or no name refused by
    name; ``main`` on a gated call made small (the 125M cell's shape replaced)."""
    from leetrepro.methods.chunk import tables
    from leetrepro.probes import ab
    cpu = torch.device("cpu")
    switch = ab.Switch("methods.chunk.tables.GATE_SUMS_SHARED")
    fns = {"reads it": lambda: (torch.tensor([1.0 if tables.GATE_SUMS_SHARED else 2.0]),),
           "ignores it": lambda: (torch.tensor([float("nan"), 3.0]),)}
    rows = ab.compare(switch, [True, False], fns, cpu, rounds=2, reps=2)
    assert len(rows) == 2 * 2 * 2 and tables.GATE_SUMS_SHARED is True
    by = {(r["cell"], r["value"]): r for r in rows if r["round"] == 0}
    assert by[("reads it", "False")]["same"] is False and by[("ignores it", "False")]["same"]
    assert not by[("ignores it", "True")]["finite"] and by[("reads it", "True")]["finite"]
    assert all(r["host_ms"] > 0 and r["eager_ms"] > 0 and "graph_ms" not in r for r in rows)
    assert len(ab.summary(rows)) == 4
    with pytest.raises(RuntimeError):
        ab.compare(switch, [False], {"fails": lambda: (_ for _ in ()).throw(RuntimeError())},
                   cpu)
    assert tables.GATE_SUMS_SHARED is True
    for bad in ("GATE_SUMS_SHARED", "methods.chunk.tables.NO_SUCH", "no_such_module.X"):
        with pytest.raises((ValueError, ModuleNotFoundError), match="switch|no_such"):
            ab.Switch(bad)
    monkeypatch.setitem(ab.LAYERS, "gated125", (1, 2, 70, 16, 8, True))
    assert ab.main(["--switch", "methods.chunk.tables.GATE_FOLD_FUSED", "--cells", "gated125",
                    "--rounds", "1", "--reps", "1", "--device", "cpu",
                    "--out", str(tmp_path)]) == 0
    import pandas as pd
    table = pd.read_csv(tmp_path / "ab.csv")
    assert list(table.value.astype(str)) == ["False", "True"] and table.same.all() and "commit" in table


def test_ab_probe_cells_take_a_forward_alone_and_the_gates_bench_s_entries(monkeypatch):
    """``probes.ab``'s cells: ``fwd:<cell>`` the named call's forward alone (its output, no
    gradient taken), ``gates:<shape>`` and ``gamma:<shape>`` :mod:`leetrepro.bench.gates`'
    entries at its shapes (made small here), and an entry or shape it lacks refused by name."""
    from leetrepro.bench import gates
    from leetrepro.probes import ab
    cpu = torch.device("cpu")
    monkeypatch.setitem(ab.LAYERS, "gated125", (1, 2, 70, 16, 8, True))
    both, alone = ab.cell("gated125", cpu)(), ab.cell("fwd:gated125", cpu)()
    assert len(both) == 4 and alone.shape == (1, 2, 70, 8) and alone.grad_fn is not None
    monkeypatch.setattr(gates, "SHAPES", [("tiny", 1, 2, 70, 16, 8)])
    for label in ("gates:tiny", "gamma:tiny", "fwd:gates:tiny"):
        o = ab.cell(label, cpu)()
        assert o.shape == (1, 2, 70, 8) and torch.isfinite(o).all(), label
    for bad in ("gates:nope", "fla:tiny"):
        with pytest.raises(ValueError, match="gates:<shape> or gamma:<shape>"):
            ab.cell(bad, cpu)


@pytest.mark.slow  # (a bench's plumbing, seconds interpreted: the full lane runs it)
def test_train_sweeps_are_the_steps_own_backward(monkeypatch):
    """``bench.train --sweeps`` times Chunk's step as three sweeps: called as listed there, they
    give the step's forward output and its gradients (the dual sweep dV and dC, the last dB),
    each pass count summing to 14 against the step's 11."""
    from conftest import KERNEL_DEVICE as DEVICE, INTERPRETED, tolerance

    from leetrepro.bench import train
    from leetrepro.methods.chunk import chunk_scan
    from leetrepro.reference import rel_error

    monkeypatch.setattr(train, "HEADS", 3)
    x = train.make_cell(torch.float32, 2, 77, DEVICE)
    for k in ("B", "C", "V"):  # a small r and d, as the interpreter takes them
        x[k] = x[k][..., :8].detach().clone().requires_grad_()
    x["dO"] = x["dO"][..., :8].contiguous()
    out = train.entries(["Chunk"])["Chunk"](x)
    grads = torch.autograd.grad(out, [x["B"], x["C"], x["V"]], x["dO"])
    plain = {k: v.detach() for k, v in x.items()}
    got = {name: call(plain, chunk_scan) for name, _, call in train.SWEEPS}
    tol = tolerance(torch.float32, tf32=not INTERPRETED)
    assert rel_error(got["forward"], out) <= tol
    dV, dC = got["dual"]
    for mine, want in ((got["dB"], grads[0]), (dC, grads[1]), (dV, grads[2])):
        assert rel_error(mine, want) <= tol
    assert sum(p for _, p, _ in train.SWEEPS) == 14


@pytest.mark.slow
def test_layouts_cell_times_every_layout_against_its_floor():
    """``bench.layouts``' cell on the CPU (Chunk under the interpreter): a forward and a forward +
    backward row per layout, each against its own floor and head-major's time in the cell."""
    from leetrepro.bench.layouts import LAYOUTS, floor_bytes, measure_cell
    rows = measure_cell(torch.float32, 2, 40, 8, 16, 2, LAYOUTS, 2, 1e9, torch.device("cpu"))
    assert len(rows) == 2 * len(LAYOUTS) and all(r["status"] == "ok" for r in rows)
    assert {(r["entry"], r["pass"]) for r in rows} == {(x, p) for x in LAYOUTS
                                                        for p in ("fwd", "fwd_bwd")}
    for r in rows:
        floor = floor_bytes(r["pass"], 2, 2, 40, 8, 16, 4) / 1e9 * 1e3
        assert r["floor_ms"] == pytest.approx(floor) and r["floor_ratio"] == r["ms"] / floor
        assert r["mode"] == "eager" and r["vs_fla"] is None
        if r["entry"] == "head-major":
            assert r["vs_head_major"] == 1.0
    assert floor_bytes("fwd", 1, 1, 1, 128, 128, 2) == 2 * 256 * 2
    assert floor_bytes("fwd_bwd", 1, 1, 1, 128, 128, 2) == 11 * 128 * 2


def test_interleaved_medians_can_call_each_round_in_its_own_order():
    """``shuffle``: every entry timed once a round, the rounds in different orders (seeded), so
    that no entry always follows the same other; without it, the entries' order every round."""
    from leetrepro.bench.harness import interleaved_medians
    order = []
    fns = {k: (lambda k=k: order.append(k)) for k in "abcd"}
    times = interleaved_medians(fns, [()], 6, torch.device("cpu"), warmup=0, shuffle=True)
    assert set(times) == set("abcd") and all(t >= 0 for t in times.values())
    rounds = [tuple(order[i:i + 4]) for i in range(0, 24, 4)]
    assert all(sorted(r) == list("abcd") for r in rounds) and len(set(rounds)) > 1
    predecessors = {rounds[i][rounds[i].index("b") - 1] for i in range(6) if rounds[i][0] != "b"}
    assert len(predecessors) > 1
    order.clear()
    interleaved_medians(fns, [()], 3, torch.device("cpu"), warmup=0)
    assert "".join(order) == "abcd" * 3


def test_layouts_compare_auto_with_the_fastest_named_method_in_its_layout_and_pass():
    """``vs_best``: a row's time over the fastest method named (not auto, not fla) in the same
    layout and pass; ``vs_head_major`` over the same method's head-major time."""
    from leetrepro.bench.layouts import compare
    rows = [dict(entry=e, method=m, **{"pass": p}, ms=t) for e, m, p, t in (
        ("model", "auto", "fwd", 1.05), ("model", "Chunk", "fwd", 1.0), ("model", "LA", "fwd", 3.0),
        ("model", "auto", "fwd_bwd", 2.0), ("model", "LA", "fwd_bwd", 1.6),
        ("model", "Chunk", "fwd_bwd", None), ("head-major", "auto", "fwd", 0.5),
        ("fla", "fla", "fwd", 0.7))]
    compare(rows)
    got = {(r["entry"], r["method"], r["pass"]): r for r in rows}
    assert got[("model", "auto", "fwd")]["vs_best"] == pytest.approx(1.05)
    assert got[("model", "LA", "fwd")]["vs_best"] == pytest.approx(3.0)
    assert got[("model", "auto", "fwd_bwd")]["vs_best"] == pytest.approx(1.25)  # Chunk: no time
    assert got[("model", "Chunk", "fwd_bwd")]["vs_best"] is None
    assert got[("head-major", "auto", "fwd")]["vs_best"] is None  # nothing named in that layout
    assert got[("model", "auto", "fwd")]["vs_head_major"] == pytest.approx(2.1)
    assert got[("model", "auto", "fwd")]["vs_fla"] == pytest.approx(1.5)


@pytest.mark.slow  # (a bench's plumbing, seconds interpreted: the full lane runs it)
def test_layer_with_one_fused_projection_computes_the_same_layer():
    """``bench.layer``: the layer with one projection cut by ``split_projection`` is the layer
    with three (their weights stacked), forward and gradients; its cell rows on the CPU."""
    from leetrepro.bench.layer import Layer, make_op, measure_cell
    from leetrepro.bench.layouts import decays
    op = make_op("Chunk", decays(2))
    torch.manual_seed(0)
    sep, fused = Layer(2, 8, op), Layer(2, 8, op, fused=True)
    with torch.no_grad():
        fused.bcv.weight.copy_(torch.cat([sep.q.weight, sep.k.weight, sep.v.weight]))
        fused.o.weight.copy_(sep.o.weight)
    x = torch.randn(2, 33, 16)
    y1, y2 = sep(x), fused(x)
    torch.testing.assert_close(y1, y2, rtol=1e-5, atol=1e-5)
    g1 = torch.autograd.grad(y1.square().sum(), [sep.q.weight, sep.o.weight])
    g2 = torch.autograd.grad(y2.square().sum(), [fused.bcv.weight, fused.o.weight])
    torch.testing.assert_close(g2[0][:16], g1[0], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(g2[1], g1[1], rtol=1e-4, atol=1e-5)
    rows = measure_cell(torch.float32, 2, 8, 1, 24, ["auto", "Chunk", "Chunk-fused", "identity"],
                        2, torch.device("cpu"))
    assert all(r["status"] == "ok" and r["tokens_per_s"] > 0 for r in rows)
    assert all("op_share" in r and "op_ms" in r for r in rows
               if r["entry"] not in ("identity", "Chunk-fused"))


def test_the_identity_layer_runs_every_projections_backward():
    """The layer the operator's share is taken against keeps q and k in its graph: every weight
    gets a gradient (a copy of V alone left q's and k's projections out of the backward)."""
    from leetrepro.bench.layer import Layer, make_op
    layer = Layer(2, 8, make_op("identity", None))
    x = torch.randn(2, 5, 16, requires_grad=True)
    dy = torch.randn(2, 5, 16)
    grads = torch.autograd.grad(layer(x), [x] + list(layer.parameters()), dy)
    assert all(g is not None and g.abs().sum() > 0 for g in grads)
    assert len(grads) == 5  # x, q, k, v, o
    with pytest.raises(ValueError, match="r = d"):
        make_op("identity", None)(torch.randn(1, 2, 1, 3), torch.randn(1, 2, 1, 3),
                                  torch.randn(1, 2, 1, 4))


def test_segments_candidates_cover_each_hopper_width_and_mark_the_heuristic(monkeypatch):
    """``probes.segments``' candidates: every piece count's segment at each value-column width
    asked of the Hopper kernel (None: the widest), the heuristic's (segment, DC) among them; the
    portable kernel's without widths."""
    from leetrepro.probes import segments
    monkeypatch.setattr(segments, "sm_count", lambda device: 132)
    cands, default = segments.candidates(100000, 32, torch.bfloat16, True, "cpu", "hopper",
                                         (None, 64, 32))
    assert default == (25024, 128) and default in cands
    assert {dc for _, dc in cands} == {128, 64, 32}
    assert (100000, 32) in cands and all(s % 64 == 0 or s == 100000 for s, _ in cands)
    cands, default = segments.candidates(8192, 32, torch.bfloat16, False, "cpu", "portable")
    assert default in cands and {dc for _, dc in cands} == {None}


def test_gpu_check_runs_the_hopper_kernel_with_its_fewest_columns_where_it_can(monkeypatch):
    """The heads matrix's extra rows: Chunk's Hopper kernel with ``config``'s fewest value columns
    (32 in half precision, 64 in fp32) where that is fewer than its widest and the kernel can run
    (never here on the CPU)."""
    from leetrepro.bench import gpu_check
    from leetrepro.methods import get
    narrow = gpu_check.narrow_hopper_columns
    cpu = torch.device("cpu")
    assert narrow(get("Chunk"), (1, 2, 64, 128, 128), torch.bfloat16, cpu) is None
    patch_chunk(monkeypatch, "hopper_unfit", lambda *a, **k: None)
    assert narrow(get("Chunk"), (1, 2, 64, 128, 128), torch.bfloat16, cpu) == 32
    assert narrow(get("Chunk"), (1, 2, 64, 128, 128), torch.float32, cpu) == 64
    assert narrow(get("Chunk"), (1, 2, 64, 64, 64), torch.float32, cpu) is None
    assert narrow(get("LA_torch"), (1, 2, 64, 128, 128), torch.bfloat16, cpu) is None


def test_the_gpu_matrix_is_one_list_of_named_cases():
    """``gpu_check.matrix``: the cases ``make gpu-check`` records and ``pytest -m gpu`` runs, each
    with a unique id naming method, dtype, what and shape, grouped by method and dtype (the CSV is
    written as each group completes); the quick matrix has every method's forward, gradients and
    frozen subsets, the full one more shapes, the heads matrix the head shapes models use."""
    import inspect

    from leetrepro.bench import gpu_check
    from leetrepro.methods import methods
    torch_methods = [m for m in methods() if m.language == "torch"]
    dtypes = [torch.float32, torch.float16]
    quick = gpu_check.matrix(torch_methods, dtypes, torch.device("cpu"), quick=True, hopper_heads=True)
    full = gpu_check.matrix(torch_methods, dtypes, torch.device("cpu"))
    heads = gpu_check.matrix(torch_methods, dtypes, torch.device("cpu"), heads_only=True)
    for cases in (quick, full, heads):
        ids = [c.id for c in cases]
        assert len(ids) == len(set(ids))
        runs = [g for i, g in enumerate(c.group for c in cases) if i == 0 or cases[i - 1].group != g]
        assert len(runs) == len(set(runs))  # each group's cases contiguous
    assert len(quick) < len(full)
    assert any(c.id.startswith("LA_torch-float16-grads-B") for c in quick)
    assert any("-grads-BC-" in c.id for c in quick)               # a frozen subset
    assert not any("hopper" in c.id for c in quick)               # no sm_90 here
    assert any(c.id.endswith("-B2-H4-N1000-r64-d64") for c in heads)
    assert any(c.id.endswith("-B1-H2-N10000-r64-d64") for c in heads)
    for c in quick + full + heads:  # each takes exactly the rows and the provenance when it runs
        inspect.signature(c.run).bind(rows=[], meta={})
    assert not any(c.large for c in quick) and any(c.large for c in full)
    assert all(c.large == (c.shape[0] * c.shape[1] * c.shape[2] >= 2 ** 17) for c in full)


def test_the_gates_bench_entries_agree_in_both_layouts():
    """``bench.gates``' entries on the CPU at a tiny shape: the fused projection sliced in each
    step and three separate tensors give the same outputs (the layouts differ in what they cost,
    not in what they compute); each backward reaches every input it names (``autograd.grad``
    raises otherwise)."""
    from leetrepro.bench import gates
    outs = {}
    for layout in gates.LAYOUTS:
        torch.manual_seed(0)
        src, g, gamma = gates._inputs(2, 3, 40, 8, 6, "cpu", True, layout)
        dO = torch.randn(2, 40, 3, 6).to(torch.bfloat16).transpose(1, 2)
        B, C, V = gates._views(src, 8, 6)
        assert B.shape == (2, 3, 40, 8) and V.shape == (2, 3, 40, 6)
        if layout == "separate":  # the same numbers as the projection's slices, to compare
            x = outs["model"][0]
            for t, part in zip(src, x.split([8, 8, 6], -1)):
                t.data.copy_(part)
            g.data.copy_(outs["model"][1])
        entries = gates._entries(None, True, 8, 6)
        o = {name: fn(src, g, gamma, dO).float() for name, fn in entries.items()}
        outs[layout] = (src[0].detach(), g.detach(), o)
    for name in ("gamma", "gates"):
        torch.testing.assert_close(outs["separate"][2][name], outs["model"][2][name])
    assert not torch.equal(outs["model"][2]["gamma"], outs["model"][2]["gates"])


def test_ab_probe_times_a_model_s_steps_in_each_mode_asked(monkeypatch):
    """``probes.ab --lm``: a model's training step timed with each value of the switch, a row per
    round and value (a cell per mode; eager here, a tiny model in the 125M's place); CUDA graphs
    refused by name (their replays keep the value they were captured with)."""
    from leetrepro.bench import model as bm
    from leetrepro.probes import ab
    tiny = dict(vocab=64, dim=32, layers=1, heads=2, mlp=64, batch=1, seq=32,
                mamba=dict(headdim=16, d_state=16, ngroups=1))
    monkeypatch.setitem(bm.SIZES, "125M", tiny)
    switch = ab.Switch("methods.chunk.tables.GATE_FOLD_FUSED")
    rows = ab.lm_steps(switch, [False, True], ["leetrepro"], torch.device("cpu"), rounds=2,
                       steps=1)
    assert [(r["cell"], r["value"]) for r in rows] == [
        ("lm125 leetrepro", "False"), ("lm125 leetrepro", "True"),
        ("lm125 leetrepro", "True"), ("lm125 leetrepro", "False")]
    assert all(r["eager_ms"] > 0 for r in rows)
    with pytest.raises(ValueError, match="lm-modes"):
        ab.lm_steps(switch, [False], ["leetrepro"], torch.device("cpu"), modes=("graphs",))
