"""The GPU kernels on the CPU (Chunk's: ``test_chunk.py``): Triton ones under TRITON_INTERPRET=1
against the oracle (small shapes: the interpreter is slow), the CUDA source compiled by nvcc. On
a GPU the same tests run natively; the full matrix is ``make gpu-check``."""
import os
import shutil
import subprocess

import pytest
import torch

import leetrepro
from leetrepro import causal_linear_decoder
from leetrepro.methods import get

from conftest import (BF16, INTERPRETED, KERNEL_DEVICE, assert_close_to_reference, check_kernel,
                      interpreted_once, make_inputs, quick_lane, shape_id)

triton = pytest.importorskip("triton", reason="Triton is not installed: `make install` brings it")
DEVICE = KERNEL_DEVICE
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KERNELS = os.path.join(ROOT, "leetrepro", "kernels")
# (batch, heads, N, r, d): odd N, r ≠ d, tiny r and d, batch > 1; N = 2100 crosses LA's segment split
LA_SHAPES = [(2, 3, 37, 8, 5), (1, 2, 130, 20, 33), (1, 1, 2100, 4, 6)]
FA_SHAPES = [(2, 3, 37, 8, 5), (1, 1, 130, 5, 20)]
_check = check_kernel


@pytest.mark.parametrize("shape", LA_SHAPES, ids=shape_id)
@pytest.mark.parametrize("decay", quick_lane([False, True], keep=(1,)))
@pytest.mark.parametrize("dtype", quick_lane([torch.float32, torch.float16, BF16], keep=(0, 2)))
def test_lightning_attention2_triton(shape, decay, dtype):
    _check("LA", shape, dtype, decay)


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
    interpreted_once("FA", dtype == torch.float32 or shape == FA_SHAPES[1])
    B, C, V, g, out = _check("FA", shape, dtype, decay)
    assert torch.equal(out, causal_linear_decoder(B, C, V, g, method="FA"))


@pytest.mark.skipif(not INTERPRETED, reason="the interpreter's scans: on the CPU only")
def test_the_interpreter_s_scans_a_slice_at_a_time_give_its_own_bits(monkeypatch):
    """The tests' interpreter takes a scan with the kernel's own combine function a slice at a
    time (``conftest._scan_slices_at_once``): FleetAttention's decayed running sum (a pair of
    tensors combined) and its 0-1 twin give the same bits as the interpreter's own scan, element
    by element."""
    import conftest
    from triton.runtime import interpreter as ti
    if not conftest.SCANS_AT_ONCE:
        pytest.skip("the interpreter's scans were left as they are (its internals differ)")
    B, C, V = make_inputs(1, 2, 70, 2, 5, device=DEVICE)
    gamma = torch.tensor([0.9, 0.6], dtype=torch.float64)
    ours = [causal_linear_decoder(B, C, V, g, method="FA") for g in (gamma, None)]
    monkeypatch.setattr(ti.ScanOps, "generic_scan", ti.ScanOps.generic_scan.replaced)
    theirs = [causal_linear_decoder(B, C, V, g, method="FA") for g in (gamma, None)]
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs))


def test_the_interpreter_s_tuples_typed_when_asked_give_its_own_bits(monkeypatch):
    """The tests' interpreter works out a ``tl.tuple``'s type when it is asked for and keeps the
    numpy dtypes it has looked up (``conftest._tuple_types_when_asked``): Chunk's portable kernels
    forward and backward with γ, and the gates' straddle kernel, give the same bits as with the
    interpreter's own tuples and lookups."""
    import conftest
    from triton.language import core
    from triton.runtime import interpreter as ti
    if not conftest.TYPES_WHEN_ASKED:
        pytest.skip("the interpreter's tuples were left as they are (its internals differ)")
    from leetrepro.methods.chunk import gate_gradient

    def run():
        B, C, V = (t.requires_grad_() for t in make_inputs(2, 2, 70, 6, 5, device=DEVICE))
        out = causal_linear_decoder(B, C, V, torch.tensor([0.9, 0.7], dtype=torch.float64),
                                    method="Chunk", fp32_precision="ieee")
        grads = torch.autograd.grad(out.square().sum(), (B, C, V))
        g = -torch.rand(2, 2, 70, generator=torch.Generator().manual_seed(5))
        return [out.detach(), *grads, gate_gradient(B.detach(), C.detach(), V.detach(),
                                                    out.detach(), g)]

    ours = run()
    monkeypatch.setattr(core.tuple, "__init__", core.tuple.__init__.replaced)
    monkeypatch.delattr(core.tuple, "type")
    monkeypatch.setattr(ti, "_get_np_dtype", ti._get_np_dtype.replaced)
    theirs = run()
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs))


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
    assert {"lightning_attn.py", "fleet_attn.py", "chunk_scan.py", "cdotp.cu",
            "cdotp_binding.cpp"} <= files


