"""Chunk (chunk-scan), as flash-linear-attention keeps one test file per op: the portable Triton
kernel under TRITON_INTERPRET=1 against the oracle, its state-only kernel, its launch plan
(segments, the compiled-kernel cache), the choice of the Hopper kernel, and the Hopper kernel
compiled for sm_90 on the host with its register budget. Gradients: ``test_autograd.py``; packed
prompts and the decode step: ``test_serving.py``; on a GPU: ``make gpu-check``."""

import pytest
import torch

import leetrepro
from leetrepro import causal_linear_decoder
from leetrepro.methods import _gpu

from conftest import BF16, INTERPRETED, KERNEL_DEVICE as DEVICE, budgets_or_skip, check_kernel as _check, \
    make_inputs, patch_chunk, quick_lane, random_gammas, real_codegen, shape_id, tolerance

pytest.importorskip("triton", reason="Triton is not installed: `make install` brings it")
# a split of 37 rows into one 64-row segment and 37 whole (9 lanes fill the interpreter's 4
# stand-in SMs: the batch-16 path, ragged N), segments chained through the ring (the batch-1 path,
# a partial last segment), and r = 200 whose 256-row state splits d = 100 into two column blocks
CHUNK_CASES = [((2, 3, 37, 8, 5), None), ((3, 3, 37, 8, 5), None), ((1, 2, 300, 20, 33), 64),
               ((1, 1, 150, 200, 100), 64)]


@pytest.mark.parametrize("shape, segment", CHUNK_CASES, ids=shape_id)
@pytest.mark.parametrize("decay", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16,
                                   BF16])
def test_chunk_scan_triton(shape, segment, decay, dtype):
    _check("Chunk", shape, dtype, decay, segment=segment)


@pytest.mark.parametrize("shape, segment", CHUNK_CASES, ids=shape_id)
@pytest.mark.parametrize("reverse", quick_lane([False, True]))
@pytest.mark.parametrize("dtype", quick_lane([torch.float32, torch.float16, BF16], keep=(0, 2)))
def test_chunk_state_triton(shape, segment, reverse, dtype):
    # the state alone (sequence parallelism's extra pass): per-head γ, segments, column blocks
    from leetrepro.methods.chunk import chunk_state

    B, C, V = make_inputs(*shape, dtype=dtype, device=DEVICE, seed=sum(shape) + 1)
    g = random_gammas(shape[1], seed=shape[2], low=0.9).to(DEVICE)
    rows, vals = (C.flip(2), V.flip(2)) if reverse else (C, V)
    for gamma in (None, g):
        got = chunk_state(C, V, gamma, reverse=reverse, segment=segment,
                          fp32_precision="ieee" if INTERPRETED else None)
        _, want = leetrepro.reference(B, rows, vals, gamma, output_final_state=True)
        tol = tolerance(dtype, tf32=not INTERPRETED)
        assert got.dtype == torch.float32 and got.shape == want.shape
        assert leetrepro.rel_error(got, want) <= tol
        # time-major views (a sequence-parallel rank's slices as a model gives them): read in
        # place, the same arithmetic
        tm = [t.transpose(1, 2).contiguous().transpose(1, 2) for t in (C, V)]
        assert torch.equal(chunk_state(*tm, gamma, reverse=reverse, segment=segment,
                                       fp32_precision="ieee" if INTERPRETED else None), got)
    if shape[1] % 2 == 0 and reverse:  # C in groups of two heads, read in place: each head's
        # state as the same call on C expanded gives it (the backward's pass: the full lane)
        grouped = C[:, ::2]
        want = chunk_state(grouped.repeat_interleave(2, 1), V, g, reverse=reverse,
                           segment=segment, fp32_precision="ieee" if INTERPRETED else None)
        assert torch.equal(chunk_state(grouped, V, g, reverse=reverse, segment=segment,
                                       fp32_precision="ieee" if INTERPRETED else None), want)


def test_chunk_kernel_option_names_what_rules_the_hopper_kernel_out():
    """``kernel="hopper"`` where the Hopper kernel cannot run is a ValueError that says why;
    ``"auto"`` then runs the portable kernel, as ``"portable"`` does; anything else is refused."""
    from leetrepro.methods.chunk import hopper_unfit

    B, C, V = make_inputs(1, 2, 70, 16, 16, dtype=torch.float16, device=DEVICE, seed=8)
    # (on a GPU the head dimensions rule it out, interpreted the device)
    why = "it needs a CUDA GPU" if INTERPRETED else "it needs r and d each 64, 128 or 256"
    with pytest.raises(ValueError, match=f"kernel='hopper' cannot run this call: {why}"):
        causal_linear_decoder(B, C, V, None, method="Chunk", kernel="hopper")
    auto = causal_linear_decoder(B, C, V, None, method="Chunk")
    assert torch.equal(auto, causal_linear_decoder(B, C, V, None, method="Chunk", kernel="portable"))
    with pytest.raises(ValueError, match="kernel"):
        causal_linear_decoder(B, C, V, None, method="Chunk", kernel="sm90")
    assert ("CUDA" if INTERPRETED else "r and d") in hopper_unfit(B, C, V, None)


def test_hopper_split_cuts_segments_to_fill_the_sms_and_takes_fewer_columns_only_when_asked():
    """The Hopper kernel's split of a call (DC value columns a program, rows per segment): the
    widest DC, N cut so that the units fill their waves of SMs (none once they fill two), the
    caller's segment in 64-row blocks, none of the default's under eight tiles; ``config``'s DC
    where the tiles allow it, never for the dual output (one program holds the whole state); a
    DC it cannot take is a ValueError."""
    from leetrepro.methods.chunk import hopper_split
    split = lambda **kw: hopper_split(**dict(dict(r=128, d=128, dtype=torch.bfloat16, dual=False,  # noqa: E731
                                                   lanes=32, n=100000, slots=132), **kw))
    assert split() == (128, 25024)  # 32 units: 4 segments a lane fill one wave
    assert split(lanes=512) == (128, 100000)  # the lanes alone fill the GPU
    assert split(dc=32) == (32, 100000)  # 128 units: one pass
    assert split(dc=64) == (64, 50048)
    assert split(dc=32, dual=True) == (128, 25024)
    assert split(segment=1000) == (128, 1024) and split(segment=4096, dc=64) == (64, 4096)
    assert split(r=256, d=256) == (64, 100000)  # 4 units a lane: 128 programs
    # no default segment under eight 64-row tiles: 16 lanes at N = 2048 in 4 segments, not 8
    assert split(lanes=16, n=2048) == (128, 512) and split(lanes=16, n=16384) == (128, 2048)
    assert split(lanes=16, n=300) == (128, 300) and split(lanes=8, n=4096) == (128, 512)
    for dc in (48, 256):
        with pytest.raises(ValueError, match=f"DC={dc} is invalid"):
            split(dc=dc)
    with pytest.raises(ValueError, match="DC=128 is invalid at r = 256"):
        split(r=256, d=256, dc=128)


