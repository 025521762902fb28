"""The GPU kernels on the CPU: Triton ones under TRITON_INTERPRET=1 against the oracle (small shapes:
the interpreter is slow), the CUDA source compiled by nvcc. On a GPU the same tests run natively;
the full matrix is ``make gpu-check`` (data/h100/correctness.csv)."""
import os
import shutil
import subprocess

import pytest
import torch

import leetrepro
from leetrepro import causal_linear_decoder
from leetrepro.methods import get

from conftest import assert_close_to_reference, make_inputs, random_gammas, shape_id, tolerance

triton = pytest.importorskip("triton", reason="Triton is not installed: `make install` brings it")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
INTERPRETED = DEVICE == "cpu"
KERNELS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "kernels")
# (batch, heads, N, r, d): odd N, r ≠ d, tiny r and d, batch > 1; N = 2100 crosses LA's segment split
LA_SHAPES = [(2, 3, 37, 8, 5), (1, 2, 130, 20, 33), (1, 1, 2100, 4, 6)]
# Chunk: a split of 37 rows into one 64-row segment and 37 whole (9 lanes fill the interpreter's
# 4 stand-in SMs: the batch-16 path, ragged N), segments chained through the ring (the batch-1 path, a
# partial last segment), and r = 200 whose 256-row state splits d = 100 into two column blocks
CHUNK_CASES = [((2, 3, 37, 8, 5), None), ((3, 3, 37, 8, 5), None), ((1, 2, 300, 20, 33), 64),
               ((1, 1, 150, 200, 100), 64)]
FA_SHAPES = [(2, 3, 37, 8, 5), (1, 1, 130, 5, 20)]
# Triton 3.6's interpreter computes bf16 tl.dot wrongly: the dot-based kernels refuse bf16 there
# (test_interpreted_bf16_is_refused); bf16 is checked on the GPU (data/h100/correctness.csv)
BF16 = pytest.param(torch.bfloat16, marks=pytest.mark.skipif(
    INTERPRETED, reason="bf16 dot kernels are refused under TRITON_INTERPRET=1 (checked on the GPU)"))


def _check(method, shape, dtype, decay, **opts):
    B, C, V = make_inputs(*shape, dtype=dtype, device=DEVICE, seed=sum(shape))
    g = random_gammas(shape[1], seed=shape[2], low=0.9).to(DEVICE) if decay else None
    out = causal_linear_decoder(B, C, V, g, method=method, **opts)
    exact = opts.get("fp32_precision") in ("tf32x3", "ieee")
    tol = tolerance(dtype, tf32=not INTERPRETED and not exact)
    assert_close_to_reference(out, B, C, V, g, tol=tol)
    return B, C, V, g, out


@pytest.mark.parametrize("shape", LA_SHAPES, ids=shape_id)
@pytest.mark.parametrize("decay", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16,
                                   BF16])
def test_lightning_attention2_triton(shape, decay, dtype):
    _check("LA", shape, dtype, decay)


@pytest.mark.parametrize("shape, segment", CHUNK_CASES, ids=shape_id)
@pytest.mark.parametrize("decay", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16,
                                   BF16])
def test_chunk_scan_triton(shape, segment, decay, dtype):
    _check("Chunk", shape, dtype, decay, segment=segment)


@pytest.mark.parametrize("shape, segment", CHUNK_CASES, ids=shape_id)
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, BF16])
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


def test_chunk_kernel_option_names_what_rules_the_hopper_kernel_out():
    """``kernel="hopper"`` where the Hopper kernel cannot run is a ValueError that says why;
    ``"auto"`` then runs the portable kernel, as ``"portable"`` does; anything else is refused."""
    from leetrepro.methods.chunk import hopper_unfit

    B, C, V = make_inputs(1, 2, 70, 16, 16, dtype=torch.float16, device=DEVICE, seed=8)
    with pytest.raises(ValueError, match="kernel='hopper' cannot run this call: it needs a CUDA GPU"):
        causal_linear_decoder(B, C, V, None, method="Chunk", kernel="hopper")
    auto = causal_linear_decoder(B, C, V, None, method="Chunk")
    assert torch.equal(auto, causal_linear_decoder(B, C, V, None, method="Chunk", kernel="portable"))
    with pytest.raises(ValueError, match="kernel"):
        causal_linear_decoder(B, C, V, None, method="Chunk", kernel="sm90")
    assert "CUDA" in hopper_unfit(B, C, V, None)