def test_gpu_methods_on_cpu_blame_the_device_and_name_the_interpreter(monkeypatch):
    """A GPU-only method on CPU tensors: the error names the device (not the dtype), says how to
    run a Triton kernel on the CPU (TRITON_INTERPRET=1; not for the CUDA one) and lists the
    methods that run here."""
    B, C, V = make_inputs(1, 1, 8, 4, 4)
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # as a user's process has it
    with pytest.raises(ValueError, match="runs on cuda tensors only, and these are on cpu") as err:
        causal_linear_decoder(B, C, V, method="Chunk")
    assert "TRITON_INTERPRET=1" in str(err.value) and "Vanilla" in str(err.value)
    assert "dtype" not in str(err.value).split(";")[0]
    with pytest.raises(ValueError, match="runs on cuda tensors only") as err:
        causal_linear_decoder(B, C, V, method="Cdotp")
    assert "TRITON_INTERPRET" not in str(err.value)


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
    src = os.path.join(KERNELS, "cdotp.cu")
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
                          os.path.join(KERNELS, "cdotp_binding.cpp")],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]


def test_every_subpackage_is_declared_for_the_wheel():
    import pathlib
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    root = pathlib.Path(ROOT)
    declared = set(tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(root).parts) for p in (root / "leetrepro").rglob("__init__.py")}
    # each data/<gpu>/ holding a launch or dispatch table ships as a package of its own (setuptools
    # warns about a data folder missing from the list)
    tables = {f"leetrepro.data.{p.parent.name}" for name in ("dispatch.csv", "chunk_config.csv")
              for p in (root / "data").glob(f"*/{name}")}
    assert tables and found | {"leetrepro.data"} | tables == declared


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
    from leetrepro import tuning
    from leetrepro.methods import chunk, lightning

    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "chunk_config.csv").write_text(
        "kind,decay,block_n,stages,geomean_ms\nhalf,True,128,3,1.0\n")
    (tmp_path / "cpu" / "la_config.csv").write_text(
        "kind,decay,warps,stages,geomean_ms\ntf32,False,8,3,1.0\n")
    monkeypatch.setattr(tuning, "path", lambda *parts: str(tmp_path.joinpath(*parts)))
    tuning.clear()  # every table and every choice made from one (Chunk's launch plans too)
    try:
        tuned = chunk.chunk_config(128, 128, torch.float16, "tf32", True, device="cpu")
        default = chunk.chunk_config(128, 128, torch.float16, "tf32", False, device="cpu")
        assert (tuned["BLOCK_N"], tuned["num_stages"]) == (128, 3)
        assert (default["BLOCK_N"], default["num_stages"]) == tuning.CHUNK_TABLE[("half", False)]
        la = lightning.la_config(128, 128, "tf32", decay=False, device="cpu")
        la_default = lightning.la_config(128, 128, "tf32", half=True, decay=True, device="cpu")
        assert (la["num_warps"], la["num_stages"]) == (8, 3)
        assert (la_default["num_warps"], la_default["num_stages"]) == tuning.LA_TABLE[("half", True)]
        assert lightning.la_config(128, 128, "tf32")["num_warps"] == tuning.LA_TABLE[("tf32", False)][0]
    finally:
        monkeypatch.undo()
        tuning.clear()


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


def test_a_launch_key_holds_what_triton_specialises_on():
    """A keyless launch's key (``_gpu._specialised``): each tensor's dtype and 16-byte
    alignment, any other value as it is, a tuple (a named one too) element by element: two
    calls share a compiled kernel only where Triton would compile the same one."""
    import collections

    from leetrepro.methods import _gpu

    x = torch.zeros(8, dtype=torch.float16)
    pair = collections.namedtuple("Pair", "a b")
    key = _gpu._specialised([x, x[1:], 3, 1.5, True, None, "s", (x, 16, (x[1:], 0)),
                             pair(x, 1), torch.float32])
    assert key == ((torch.float16, True), (torch.float16, False), 3, 1.5, True, None, "s",
                   ((torch.float16, True), 16, ((torch.float16, False), 0)),
                   ((torch.float16, True), 1), torch.float32)
    assert _gpu._specialised([torch.zeros(8, dtype=torch.float32)]) != _gpu._specialised([x])
    hash(key)