def test_the_row_weights_refuse_a_sweep_they_do_not_fit():
    """``chunk_scan``'s ``rows``: V's row weights and the skip ``(w, D)`` need a gated forward
    sweep; with the row dots ``(w, D, RD)`` a gated reverse sweep with the dual output. A call
    that is neither is refused with what it needs, before any launch."""
    from leetrepro.methods import chunk
    B, C, V = make_inputs(1, 2, 40, 8, 8, dtype=torch.float32, device=DEVICE, seed=3)
    g = -torch.rand(1, 2, 40, device=DEVICE)
    w, D = torch.rand(1, 2, 40, device=DEVICE), torch.rand(2, device=DEVICE)
    rd = torch.empty(2, 1, 2, 40, device=DEVICE)
    with pytest.raises(ValueError, match="gated forward sweep"):
        chunk.chunk_scan(B, C, V, None, g=g, reverse=True, rows=(w, D))
    with pytest.raises(ValueError, match="reverse sweep with the dual output"):
        chunk.chunk_scan(B, C, V, None, g=g, rows=(w, D, rd))
    with pytest.raises(ValueError, match="reverse sweep with the dual output"):
        chunk.chunk_scan(B, C, V, None, g=g, reverse=True, rows=(w, D, rd))


def test_misaligned_names_what_the_hopper_kernel_s_tma_refuses():
    """``chunk.misaligned``, which the Hopper kernel's operand checks and the SSD's rows in the
    sweep (``rows_unfit``: x is a slice of the block's convolution output) read: a base or a
    stride but the last that is not a multiple of 16 bytes; time-major views of dense rows
    pass."""
    from leetrepro.methods.chunk import misaligned
    dense = torch.empty(2, 10, 3, 8, dtype=torch.bfloat16)
    assert not misaligned(dense) and not misaligned(dense.transpose(1, 2))
    assert misaligned(torch.empty(2, 10, 3, 9, dtype=torch.bfloat16)[..., :8])  # (18-byte rows)
    assert misaligned(torch.empty(64, dtype=torch.bfloat16)[1:9])  # (a base 2 bytes in)


def test_hopper_kernel_takes_fp32_through_tf32_only_and_without_the_dual_output():
    """fp32 runs the Hopper kernel through tf32 wgmma (the default ``fp32_precision``); the exact
    precisions, the dual output in fp32, other ranks and packed sequences stay the portable
    kernel's, each refusal naming its reason."""
    from leetrepro.methods.chunk import hopper_operand_unfit

    B, C, V = make_inputs(1, 2, 70, 128, 128, dtype=torch.float32, device=DEVICE, seed=8)
    assert hopper_operand_unfit(B, C, V) is None
    assert hopper_operand_unfit(*(t.half() for t in (B, C, V)), dual=V.half()) is None
    assert "tf32 only, got fp32_precision='tf32x3'" in hopper_operand_unfit(B, C, V,
                                                                            precision="tf32x3")
    assert "dual output takes float16/bfloat16" in hopper_operand_unfit(B, C, V, dual=V)
    assert hopper_operand_unfit(B[..., :64], C[..., :64], V) is None  # r = 64, d = 128
    assert "r and d each 64, 128 or 256, got r = 48" in hopper_operand_unfit(B[..., :48],
                                                                            C[..., :48], V)
    half = [t.half() for t in (B, C, V)]
    assert "dual output needs r = d ≤ 128" in hopper_operand_unfit(
        half[0][..., :64], half[1][..., :64], half[2], dual=half[2])
    wide = torch.zeros(1, 1, 64, 256)
    assert "do not fit shared memory" in hopper_operand_unfit(wide, wide, V)  # fp32 at r = 256
    assert hopper_operand_unfit(wide.half(), wide.half(), V.half()) is None
    assert "float64" in hopper_operand_unfit(B.double(), C.double(), V.double())
    cu = torch.tensor([0, 30, 70], dtype=torch.int32)
    assert "cu_seqlens" in hopper_operand_unfit(B, C, V, cu_seqlens=cu)
    shifted = torch.empty(1, 2, 70, 129)[..., 1:]  # a base 4 bytes off a 16-byte boundary
    assert "V's base and strides" in hopper_operand_unfit(B, C, shifted)