def test_kernel_table_takes_the_hopper_kernel_only_where_it_won_every_shape():
    """``make tune``'s choice of Chunk's kernel per (kind, mask, regime): Hopper only where it was
    faster at every shape and dtype of the regime (one pass; segments at long N; segments at short
    N, where host time weighs); the table's provenance is the run's."""
    import pandas as pd

    from leetrepro.bench.sweep import kernel_table
    from leetrepro.methods.chunk import SHORT_SPLIT_N, regime

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


def test_chunk_scan_rejects_a_ragged_segment():
    with pytest.raises(ValueError, match="multiple of"):
        _check("Chunk", CHUNK_CASES[2][0], torch.float32, False, segment=100)


@pytest.mark.parametrize("method", ["LA", "Chunk"])
@pytest.mark.parametrize("precision", ["tf32x3", "ieee"])
def test_fp32_exact_modes(method, precision):
    _check(method, LA_SHAPES[0], torch.float32, True, fp32_precision=precision)
    with pytest.raises(ValueError, match="fp32_precision"):
        _check(method, LA_SHAPES[0], torch.float32, True, fp32_precision="fast")


@pytest.mark.slow
@pytest.mark.parametrize("shape", FA_SHAPES, ids=shape_id)
@pytest.mark.parametrize("decay", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_fleet_attention_triton_is_correct_and_deterministic(shape, decay, dtype):
    B, C, V, g, out = _check("FA", shape, dtype, decay)
    assert torch.equal(out, causal_linear_decoder(B, C, V, g, method="FA"))


def test_fa_modify_is_registered_unsafe_and_never_auto():
    m = get("FA_modify")
    assert m.unsafe and "UNSAFE" in m.fn.__doc__
    assert leetrepro.available().loc["FleetAttention_modify", "unsafe"]
    for n in (64, 4096):
        assert leetrepro.auto_method(n, torch.float16, torch.device(DEVICE)).abbr != "FA_modify"
    # it runs; under the interpreter programs run one after another, so its race cannot bite
    B, C, V = make_inputs(1, 1, 40, 8, 4, device=DEVICE)
    out = causal_linear_decoder(B, C, V, 0.9, method="FA_modify")
    assert out.shape == V.shape
    if INTERPRETED:
        assert_close_to_reference(out, B, C, V, 0.9)


def test_kernel_sources_ship_with_the_package():
    from importlib import resources
    files = {p.name for p in resources.files("leetrepro.kernels").iterdir()}
    assert {"lightning_attn.py", "fleet_attn.py", "chunk_scan.py", "causal_dot_product.cu",
            "causal_dot_product_binding.cpp"} <= files


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only error")
def test_cuda_methods_on_cpu_are_a_clear_error():
    B, C, V = make_inputs(1, 1, 8, 4, 4)
    with pytest.raises(ValueError, match="does not support .* on device cpu"):
        causal_linear_decoder(B, C, V, method="Cdotp")


def test_cdotp_without_toolchain_says_how_to_fix(monkeypatch):
    from torch.utils import cpp_extension

    from leetrepro.methods.causal_dot_product import cuda_extension
    monkeypatch.setattr(cpp_extension, "CUDA_HOME", None)
    with pytest.raises(RuntimeError, match="nvcc.*CUDA_HOME.*Cdotp_torch"):
        cuda_extension.__wrapped__()


@pytest.mark.slow
def test_cdotp_cuda_source_compiles(tmp_path):
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc not found: the CUDA source was not compiled on this machine")
    src = os.path.join(KERNELS, "causal_dot_product.cu")
    res = subprocess.run([nvcc, "-std=c++17", "-O3", "-gencode=arch=compute_90,code=sm_90",
                          "-c", src, "-o", str(tmp_path / "cdotp.o")],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert (tmp_path / "cdotp.o").stat().st_size > 0


@pytest.mark.slow
def test_cdotp_binding_compiles_against_torch_headers(tmp_path):
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler: the binding was not compiled on this machine")
    import sysconfig

    from torch.utils.cpp_extension import include_paths
    incs = [f"-I{p}" for p in include_paths()] + [f"-I{sysconfig.get_paths()['include']}"]
    res = subprocess.run([cxx, "-std=c++17", "-fsyntax-only", *incs,
                          "-DTORCH_EXTENSION_NAME=leetrepro_cdotp",
                          os.path.join(KERNELS, "causal_dot_product_binding.cpp")],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]


def test_every_subpackage_is_declared_for_the_wheel():
    import pathlib
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    root = pathlib.Path(KERNELS).parent
    declared = set(tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(root).parts) for p in (root / "leetrepro").rglob("__init__.py")}
    # each data/<gpu>/ holding a launch or dispatch table ships as a package of its own (setuptools
    # warns about a data folder missing from the list)
    tables = {f"leetrepro.data.{p.parent.name}" for name in ("dispatch.csv", "chunk_config.csv")
              for p in (root / "data").glob(f"*/{name}")}
    assert tables and found | {"leetrepro.kernels", "leetrepro.data"} | tables == declared


@pytest.mark.skipif(not INTERPRETED, reason="the interpreter's refusal")
@pytest.mark.parametrize("method", ["LA", "Chunk"])
def test_interpreted_bf16_is_refused(method):
    B, C, V = make_inputs(1, 1, 20, 4, 4, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="bfloat16 under TRITON_INTERPRET=1"):
        causal_linear_decoder(B, C, V, method=method)


@pytest.mark.parametrize("method", ["Chunk", "LA"])
@pytest.mark.parametrize("scales", [(1e-3, 30.0), (1e-2, 1e-2)], ids=["huge-state", "tiny-state"])
def test_half_state_neither_overflows_nor_underflows(method, scales):
    """Large C and V with small B: the fp32 state exceeds fp16's 65504 while every output fits;
    small ones: the state sits among fp16's subnormals. Both must meet the fp16 contract."""
    sb, sc = scales
    g = torch.Generator().manual_seed(11)
    B, C, V = (torch.randn(1, 2, 200, k, generator=g) * s for k, s in ((16, sb), (16, sc), (8, sc)))
    B, C, V = (t.half().to(DEVICE) for t in (B, C, V))
    out = causal_linear_decoder(B, C, V, 0.999, method=method, **(
        {"segment": 64} if method == "Chunk" else {}))
    assert torch.isfinite(out).all()
    assert_close_to_reference(out, B, C, V, 0.999)


def test_launchers_read_the_launch_tables_of_their_gpu(tmp_path, monkeypatch):
    # make tune writes data/<gpu>/chunk_config.csv and la_config.csv; a GPU without them gets
    # the defaults (here the "GPU" is the CPU, tag "cpu")
    from leetrepro.methods import _gpu, chunk, lightning

    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "chunk_config.csv").write_text(
        "kind,decay,block_n,stages,geomean_ms\nhalf,True,128,3,1.0\n")
    (tmp_path / "cpu" / "la_config.csv").write_text(
        "kind,decay,warps,stages,geomean_ms\ntf32,False,8,3,1.0\n")
    monkeypatch.setattr(_gpu, "data", lambda *parts: str(tmp_path.joinpath(*parts)))
    _gpu._measured_table.cache_clear()
    chunk._config.cache_clear()
    try:
        tuned = chunk.chunk_config(128, 128, torch.float16, "tf32", True, device="cpu")
        default = chunk.chunk_config(128, 128, torch.float16, "tf32", False, device="cpu")
        assert (tuned["BLOCK_N"], tuned["num_stages"]) == (128, 3)
        assert (default["BLOCK_N"], default["num_stages"]) == chunk.CHUNK_TABLE[("half", False)]
        la = lightning.la_config(128, 128, "tf32", decay=False, device="cpu")
        la_default = lightning.la_config(128, 128, "tf32", half=True, decay=True, device="cpu")
        assert (la["num_warps"], la["num_stages"]) == (8, 3)
        assert (la_default["num_warps"], la_default["num_stages"]) == lightning.LA_TABLE[("half", True)]
        assert lightning.la_config(128, 128, "tf32")["num_warps"] == lightning.LA_TABLE[("tf32", False)][0]
    finally:
        _gpu._measured_table.cache_clear()
        chunk._config.cache_clear()