def test_launch_replays_through_the_launcher_as_tritons_runner_calls_it(monkeypatch):
    """On the Triton release whose runner was read (``DIRECT_TRITON``), a replayed launch calls the
    compiled kernel's launcher with the runner's layout (grid, stream, function, packed metadata,
    launch metadata and the two hooks None, then the arguments in order); elsewhere through the
    runner itself, and through the runner too while a launch hook is registered (a profiler's)."""
    import triton
    from triton import knobs

    from leetrepro.methods import _gpu

    calls = []

    class Compiled:
        class src:
            signature = dict.fromkeys(("X", "N"))
        function, packed_metadata = "fn", "packed"

        def _init_handles(self):
            pass

        @property
        def run(self):
            return lambda *args: calls.append(("direct", args))

        def __getitem__(self, grid):
            return lambda *args: calls.append(("runner", args))

    class Kernel:
        arg_names = ("X", "N")

        def __getitem__(self, grid):
            return lambda **kw: calls.append(("bind", kw)) or Compiled()

    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda index: 77, raising=False)
    for version, path in ((triton.__version__, "direct"), ("0.0.0", "runner")):
        monkeypatch.setattr(_gpu, "DIRECT_TRITON", (version,))
        monkeypatch.setattr(_gpu, "_COMPILED", {})
        monkeypatch.setattr(_gpu, "_ORDER", {})
        calls.clear()
        kernel = Kernel()
        for _ in range(2):
            _gpu.launch(kernel, (5,), dict(N=2, X=1), key="k")
        assert calls[0][0] == "bind" and calls[1][0] == path
        want = (5, 1, 1, 77, "fn", "packed", None, None, None, 1, 2) if path == "direct" else (1, 2)
        assert calls[1][1] == want
    monkeypatch.setattr(_gpu, "DIRECT_TRITON", (triton.__version__,))
    hook = lambda metadata: None  # noqa: E731
    knobs.runtime.launch_enter_hook.add(hook)
    try:
        calls.clear()
        _gpu.launch(kernel, (5,), dict(N=2, X=1), key="k")
        assert calls == [("runner", (1, 2))]
    finally:
        knobs.runtime.launch_enter_hook.remove(hook)


def test_c_launch_passes_what_tritons_launcher_passes_and_encodes_each_descriptor_once(monkeypatch):
    """``_gpu.CLaunch`` calls a compiled kernel's C launcher with the arguments Triton's own
    wrapper (``wrap_handle_tensordesc`` of this Triton, its closure read) would pass it, each TMA
    descriptor expanded by Triton's ``make_tensordesc_arg``; an encoding is made once for a
    tensor's address, shape, strides and padding and reused while they recur; a launcher built
    otherwise (scratch buffers, no such closure) is left to Triton."""
    from types import SimpleNamespace

    from triton.backends.nvidia import driver

    from leetrepro.methods import _gpu

    made = []

    def encode(desc, meta):  # (the driver's encoding stands in for cuTensorMapEncodeTiled)
        made.append((desc.base.data_ptr(), meta["swizzle"]))
        return [("map", desc.base.data_ptr(), meta["swizzle"]), *desc.shape, *desc.strides]

    monkeypatch.setattr(driver, "make_tensordesc_arg", encode)
    seen = []
    signature = {"a": "*fp32", "d": "tensordesc<bf16[64, 64]>", "n": "i32",
                 "e": "tensordesc<bf16[64, 32]>", "K": "constexpr"}
    metas = [dict(swizzle=128), dict(swizzle=64)]
    wrapper = driver.wrap_handle_tensordesc(lambda *a: seen.append(a), signature, metas)
    run = SimpleNamespace(launch=wrapper, global_scratch_size=0, profile_scratch_size=0,
                          num_ctas=1, launch_cooperative_grid=False, launch_pdl=False)
    compiled = SimpleNamespace(run=run, function=11, packed_metadata="packed")
    fast = _gpu.CLaunch.of(compiled)
    import triton
    if not triton.__version__.startswith(_gpu.DIRECT_TRITON):
        assert fast is None  # (a release whose launcher was not read: Triton's own path)
        pytest.skip(f"the C launcher was read on Triton {_gpu.DIRECT_TRITON}, "
                    f"this is {triton.__version__}: left to Triton, as asserted")
    assert fast is not None and fast.cuts == (1, 3)
    x, y, z = torch.zeros(64, 64), torch.zeros(64, 32), torch.zeros(64, 32)

    def desc(t):
        return SimpleNamespace(base=t, shape=list(t.shape), strides=list(t.stride()),
                               padding="zero")

    for e in (y, y, z):
        args = [x, desc(x), 7, desc(e), 4]
        # (Triton's runner: grid, stream, function, cooperative, PDL, the scratch buffers, the
        # packed and launch metadata, the hooks, then the arguments)
        wrapper(3, 1, 1, 99, 11, False, False, None, None, "packed", None, None, None, *args)
        fast((3, 1, 1), 99, args)
        assert len(seen[-1]) == len(seen[-2]) == 13 + 13  # (a descriptor: 1 + 2 + 2 values)
        assert all(a is b or (not isinstance(a, torch.Tensor) and a == b)
                   for a, b in zip(seen[-1], seen[-2]))
    assert made.count((x.data_ptr(), 128)) == 4  # Triton's three calls, then the cached one
    assert made.count((y.data_ptr(), 64)) == 2 + 1 and made.count((z.data_ptr(), 64)) == 2
    run.global_scratch_size = 8
    assert _gpu.CLaunch.of(compiled) is None
    run.global_scratch_size, run.launch = 0, lambda *a: None  # (a launcher with no closure)
    assert _gpu.CLaunch.of(compiled) is None