def test_dual_output_as_two_sweeps_equals_the_dual_sweep(monkeypatch):
    """Where the Hopper kernel takes the plain sweeps but not the dual output (r ≠ d, fp32),
    Chunk runs a dual call as two sweeps, O's and the dual output's (with the initial state
    transposed): the same O, dual output and final state as one dual sweep, in reverse time with
    a state in (the backward's call). Run here on the portable kernel with the switch forced."""
    from leetrepro.methods import chunk

    B, C, V = make_inputs(2, 3, 70, 16, 8, dtype=torch.float32, device=DEVICE, seed=5)
    E = torch.randn_like(V)
    g = torch.tensor([0.9, 1.0, 0.99], dtype=torch.float64, device=DEVICE)
    S0 = torch.randn(2, 3, 16, 8, device=DEVICE)
    call = dict(dual=E, initial_state=S0, output_final_state=True, reverse=True)
    (o, o2), s = chunk.chunk_scan(B, C, V, g, **call)
    monkeypatch.setattr(chunk.plans, "_dual_apart", lambda *args: True)
    (p, p2), t = chunk.chunk_scan(B, C, V, g, **call)
    for got, want in ((p, o), (p2, o2), (t, s)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert p2.shape == B.shape and not torch.equal(p2, torch.zeros_like(p2))


def test_dual_output_runs_apart_only_where_the_hopper_kernel_would_run_both_sweeps(monkeypatch):
    """The dual call splits into two sweeps only where the Hopper kernel takes the plain sweeps but
    not the dual output, and would run them: asked for (``kernel="hopper"``, ``force_kernel``),
    or for ``"auto"`` where the measured table picks it in the call's regime; never when the
    portable kernel is asked for (two portable sweeps lose to its one dual sweep)."""
    from leetrepro.methods import chunk

    B, C, V = make_inputs(1, 2, 70, 16, 8, dtype=torch.float32, device=DEVICE, seed=5)
    unfit = {"dual": "its dual output needs r = d", "plain": None}
    patch_chunk(monkeypatch, "hopper_unfit",
                lambda *a, dual=None, **k: unfit["dual"] if dual is not None else unfit["plain"])
    wins = {"value": False}
    patch_chunk(monkeypatch, "hopper_wins", lambda *a, **k: wins["value"])
    apart = lambda kernel: chunk.plans._dual_apart(B, C, V, V, None, kernel, None)  # noqa: E731
    assert not apart("auto") and apart("hopper") and not apart("portable")
    wins["value"] = True
    assert apart("auto") and not apart("portable")
    chunk.force_kernel("portable")
    try:
        assert not apart("auto")
    finally:
        chunk.force_kernel(None)
    unfit["plain"] = "it needs r and d each 64, 128 or 256"  # the plain sweeps unfit too
    assert not apart("hopper")


def test_kernel_table_takes_the_hopper_kernel_only_where_it_won_every_shape():
    """``make tune``'s choice of Chunk's kernel per (kind, mask, regime): Hopper only where it was
    faster at every shape of the regime (one pass; segments at long N; segments at short
    N, where host time weighs); the table's provenance is the run's."""
    import pandas as pd

    from leetrepro.bench.sweep import kernel_table
    from leetrepro.methods.chunk import regime
    from leetrepro.methods.chunk.tables import SHORT_SPLIT_N

    rows = [dict(kind="half", decay=d, split=sp, N=n, portable_ms=p, hopper_ms=h, gpu="test",
                 commit="abc")
            for d, sp, n, p, h in [(False, False, 25600, 5.0, 3.7), (False, False, 25600, 5.0, 5.1),
                                   (True, False, 25600, 5.8, 3.7), (False, True, 100000, 1.6, 1.4),
                                   (False, True, 8192, 0.22, 0.27), (True, True, 100000, 1.8, 1.5),
                                   (True, True, 8192, 0.24, 0.2)]]
    table = kernel_table(pd.DataFrame(rows))
    got = {(r.kind, r.decay, r.regime): r.kernel for r in table.itertuples()}
    assert got == {("half", False, "one"): "portable", ("half", True, "one"): "hopper",
                   ("half", False, "split"): "hopper", ("half", False, "split-short"): "portable",
                   ("half", True, "split"): "hopper", ("half", True, "split-short"): "hopper"}
    assert table.speedup.gt(0).all() and (table.gpu == "test").all() and (table.commit == "abc").all()
    assert regime(False, 10) == "one" and regime(True, SHORT_SPLIT_N) == "split"
    assert regime(True, SHORT_SPLIT_N - 1) == "split-short"
    # the backward's dual sweep has its own rows, decided apart from the forward's
    dual = pd.DataFrame([dict(r, dual=False) for r in rows] +
                        [dict(kind="half", decay=False, split=False, dual=True, N=25600,
                              portable_ms=9.0, hopper_ms=8.0, gpu="test", commit="abc")])
    got = {(r.kind, r.decay, r.regime): r.kernel for r in kernel_table(dual).itertuples()}
    assert got[("half", False, "dual-one")] == "hopper" and got[("half", False, "one")] == "portable"
    assert regime(True, SHORT_SPLIT_N, dual=True) == "dual-split"


def _kernel_table_in_use(table, tmp_path, monkeypatch):
    """``table`` written where Chunk's kernel choice reads this GPU's (the caller clears
    ``tuning``'s cache once done); its path."""
    from leetrepro import tuning
    path = tmp_path / "chunk_kernel.csv"
    table.to_csv(path, index=False)
    patch_chunk(monkeypatch, "gpu_tag", lambda device: "test-gpu")
    monkeypatch.setattr(tuning, "path", lambda tag, name: str(path))
    tuning.clear()
    return path


def test_kernel_table_has_rows_per_head_shape_and_the_kernel_choice_reads_them(tmp_path,
                                                                              monkeypatch):
    """Each head shape has its own rows in the kernel table (the state split over programs and the
    dual call's two sweeps change the balance); the choice reads the call's shape, falls back to
    r = d = 128's rows for a shape not measured (and for tables measured before the shapes were),
    and a dual call without its own row reads the plain sweep's."""
    import pandas as pd

    from leetrepro.bench.sweep import head_shapes, kernel_table
    from leetrepro.methods import chunk

    rows = [dict(kind="half", decay=True, split=False, dual=du, r=r, d=d, N=25600, portable_ms=p,
                 hopper_ms=h, gpu="test", commit="abc")
            for r, d, du, p, h in [(128, 128, False, 5.0, 4.0), (64, 64, False, 2.0, 2.5),
                                   (128, 64, True, 3.0, 2.0)]]
    table = kernel_table(pd.DataFrame(rows))
    got = {(t.regime, t.r, t.d): t.kernel for t in table.itertuples()}
    assert got == {("one", 128, 128): "hopper", ("one", 64, 64): "portable",
                   ("dual-one", 128, 64): "hopper"}
    path = _kernel_table_in_use(table, tmp_path, monkeypatch)
    from leetrepro import tuning
    try:
        wins = lambda r, d, dual=False: chunk.hopper_wins(  # noqa: E731
            None, torch.bfloat16, True, False, 25600, dual, r, d)
        assert wins(128, 128) and not wins(64, 64)     # each shape its own row
        assert wins(256, 256)                          # not measured: 128/128's row
        assert wins(128, 64, dual=True)                # the dual row
        assert not wins(64, 64, dual=True)             # no dual row: the plain sweep's
        # a table from before the shapes: no r, d columns, every row 128/128's
        old = table[(table.r == 128) & (table.d == 128)].drop(columns=["r", "d"])
        old.to_csv(path, index=False)
        tuning.clear()  # the one invalidation after a table is rewritten
        assert wins(64, 64) and wins(128, 128)
    finally:
        monkeypatch.undo()
        tuning.clear()
    assert [s[:2] for s in head_shapes(["64x64", "128x256"])] == [(64, 64), (128, 256)]
    with pytest.raises(ValueError, match="--heads 96x96"):
        head_shapes(["96x96"])


def test_a_micro_batch_has_its_own_kernel_rows_and_each_one_pass_regime_falls_back_to_the_other(
        tmp_path, monkeypatch):
    """One pass per lane over fewer lanes than a few waves of SMs (a training micro-batch) is a
    regime of its own: at r = d = 64 the two kernels tie over 1024 lanes while the Hopper kernel
    is 1.3-1.95× faster over 128-320 (H200, NOTES.md). Each one-pass regime without rows of its
    own reads the other's (tables from before the regime; head shapes whose every measured shape
    had few lanes); blank ``few`` cells (older rows merged with newer) are many lanes."""
    import pandas as pd

    from leetrepro.bench.sweep import kernel_table
    from leetrepro.methods import chunk

    assert chunk.regime(False, 4096, few=True) == "one-few"
    assert chunk.regime(False, 4096, dual=True, few=True) == "dual-one-few"
    assert chunk.regime(True, 4096, few=True) == "split-short"   # (segments: lanes are filled)
    sms = _gpu.sm_count("cpu")
    assert chunk.few_lanes(chunk.tables.FEW_LANES_WAVES * sms - 1, "cpu")
    assert not chunk.few_lanes(chunk.tables.FEW_LANES_WAVES * sms, "cpu")
    rows = [dict(kind="half", decay=True, split=False, dual=False, few=fw, r=r, d=d, N=n,
                 portable_ms=p, hopper_ms=h, gpu="test", commit="abc")
            for r, d, fw, n, p, h in [(64, 64, False, 25600, 2.0, 2.02), (64, 64, True, 4096, 0.45, 0.34),
                                      (128, 256, True, 25600, 5.0, 3.0)]]
    rows.append(dict(rows[0], few=None, r=128, d=128, portable_ms=5.0, hopper_ms=4.0))
    table = kernel_table(pd.DataFrame(rows))
    got = {(t.regime, t.r, t.d): t.kernel for t in table.itertuples()}
    assert got == {("one", 64, 64): "portable", ("one-few", 64, 64): "hopper",
                   ("one-few", 128, 256): "hopper", ("one", 128, 128): "hopper"}
    _kernel_table_in_use(table, tmp_path, monkeypatch)
    from leetrepro import tuning
    try:
        wins = lambda r, d, few: chunk.hopper_wins(  # noqa: E731
            None, torch.bfloat16, True, False, 4096, False, r, d, few)
        assert wins(64, 64, True) and not wins(64, 64, False)     # each its own row
        assert wins(128, 256, False) and wins(128, 128, True)      # the other regime's row
    finally:
        monkeypatch.undo()
        tuning.clear()


def test_fp16_and_bf16_and_grouped_b_and_c_each_have_their_own_kernel_rows(tmp_path, monkeypatch):
    """The Hopper kernel keeps an fp16 state in range with a scale a chunk that bf16 does not
    need, and reads B and C in groups once for all heads where the portable kernel's loop does
    not change: the table decides each dtype, and a micro-batch's grouped B and C, apart (H200:
    at 64 × 64 fp16 0.8× the portable kernel where bf16 is 1.1-1.3×, NOTES.md). A grouped call
    without rows of its own reads a head each's; a table without a dtype column, one row for
    both dtypes."""
    import pandas as pd

    from leetrepro.bench.sweep import kernel_table
    from leetrepro.methods import chunk

    assert chunk.regime(False, 4096, few=True, grouped=True) == "one-few-groups"
    assert chunk.regime(True, 100000, grouped=True) == "split"   # (segments: no grouped rows)
    rows = [dict(kind="half", dtype=dt, decay=True, split=False, dual=False, few=True, groups=gr,
                 r=64, d=64, N=4096, portable_ms=p, hopper_ms=h, gpu="test", commit="abc")
            for dt, gr, p, h in [("float16", 0, 0.22, 0.26), ("bfloat16", 0, 0.23, 0.22),
                                 ("float16", 1, 0.33, 0.25), ("bfloat16", 1, 0.20, 0.26)]]
    table = kernel_table(pd.DataFrame(rows))
    got = {(t.dtype, t.regime): t.kernel for t in table.itertuples()}
    assert got == {("float16", "one-few"): "portable", ("bfloat16", "one-few"): "hopper",
                   ("float16", "one-few-groups"): "hopper",
                   ("bfloat16", "one-few-groups"): "portable"}
    path = _kernel_table_in_use(table[table.regime == "one-few"], tmp_path, monkeypatch)
    from leetrepro import tuning
    try:
        wins = lambda dtype, grouped: chunk.hopper_wins(  # noqa: E731
            None, dtype, True, False, 4096, False, 64, 64, True, grouped)
        assert wins(torch.bfloat16, False) and not wins(torch.float16, False)
        assert wins(torch.bfloat16, True)       # no grouped rows: a head each's
        table.to_csv(path, index=False)
        tuning.clear()
        assert wins(torch.float16, True) and not wins(torch.bfloat16, True)
        table[table.dtype == "float16"].drop(columns=["dtype"]).to_csv(path, index=False)
        tuning.clear()  # a table from before the dtype column: the kind's one row for both
        assert wins(torch.bfloat16, True) and not wins(torch.bfloat16, False)
    finally:
        monkeypatch.undo()
        tuning.clear()


def test_a_kernel_sweep_of_some_kinds_and_head_shapes_replaces_only_what_it_measured(tmp_path):
    """``sweep --kinds half --heads 64x64`` replaces the half rows of 64 × 64 and keeps the rest:
    tf32's rows of 64 × 64 and every row of other head shapes, digit for digit."""
    import pandas as pd

    from leetrepro.bench.sweep import write_rows

    path = tmp_path / "t.csv"
    pd.DataFrame([dict(kind=k, r=r, d=r, ms=v) for k, r, v in
                  [("half", 64, "1.25"), ("tf32", 64, "2.5"), ("half", 128, "3.125")]]
                 ).to_csv(path, index=False)
    write_rows(pd.DataFrame([dict(kind="half", r=64, d=64, ms=9.0)]), str(path), ["half"],
               {(64, 64)})
    got = pd.read_csv(path, dtype=str)
    assert sorted(zip(got.kind, got.r, got.ms)) == [("half", "128", "3.125"), ("half", "64", "9.0"),
                                                    ("tf32", "64", "2.5")]


def test_segments_fill_the_last_wave_of_programs():
    """Chunk's default split at small batch·heads (one program per SM): the fewest segments per
    lane whose programs use 90 % of their waves' slots, as measured best on 132 SMs; N whole
    from twice as many lanes as SMs; segments a multiple of the row block."""
    from leetrepro.methods._gpu import segment_rows, wave_pieces
    assert [wave_pieces(lanes, 132) for lanes in (16, 32, 64, 128, 192)] == [8, 4, 2, 1, 2]
    assert segment_rows(100000, 32, 64, 132) == 25024          # 4 segments of 391 blocks
    assert segment_rows(100000, 264, 64, 132) == 100000
    assert segment_rows(100, 32, 64, 132) == 64                  # never below one row block
    for lanes in range(1, 264):
        p = wave_pieces(lanes, 132)
        assert lanes * p >= 0.9 * 132 * -(-lanes * p // 132)
    # LA's split by the same rule: 4 programs per SM, segments of at least 1024 rows
    assert segment_rows(100000, 64, 64, 4 * 132, min_rows=1024) == 12544  # 8 segments
    assert segment_rows(3000, 64, 64, 4 * 132, min_rows=1024) == 1536     # 2, not 8
    assert segment_rows(1000, 64, 64, 4 * 132, min_rows=1024) == 1000     # N whole


@pytest.mark.parametrize("self_repair", [True, False], ids=["in-launch", "repair-launch"])
@pytest.mark.slow  # (seconds a case: the full lane runs it)
@pytest.mark.parametrize("segment, row", [(None, 70), (32, 5), (32, 70), (32, 140)])
@pytest.mark.parametrize("reverse", [False, True])
def test_chunk_non_finite_rows_repaired_in_the_launch_or_by_a_second(monkeypatch, self_repair,
                                                                     segment, row, reverse):
    """A NaN in one lane's C: short calls repair within their launch (the segment holding the first
    non-finite row computes its rows again, its entering state from the rows before it), long ones
    through the flagged lanes' repair launch. Either way: the other lanes exact, the bad lane's
    rows before the NaN exact, every later row and its final state non-finite, and with the dual
    output too; the initial state read by both. The counters are left zero for the next call."""
    from leetrepro.methods import chunk
    from leetrepro.reference import reference, rel_error

    monkeypatch.setattr(chunk.tables, "SELF_REPAIR_ROWS", 1 << 30 if self_repair else 0)
    b, h, n, r, d = 2, 2, 150, 8, 8
    B, C, V, E = (t.to(DEVICE) for t in make_inputs(b, h, n, r, d, seed=5)[:3]
                  + (torch.randn(b, h, n, d),))
    s0 = torch.randn(b, h, r, d, device=DEVICE)
    g = torch.tensor([0.9, 0.97], dtype=torch.float64, device=DEVICE)
    C[0, 1, row, 2] = float("nan")
    (o, o2), sn = chunk.chunk_scan(B, C, V, g, segment=segment, reverse=reverse, dual=E,
                                   initial_state=s0, output_final_state=True, kernel="portable")

    def ref(x, y, z, s):
        x, y, z = (t.flip(2) if reverse else t for t in (x, y, z))
        out, state = reference(x.double(), y.double(), z.double(), g, initial_state=s.double(),
                               output_final_state=True)
        return (out.flip(2) if reverse else out), state
    want, want_sn = ref(B, C, V, s0)
    want2, _ = ref(E, V, C, s0.transpose(-1, -2))
    tol = tolerance(torch.float32, tf32=not INTERPRETED)
    rows = torch.arange(n, device=DEVICE)
    before = rows > row if reverse else rows < row
    for got, exact in ((o, want), (o2, want2)):
        for lane in ((0, 0), (1, 0), (1, 1)):
            assert rel_error(got[lane], exact[lane]) <= tol, lane
        assert rel_error(got[0, 1][before], exact[0, 1][before]) <= tol
        assert (~torch.isfinite(got[0, 1][~before])).any(-1).all()
    assert (~torch.isfinite(sn[0, 1])).any()
    assert rel_error(sn[1], want_sn[1]) <= tol and rel_error(sn[0, 0], want_sn[0, 0]) <= tol
    # the launches leave the ring's flags, the ticket and the repair flags zero, so the next call
    # takes the same counters as they are, and answers the same
    assert chunk.plans._COUNTERS or (segment is None and self_repair)  # (one launch, no counters)
    assert all(not buf.any() for buf, _ in chunk.plans._COUNTERS.values())
    (p, p2), tn = chunk.chunk_scan(B, C, V, g, segment=segment, reverse=reverse, dual=E,
                                   initial_state=s0, output_final_state=True, kernel="portable")
    for got, first in ((p, o), (p2, o2), (tn, sn)):
        torch.testing.assert_close(got, first, rtol=0, atol=0, equal_nan=True)


def test_chunk_in_launch_repair_refused_for_shared_memory_falls_back_to_a_repair_launch(
        monkeypatch):
    """Where the in-launch repair's tiles do not fit the GPU's shared memory (fp32 with the decay
    in 64-row blocks on sm_90: Triton's loader raises OutOfResources before anything runs), the
    call flags lanes for a repair launch instead, with the same answer, and that signature keeps
    the repair launch from then on; any other error, and the same error from a launch without the
    in-launch repair, reach the caller."""
    from triton.runtime.errors import OutOfResources

    from leetrepro.methods import chunk
    from leetrepro.reference import reference, rel_error

    launches = []
    real = chunk.plans.launch

    def refusing(kernel, grid, arguments, key=None, **options):
        in_launch = arguments["RING"][2] is None and not arguments["REPAIR"]
        launches.append("in-launch" if in_launch else "flags" if not arguments["REPAIR"] else "repair")
        if in_launch:
            raise OutOfResources(262400, 232448, "shared memory")
        return real(kernel, grid, arguments, key, **options)

    patch_chunk(monkeypatch, "launch", refusing)
    monkeypatch.setattr(chunk.plans, "_PLANS", {})  # (no plan of this signature from other tests)
    B, C, V = (t.to(DEVICE) for t in make_inputs(2, 3, 77, 8, 5, seed=11)[:3])
    g = torch.tensor([0.9, 1.0, 0.5], dtype=torch.float64, device=DEVICE)
    C[1, 2, 40, 3] = float("inf")
    o, sn = chunk.chunk_scan(B, C, V, g, output_final_state=True, kernel="portable")
    assert launches == ["in-launch", "flags", "repair"]
    want, want_sn = reference(B.double(), C.double(), V.double(), g, output_final_state=True)
    tol = tolerance(torch.float32, tf32=not INTERPRETED)
    assert rel_error(o[0], want[0]) <= tol and rel_error(sn[0], want_sn[0]) <= tol
    assert rel_error(o[1, 2, :40], want[1, 2, :40]) <= tol
    assert (~torch.isfinite(o[1, 2, 40:])).any(-1).all()
    launches.clear()
    chunk.chunk_scan(B, C, V, g, kernel="portable")  # another signature (no final state)
    assert launches == ["in-launch", "flags", "repair"]
    launches.clear()
    chunk.chunk_scan(B, C, V, g, output_final_state=True, kernel="portable")
    assert launches == ["flags", "repair"]  # remembered: no second refusal

    def failing(error):
        def fail(*args, **kwargs):
            raise error
        return fail
    patch_chunk(monkeypatch, "launch", failing(OutOfResources(1, 0, "shared memory")))
    monkeypatch.setattr(chunk.tables, "SELF_REPAIR_ROWS", 0)  # no in-launch repair to give up
    with pytest.raises(OutOfResources):
        chunk.chunk_scan(B, C, V, g, kernel="portable")
    patch_chunk(monkeypatch, "launch", failing(RuntimeError("other")))
    monkeypatch.setattr(chunk.tables, "SELF_REPAIR_ROWS", 1 << 30)
    with pytest.raises(RuntimeError, match="other"):
        chunk.chunk_scan(B, C, V, None, kernel="portable")


def test_chunk_scan_rejects_a_ragged_segment():
    with pytest.raises(ValueError, match="multiple of"):
        _check("Chunk", CHUNK_CASES[2][0], torch.float32, False, segment=100)


@pytest.mark.slow
def test_hopper_kernel_compiles_for_sm90_within_its_register_budget():
    """The warp-specialised Hopper forward (Gluon) compiled for sm_90 on the host, as it launches
    (one pass per lane, and segments chained through the ring; forward and in reverse time, and
    the reverse sweep with the dual output: the backward's sweeps; fp32 through tf32, forward and
    reverse), at r = d = 128 in every variant and at the other head shapes it takes (64, 128, 256;
    d ≠ r) in their largest (decay, segments): 168 registers a thread at launch (the partitions'
    own budgets set by setmaxnreg; at r = d = 128 the consumers' staging buffers addressed where
    they are used, ``chunk.tables.HOPPER_UNHOISTED``); spills: none with the 0-1 mask, at most 128
    bytes a thread with the decay (the consumer's scalars; the profile reads them as L1 hits),
    also with fewer value columns a program (``config``'s DC: 32 in bf16, 64 in fp32); the dual
    sweep holds two more products a chunk: at most 80 bytes (fp16's two scales) with the 0-1
    mask, 272 with the decay (NOTES.md: measured at 1.1-1.5× its floor); fp32 at most 24 bytes
    with the 0-1 mask, 224 with the decay (the state's weights beside cᵀ in registers).
    Per-token gates and B and C read by groups of heads (Mamba-2's forward and dB sweep) hold
    the decay's budgets. The gated sweeps writing the gates' gradient's pieces (two remainders'
    copies, and forward in time the chunk's own pairs) at the value columns they launch with
    (``chunk.tables.PIECES_DC``), one segment a lane and in segments
    (``chunk.tables.HOPPER_PIECES_SEGMENTS``): at r = d = 128 at most 64 bytes a thread (0-32 once the staging
    buffers were unhoisted, from 264-452), forward in time with the own pairs after O's store
    (``chunk.tables.HOPPER_LATE_PAIRS``), and with that accumulator beside the state's, O's and the
    scores' at most 512 (336; 808 before); at r = 64, d = 128 at most 320, 128 at fewer columns
    (each consumer half the own pairs' columns, ``chunk.tables.HOPPER_HALF_PAIRS``, and the
    whole tile over half of E's columns, its A/B's other side, and the half pairs' columns
    summed a column's rows a thread, ``chunk.tables.HOPPER_COLUMN_SUMS``: the same budgets); the dual
    none. V's row weights and the skip (Mamba-2's SSD forward, ``rows``) at r = 128 and 64
    beside d = 64, one pass and segments: none; E's row weights and the row dots (its
    backward's reverse sweep, ``rows`` 2) at 64 × 64: none; normalised linear attention's
    forward (``norm``) at r = 128 and 64, d = 128, and its gradients' sweeps (the scores'
    offsets by rows, by columns, constant; forward and in reverse): none; with the dual
    output's offsets (dk beside dv) at most 64. Budgets of the
    Triton release they were set on (``probes.regs.TUNED_TRITON``); on another, every kernel
    compiles and the test is skipped, saying so."""
    from leetrepro.probes.regs import HOPPER_SHAPES, spill_bytes
    res = real_codegen("-m", "leetrepro.probes.regs", "--hopper", timeout=900)
    lines = [line for line in res.stdout.splitlines() if line.startswith("hopper")]
    budgets_or_skip(lines)
    shaped = [line for line in lines if line.split()[1][0].isdigit()]
    narrow = [line for line in lines if line.split()[1].startswith("dc")]
    gated = [line for line in lines if line.split()[1] == "gates"]
    grouped = [line for line in lines if line.split()[1] == "groups"]
    pieces = [line for line in lines if line.split()[1] == "pieces"]
    rows = [line for line in lines if line.split()[1] == "rows"]
    row_dots = [line for line in lines if line.split()[1] == "rowdots"]
    norm = [line for line in lines if line.split()[1] == "norm"]
    assert len(lines) - len(shaped) - len(narrow) - len(gated) - len(grouped) - len(pieces) - \
        len(rows) - len(row_dots) - len(norm) == 32
    # (normalised linear attention's forward, r = 128 and 64, one pass and segments: none)
    # (with the dual output's offsets, dk beside dv: 48-56 bytes at the first build)
    assert len(norm) == 14 and all(spill_bytes(line) <= (64 if ":dual" in line else 0)
                                   for line in norm), norm
    assert len(narrow) == 2 and len(gated) == 4 and len(grouped) == 2 and len(pieces) == 19
    # (V's row weights and the skip, Mamba-2's forward at 128 × 64 and 64 × 64: no spills)
    assert len(rows) == 4 and all(spill_bytes(line) == 0 for line in rows), rows
    # (E's row weights and the row dots, Mamba-2's backward at 64 × 64, fp16 and bf16: none)
    assert len(row_dots) == 2 and all(spill_bytes(line) == 0 for line in row_dots), row_dots
    assert all("Used 168 registers" in line for line in lines)
    # (what each launch asks of shared memory, the ring's slots as chunk.hopper_tiles counts
    # them and the allocator's padding, within the SM's 227 KB: a launch over it fails)
    assert all(0 < int(line.split("shared=")[1].split()[0]) <= 232448 for line in lines), \
        [line for line in lines if int(line.split("shared=")[1].split()[0]) > 232448]
    # each other head shape forward and reverse, bf16 and (r < 256) fp32
    assert {line.split()[1] for line in shaped} == {f"{r}x{d}" for r, d in HOPPER_SHAPES}
    assert len(shaped) == 4 * len(HOPPER_SHAPES) - 2 * sum(r == 256 for r, _ in HOPPER_SHAPES)
    for line in lines:
        if line.split()[1] == "pieces":
            # (d = 128: the sweep launches with 128 columns a program, forward at r = d = 128
            # with the own pairs beside them)
            budget = 0 if ":dual" in line else 512 if ":early" in line else \
                64 if "128x128:" in line else 320 if "64x128:" in line else 128
        elif ":dual" in line:  # (the normaliser's offsets beside its dual output: 64)
            budget = 272 if "decay" in line or "gates" in line else 80 if "fp16" in line else \
                64 if "offsets5" in line else 0
        elif "fp32" in line:
            budget = 224 if "decay" in line else 24
        else:
            budget = 128 if "decay" in line or "gates" in line else 0
        assert spill_bytes(line) <= budget, line


@pytest.mark.slow
def test_chunk_kernel_compiles_for_hopper_without_a_gpu():
    """The scan kernel goes through Triton's real code generation for sm_90 and ptxas (not the
    interpreter): what the GPU will run compiles, and its register use can be read (NOTES.md)."""
    res = real_codegen("-m", "leetrepro.probes.regs", "--configs", "fp16:decay:64:3")
    assert "registers" in res.stdout, res.stdout + res.stderr[-2000:]


def test_chunk_compiled_kernel_cache_keys_everything_that_specialises(monkeypatch):
    """Chunk keeps compiled kernels by a precomputed key (host time): a call that differs in
    anything Triton specialises on (strides, mask, dtype, alignment, state flags) compiles anew; the
    same call again only launches. A stand-in kernel records compiles and launches."""
    from leetrepro.methods import _gpu, chunk

    events = []
    names = chunk.plans.scan_kernels.chunk_scan_kernel.arg_names

    class Compiled:
        class src:
            signature = dict.fromkeys(names)

        def __getitem__(self, grid):
            return lambda *args: events.append("launch")

    class Kernel:
        arg_names = names

        def __getitem__(self, grid):
            def compile_(**kw):  # every parameter by name, plus num_warps and num_stages
                assert set(kw) - set(names) <= {"num_warps", "num_stages"} <= set(kw), kw.keys()
                events.append("compile")
                return Compiled()
            return compile_

    class Module:
        chunk_scan_kernel = Kernel()

    monkeypatch.setattr(chunk.plans, "scan_kernels", Module())
    monkeypatch.setattr(_gpu, "_COMPILED", {})
    monkeypatch.setattr(_gpu, "_ORDER", {})
    patch_chunk(monkeypatch, "launch", _gpu.launch)
    B, C, V = (torch.randn(1, 2, 96, 16) for _ in range(3))

    def compiles(*args, **kw):
        events.clear()
        chunk.chunk_scan(*args, **kw)
        return events.count("compile"), events.count("launch")

    assert compiles(B, C, V, None) == (1, 0)           # one launch: it repairs its own lanes
    assert compiles(B, C, V, None) == (0, 1)           # the same signature: launched only
    g = torch.full((2,), 0.9, dtype=torch.float64)
    assert compiles(B, C, V, g) == (1, 0)              # the decay mask
    assert compiles(B, C, V, g) == (0, 1)
    tm = [t.transpose(1, 2).contiguous().transpose(1, 2) for t in (B, C, V)]
    assert compiles(*tm, None) == (1, 0)               # time-major strides
    assert compiles(B.double().float(), C, V, None) == (0, 1)  # other tensors, same signature
    wide = [torch.randn(1, 2, 96, 17) for _ in range(3)]
    assert compiles(*(t[..., :16] for t in wide), None) == (1, 0)  # rows 17 apart (strides)
    assert compiles(*(t[..., 1:] for t in wide), None) == (1, 0)   # the same, 4 bytes off alignment
    assert compiles(B.half(), C.half(), V.half(), None) == (1, 0)
    assert compiles(B, C, V, None, output_final_state=True)[0] == 1
    monkeypatch.setattr(chunk.tables, "SELF_REPAIR_ROWS", 0)  # a long call: flags, then a repair launch
    assert compiles(B, C, V, None) == (2, 0)
    assert compiles(B, C, V, None) == (0, 2)


def test_config_sweep_times_the_exact_kind_through_tf32x3_and_keeps_other_kinds(monkeypatch,
                                                                                tmp_path):
    """``make tune``'s Chunk sweep: the exact kind (fp32, ``fp32_precision="tf32x3"``) is timed
    with its own candidates (16- and 32-row chunks), every call naming its precision; a run of
    that kind alone rewrites its rows and keeps the other kinds' as they were measured."""
    import pandas as pd

    from leetrepro.bench import sweep as sw

    calls = []

    def fake_call(B, C, V, g, *, method, config, **options):
        calls.append((B.dtype, options.get("fp32_precision"), config["BLOCK_N"]))

    monkeypatch.setattr(sw, "causal_linear_decoder", fake_call)
    monkeypatch.setattr(sw, "random_inputs", lambda *a, dtype, device: (torch.ones(1, dtype=dtype),) * 3)
    monkeypatch.setattr(sw, "time_calls", lambda fn, args, reps, device: [fn() or 0.002])
    rows = sw.sweep("Chunk", "cpu", dict(gpu="test", commit="new"), reps=1, kinds=["exact"])
    assert {r["kind"] for r in rows} == {"exact"}
    assert len(rows) == len(sw.SHAPES) * 2 * len(sw.SWEEPS["Chunk"][1]["exact"])
    assert {c[:2] for c in calls} == {(torch.float32, "tf32x3")}
    assert {c[2] for c in calls} == {16, 32}
    assert all(r["ms"] == 2.0 for r in rows)

    path = tmp_path / "chunk_config.csv"
    pd.DataFrame([dict(kind="half", decay=False, block_n=64, stages=3, commit="old"),
                  dict(kind="exact", decay=False, block_n=32, stages=1, commit="old")]).to_csv(
        path, index=False)
    table = sw.best_table(pd.DataFrame(rows), ("block_n", "stages"), dict(commit="new"))
    sw.write_rows(table, str(path), ["exact"])
    got = pd.read_csv(path)
    assert set(zip(got.kind, got.commit)) == {("half", "old"), ("exact", "new")}
    assert len(got) == 3  # half's one row, exact's two masks


@pytest.mark.skipif(not INTERPRETED, reason="the CPU's host path, the launches stubbed: its "
                    "budget is the interpreter host's (a GPU host's calls take the driver's path)")
@pytest.mark.parametrize("kernel", ["portable", "hopper"])
def test_a_repeated_eager_call_spends_a_bounded_host_path(monkeypatch, kernel):
    """The host path of an eager forward repeating its signature (as a model's layers do): the
    checks, the launch plan and the Hopper kernel's descriptors looked up, not made again. The
    Python functions and builtins one call through ``causal_linear_decoder`` runs, its launches
    stubbed, are counted against a budget (~1.2× what they were when it was set), so the host
    path cannot grow unnoticed; the launches: one (the portable kernel repairs a short call in
    its launch) or two (the Hopper kernel and the repair launch). The Hopper plan is forced on
    the CPU: its descriptors are Gluon's host objects, built without a GPU."""
    import sys

    from leetrepro.methods import chunk

    launches = []
    patch_chunk(monkeypatch, "launch", lambda kernel, grid, args, key=None, **o: launches.append(grid))
    r = 16 if kernel == "portable" else 64
    if kernel == "hopper":
        patch_chunk(monkeypatch, "hopper_unfit", lambda *a, **k: None)
        monkeypatch.setattr(chunk.tables, "_FORCED", ["hopper"])
        monkeypatch.setattr(chunk.plans, "_PLANS", {})
    b, h, n, d = 2, 4, 100, 64
    x = torch.randn(b, n, h * (2 * r + d))  # a fused projection's time-major views
    B, C, V = (t.transpose(1, 2) for t in x.view(b, n, h, 2 * r + d).split([r, r, d], -1))
    g = torch.linspace(0.9, 1.0, h, dtype=torch.float64)
    call = lambda: causal_linear_decoder(B, C, V, g, method="Chunk")  # noqa: E731
    call()
    counts = {"call": 0, "c_call": 0}

    def count(frame, event, arg):
        if event in counts:
            counts[event] += 1
    launches.clear()
    sys.setprofile(count)
    try:
        call()
    finally:
        sys.setprofile(None)
    budget = {"portable": (50, 56, 1), "hopper": (60, 84, 2)}[kernel]
    assert counts["call"] <= budget[0] and counts["c_call"] <= budget[1], counts
    assert len(launches) == budget[2]


def test_the_hopper_plan_keeps_a_ring_only_for_its_own_segments(monkeypatch):
    """The Hopper kernel's counters and published states follow its own split (``hopper_split``),
    not the portable kernel's: with ``config``'s DC = 32 its programs fill the (stand-in) SMs in
    one pass while the portable kernel would still cut N, and the plan keeps no ring. Forced on
    the CPU (Gluon's host objects need no GPU)."""
    from leetrepro.methods import chunk
    patch_chunk(monkeypatch, "hopper_unfit", lambda *a, **k: None)
    monkeypatch.setattr(chunk.tables, "_FORCED", ["hopper"])
    monkeypatch.setattr(chunk.plans, "_PLANS", {})
    B, V = torch.randn(1, 2, 1100, 64), torch.randn(1, 2, 1100, 128)
    plan = lambda config: chunk.launch_plan(  # noqa: E731
        chunk.Operands(B=B, C=B, V=V, O=torch.empty_like(V), E=None, O2=None, S0=None,
                       GAMMA=None, CU=None), fp32_precision=None, segment=None, config=config,
        output_final_state=False, reverse=False, kernel="auto")
    chained = plan(None)  # 2 lanes on 4 stand-in SMs: two segments a lane
    assert chained.kernel == "hopper" and chained.hopper.grid == (4,)
    assert chained.ring == 2 * 2 + 1 and chained.ws_shape == (2, 2, 64, 128)
    narrow = plan({"DC": 32})  # 8 programs, one pass
    assert narrow.hopper.grid == (8,) and narrow.hopper.consts.SPLIT is False
    assert narrow.ring == 0 and narrow.ws_shape is None


@pytest.mark.gpu
@pytest.mark.skipif(DEVICE != "cuda", reason="a race between a GPU program's warps")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_chunk_repair_launch_of_long_wide_lanes_runs(dtype):
    """RetNet's head shape (r = 256, d = 512, eight lanes a head) at N = 40000, batch 1, a NaN in
    the first head's C: the repair launch's programs read their lane's flag and zero it, and once
    a warp's store raced another's load, so that warps of one program ran different sweeps (an
    illegal instruction on the H100). Against the same call without the NaN: every other head
    the same, the first the same before the NaN and non-finite from it on."""
    from leetrepro.reference import rel_error

    b, h, n, r, d = 1, 4, 40000, 256, 512
    B, C, V = make_inputs(b, h, n, r, d, dtype=dtype, device=DEVICE, seed=7)
    g = 1 - torch.pow(2.0, -5.0 - torch.arange(h, dtype=torch.float64, device=DEVICE))
    clean = causal_linear_decoder(B, C, V, g, method="Chunk")
    C[0, 0, n // 2, 1] = float("nan")
    o = causal_linear_decoder(B, C, V, g, method="Chunk")
    torch.cuda.synchronize()
    assert torch.equal(o[:, 1:], clean[:, 1:])
    assert rel_error(o[0, 0, : n // 2], clean[0, 0, : n // 2]) <= tolerance(dtype)
    assert (~torch.isfinite(o[0, 0, n // 2:])).any(-1).all()


def _offsets_reference(B, C, V, kind: str, c: float, x, reverse: bool) -> torch.Tensor:
    """float64 op(B', C', V) for B' = [B, α], C' = [C, β] (``chunk_scan``'s ``offsets``): scores
    B_i·C_j + α_i·β_j on and below the diagonal (above it in reverse time)."""
    B, C, V = (t.double().cpu() for t in (B, C, V))
    n = B.shape[2]
    if kind == "rows":
        alpha = torch.full(B.shape[:3], c, dtype=torch.float64) if x is None else x.double().cpu()
        beta = torch.ones(B.shape[:3], dtype=torch.float64)
    else:
        alpha, beta = torch.ones(B.shape[:3], dtype=torch.float64), x.double().cpu()
    scores = B @ C.transpose(-1, -2) + alpha[..., :, None] * beta[..., None, :]
    mask = torch.ones(n, n, dtype=torch.bool)
    mask = mask.triu() if reverse else mask.tril()
    return torch.where(mask, scores, 0.0) @ V


@pytest.mark.parametrize("kind, constant", quick_lane([("rows", None), ("cols", None),
                                                       ("rows", 2.5)], unpack=True))
@pytest.mark.parametrize("reverse", quick_lane([True, False]))
@pytest.mark.parametrize("dtype", quick_lane([torch.float32, torch.float16]))
def test_chunk_scan_offsets_against_float64(kind, constant, reverse, dtype):
    """``chunk_scan``'s ``offsets`` (the normaliser's gradients in the backward's sweeps) on the
    portable kernel (interpreted on a CPU, one segment a lane): the rows' offsets α (a row of
    them, or a constant), the columns' β, forward and in reverse time, N not a multiple of a
    chunk, r ≠ d, batch > 1, more value columns than one block, against float64 within the
    contract; what the offsets cannot take is refused by name."""
    from leetrepro.methods import chunk
    B, C, V = make_inputs(2, 3, 150, 12, 70, dtype=dtype, device=DEVICE, seed=9)
    gen = torch.Generator().manual_seed(4)
    x = None if constant is not None else \
        torch.randn(2, 3, 150, generator=gen, dtype=torch.float32).to(DEVICE)
    out = chunk.chunk_scan(B, C, V, None, kernel="portable", reverse=reverse,
                           offsets=(kind, constant or 0.0, x))
    ref = _offsets_reference(B, C, V, kind, constant or 0.0, x, reverse)
    assert out.dtype == dtype and torch.isfinite(out).all()
    tol = tolerance(dtype) if dtype != torch.float32 or INTERPRETED else 5e-3
    assert (out.double().cpu() - ref).norm() / ref.norm() <= tol
    with pytest.raises(ValueError, match="offsets .* takes no a decay"):
        chunk.chunk_scan(B, C, V, torch.full((3,), 0.9, dtype=torch.float64, device=DEVICE),
                         kernel="portable", offsets=(kind, 1.0, x))
    with pytest.raises(ValueError, match="offsets must be"):
        chunk.chunk_scan(B, C, V, None, kernel="portable", offsets=("cols", 1.0, None))


@pytest.mark.parametrize("dtype", quick_lane([torch.float32, torch.float16]))
def test_chunk_scan_dual_offsets_against_float64(dtype):
    """``chunk_scan``'s ``("dual", c, x)`` offsets (the normaliser's dv with dk as its dual output)
    on the portable kernel, which runs them as two plain sweeps (interpreted on a CPU): O with
    the constant c on its rows, the dual output op(E, V, C) with x on its columns, in reverse
    time, against float64."""
    from leetrepro.methods import chunk
    B, C, V = make_inputs(2, 3, 150, 12, 20, dtype=dtype, device=DEVICE, seed=11)
    E = make_inputs(2, 3, 150, 12, 20, dtype=dtype, device=DEVICE, seed=12)[2]
    x = torch.randn(2, 3, 150, generator=torch.Generator().manual_seed(6)).to(DEVICE)
    o, o2 = chunk.chunk_scan(B, C, V, None, kernel="portable", reverse=True, dual=E,
                             offsets=("dual", 1.5, x))
    tol = tolerance(dtype)
    for out, ref in ((o, _offsets_reference(B, C, V, "rows", 1.5, None, True)),
                     (o2, _offsets_reference(E, V, C, "cols", 0.0, x, True))):
        assert torch.isfinite(out).all()
        assert (out.double().cpu() - ref).norm() / ref.norm() <= tol
    with pytest.raises(ValueError, match="offsets must be"):
        chunk.chunk_scan(B, C, V, None, kernel="portable", reverse=True,
                         offsets=("dual", 1.5, x))