@pytest.mark.slow
def test_hopper_kernel_compiles_for_sm90_within_its_register_budget():
    """The warp-specialised Hopper forward (Gluon) compiled for sm_90 on the host, as it launches
    (one pass per lane, and segments chained through the ring): 168 registers a thread at
    launch (the partitions' own budgets set by setmaxnreg), no spills with the 0-1 mask, at most
    128 bytes a thread with the decay (the consumer's scalars; the profile reads them as L1
    hits)."""
    import sys

    from leetrepro.bench.regs import spill_bytes
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run([sys.executable, "-m", "leetrepro.bench.regs", "--hopper"],
                         capture_output=True, text=True, env=env, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr[-2000:]
    lines = [line for line in res.stdout.splitlines() if line.startswith("hopper")]
    assert len(lines) == 8 and all("Used 168 registers" in line for line in lines), res.stdout
    for line in lines:
        assert spill_bytes(line) <= (128 if "decay" in line else 0), line


@pytest.mark.slow
def test_chunk_kernel_compiles_for_hopper_without_a_gpu():
    """The scan kernel goes through Triton's real code generation for sm_90 and ptxas (not the
    interpreter): what the GPU will run compiles, and its register use can be read (NOTES.md)."""
    import subprocess
    import sys
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # real code generation
    res = subprocess.run([sys.executable, "-m", "leetrepro.bench.regs", "--configs", "fp16:decay:64:3"],
                         capture_output=True, text=True, env=env, timeout=600)
    assert res.returncode == 0 and "registers" in res.stdout, res.stdout + res.stderr[-2000:]


def test_launch_passes_arguments_by_name_and_checks_them(monkeypatch):
    """``_gpu.launch``: every kernel parameter by name (a TypeError names a missing or unknown
    one); the compiled kernel replayed positionally only where its signature lists the kernel's
    parameters in order, else every launch binds by name, with a warning, and still launches."""
    from leetrepro.methods import _gpu

    calls = []

    def stand_in(signature):
        class Compiled:
            class src:
                pass

            def __getitem__(self, grid):
                return lambda *args: calls.append(("replay", args))
        Compiled.src.signature = signature

        class Kernel:
            arg_names = ("X", "N", "BLOCK")

            def __getitem__(self, grid):
                return lambda **kw: calls.append(("bind", kw)) or Compiled()
        return Kernel()

    monkeypatch.setattr(_gpu, "_COMPILED", {})
    monkeypatch.setattr(_gpu, "_ORDER", {})
    good = stand_in(dict.fromkeys(("X", "N", "BLOCK")))
    with pytest.raises(TypeError, match=r"missing \['BLOCK'\], unknown \['Y'\]"):
        _gpu.launch(good, (1,), dict(X=1, N=2, Y=3))
    for _ in range(2):
        _gpu.launch(good, (1,), dict(BLOCK=4, N=2, X=1), key="k")
    assert calls == [("bind", dict(BLOCK=4, N=2, X=1)), ("replay", (1, 2, 4))]
    calls.clear()
    moved = stand_in(dict.fromkeys(("N", "X", "BLOCK")))  # a Triton whose order differs
    with pytest.warns(RuntimeWarning, match="binds its arguments"):
        _gpu.launch(moved, (1,), dict(X=1, N=2, BLOCK=4), key="k")
    _gpu.launch(moved, (1,), dict(X=1, N=2, BLOCK=4), key="k")
    assert [c[0] for c in calls] == ["bind", "bind"]


def test_chunk_compiled_kernel_cache_keys_everything_that_specialises(monkeypatch):
    """Chunk keeps compiled kernels by a precomputed key (host time): a call that differs in
    anything Triton specialises on (strides, mask, dtype, alignment, state flags) compiles anew; the
    same call again only launches. A stand-in kernel records compiles and launches."""
    from leetrepro.methods import _gpu, chunk

    events = []
    names = _gpu.triton_kernels("chunk_scan").chunk_scan_kernel.arg_names

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

    monkeypatch.setattr(chunk, "triton_kernels", lambda name: Module())
    monkeypatch.setattr(_gpu, "_COMPILED", {})
    monkeypatch.setattr(_gpu, "_ORDER", {})
    monkeypatch.setattr(chunk, "launch", _gpu.launch)
    B, C, V = (torch.randn(1, 2, 96, 16) for _ in range(3))

    def compiles(*args, **kw):
        events.clear()
        chunk.chunk_scan(*args, **kw)
        return events.count("compile"), events.count("launch")

    assert compiles(B, C, V, None) == (2, 0)           # the scan and the repair launch
    assert compiles(B, C, V, None) == (0, 2)           # the same signature: launched only
    g = torch.full((2,), 0.9, dtype=torch.float64)
    assert compiles(B, C, V, g) == (2, 0)              # the decay mask
    assert compiles(B, C, V, g) == (0, 2)
    tm = [t.transpose(1, 2).contiguous().transpose(1, 2) for t in (B, C, V)]
    assert compiles(*tm, None) == (2, 0)               # time-major strides
    assert compiles(B.double().float(), C, V, None) == (0, 2)  # other tensors, same signature
    wide = [torch.randn(1, 2, 96, 17) for _ in range(3)]
    assert compiles(*(t[..., :16] for t in wide), None) == (2, 0)  # rows 17 apart (strides)
    assert compiles(*(t[..., 1:] for t in wide), None) == (2, 0)   # the same, 4 bytes off alignment
    assert compiles(B.half(), C.half(), V.half(), None) == (2, 0)
    assert compiles(B, C, V, None, output_final_state=True)[0] == 2