def test_kernel_functions_stay_within_their_size_ceilings():
    """No kernel or device function (every file of ``kernels/``) takes more than ``MAX_PARAMS``
    parameters (a tensor's pointer and strides, a bundle of constants, an aggregate: one each)
    and no function of the kernels or of Chunk's launchers runs over ``MAX_LINES`` lines
    (``probes/sizes.py``)."""
    from leetrepro.probes import sizes
    found = sizes.sizes()
    assert {s.file for s in found} == set(sizes.FILES)
    assert {"kernels/mamba3_rows.py", "kernels/state_update.py"} <= set(sizes.FILES)
    assert sum(s.jit for s in found) >= 100  # (the Triton and Gluon functions are recognised)
    assert sizes.over(found) == [], sizes.over(found)


def test_no_function_of_the_operator_runs_over_the_line_ceiling():
    """No function of the package outside its measuring tools (``sizes.TOOLS``: benchmarks,
    the paper's tables, probes) runs over ``MAX_LINES`` lines, its signature and docstring
    included: the public entry, the drop-ins, the models and the kernels alike."""
    from leetrepro.probes import sizes
    files = sizes.operator_files()
    assert "api.py" in files and "compat.py" in files and "kernels/chunk_hopper.py" in files
    assert not any(f.split("/")[0] in sizes.TOOLS for f in files)
    long = [s for s in sizes.sizes(files) if s.lines > sizes.MAX_LINES]
    assert long == [], long


def test_budgets_are_held_on_the_triton_release_they_were_set_on(monkeypatch):
    """The register and spill budgets apply on ``TUNED_TRITON`` and on no other release."""
    import triton

    from leetrepro.probes import regs
    monkeypatch.setattr(triton, "__version__", regs.TUNED_TRITON + "1")
    assert regs.budgets_apply()
    monkeypatch.setattr(triton, "__version__", "99.0.0")
    assert not regs.budgets_apply()


def test_the_size_probe_flags_what_is_over_a_ceiling():
    """The probe counts a kernel's parameters (not ``self``) and a function's lines, and flags a
    kernel function over either ceiling and a host function over the line ceiling only."""
    import ast

    from leetrepro.probes import sizes
    params = ", ".join(f"a{i}" for i in range(sizes.MAX_PARAMS + 1))
    body = "\n".join(["    pass"] * sizes.MAX_LINES)
    src = (f"@triton.jit\ndef wide({params}):\n    pass\n\n"
           f"def host({params}):\n    pass\n\n"
           f"def long():\n{body}\n\n"
           f"class A:\n    @gluon.jit\n    def method(self, x):\n        pass\n")
    found = {s.function: s for s in sizes._functions("x.py", ast.parse(src).body, "")}
    assert found["wide"].jit and found["wide"].params == sizes.MAX_PARAMS + 1
    assert found["A.method"].jit and found["A.method"].params == 1
    assert found["long"].lines == sizes.MAX_LINES + 1
    assert {s.function for s in sizes.over(list(found.values()))} == {"wide", "long"}
