import os

import torch

# Without a GPU, the Triton kernels run under Triton's interpreter on CPU tensors. Set before any
# kernel module is imported (the launchers import them on first use).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Under pytest-xdist each worker gets its share of the cores for PyTorch's threads (and so do the
# notebooks and scripts it starts): each worker's default of every core made the suite's workers
# fight over them (the train notebook's tiny run: 25 s alone, 78 s beside another worker)
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    _share = str(max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))
    os.environ.setdefault("OMP_NUM_THREADS", _share)
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

import pytest  # noqa: E402

from leetrepro import reference, rel_error
from leetrepro.reference import TOLERANCE


def _switches_from_the_environment() -> list[str]:
    """``LEETREPRO_SWITCHES="methods.chunk.tables.NAME=value …"`` (space- or comma-separated):
    switches of the package set for the whole run, each value a Python literal
    (:class:`leetrepro.probes.ab.Switch`), so that the GPU matrix runs with a switch on before it
    becomes the default. Tests that set a switch themselves still do; those that assert the
    default's plans then fail, as they should. pytest's header names what was set."""
    items = os.environ.get("LEETREPRO_SWITCHES", "").replace(",", " ").split()
    if not items:  # (the probes' imports only where a switch is asked for)
        return []
    import ast

    from leetrepro.probes.ab import Switch
    done = []
    for item in items:
        path, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"LEETREPRO_SWITCHES: {item!r} is not module.path.NAME=value")
        Switch(path).set(ast.literal_eval(value))
        done.append(item)
    return done


_SWITCHED = _switches_from_the_environment()


def pytest_report_header(config):
    return f"leetrepro switches set: {' '.join(_SWITCHED)}" if _SWITCHED else None


def _patch_the_interpreter_once_a_launch():
    """Triton's interpreter (3.6) patches ``triton.language``'s builtins at every call of a
    device function, walking each module with ``inspect.getmembers``: in the straddle kernel's
    tests that was a third of the time. Within one launch the patches of a module stand once made
    (they are undone at its end), so a call whose modules are patched already is given an
    empty patch scope. Left alone where the interpreter's internals differ."""
    import inspect

    from triton import language as tl
    try:
        from triton.runtime import interpreter as ti
        grid_call, patch, scope_cls = ti.GridExecutor.__call__, ti._patch_lang, ti._LangPatchScope
    except (ImportError, AttributeError):
        return
    patched = []  # per launch in progress: the ids of the language modules patched
    seen = {}

    def langs(fn):
        if fn not in seen:
            seen[fn] = {id(v) for v in fn.__globals__.values()
                        if inspect.ismodule(v) and v in (tl, tl.core)}
        return seen[fn]

    def patch_once(fn):
        if patched and langs(fn) <= patched[-1]:
            return scope_cls()
        scope = patch(fn)
        if patched:
            patched[-1] |= langs(fn)
        return scope

    def launch(self, *args, **kwargs):
        patched.append(set())
        try:
            return grid_call(self, *args, **kwargs)
        finally:
            patched.pop()

    ti._patch_lang, ti.GridExecutor.__call__ = patch_once, launch


def _scan_slices_at_once():
    """Triton's interpreter (3.6, 3.9) runs a scan whose combine function is the kernel's own
    (FleetAttention's decayed running sum, Mamba-3's segmented one) one element at a time, a
    Python call of the combine function for each: an interpreted FleetAttention test took 20-45
    s. A scan's combine function is elementwise, so here it is called once a step along the
    axis, on the whole slice across the other axes: the same operations in the same order on
    every element, the same bits. Left alone where the interpreter's internals differ."""
    import numpy as np
    try:
        from triton.runtime import interpreter as ti
        scans = ti.ScanOps
        scans.generic_scan, scans.to_tensor  # noqa: B018  (the internals this replaces)
    except (ImportError, AttributeError):
        return False

    def generic_scan(self, input):
        data = [arg.handle.data for arg in input]
        out = [np.zeros_like(d) for d in data]
        at = [slice(None)] * data[0].ndim
        for k in range(data[0].shape[self.axis]):
            at[self.axis] = k
            here = tuple(at)
            if k == 0:
                for o, d in zip(out, data):
                    o[here] = d[here]
                continue
            at[self.axis] = k - 1
            before = tuple(at)
            acc = [self.to_tensor(o[before], arg.dtype) for o, arg in zip(out, input)]
            new = [self.to_tensor(d[here], arg.dtype) for d, arg in zip(data, input)]
            got = self.combine_fn.fn(*acc, *new)
            for o, g in zip(out, got if isinstance(got, tuple) else (got,)):
                value = g.handle.data if hasattr(g, "handle") else g
                o[here] = np.reshape(value, np.shape(o[here]))
        return [self.to_tensor(o, arg.dtype) for o, arg in zip(out, input)]

    generic_scan.replaced = scans.generic_scan  # (the interpreter's own, for the test of this)
    scans.generic_scan = generic_scan
    return True


def _tuple_types_when_asked():
    """Triton's interpreter (3.6, 3.9) makes a ``tl.tuple`` of the shape for every tensor an
    operation returns, and the tuple works out its type (a ``tuple_type`` of each entry's type,
    with a printed name) as it is made, though the interpreter asks for it almost never: a fifth
    of an interpreted straddle-kernel test's time under cProfile. Here the type is worked out the
    first time it is asked for, from the same values, by the same function; a tuple that is
    assigned one keeps it. And the numpy dtype of a Triton dtype, which the interpreter looks up
    in a table it builds at every call, is kept once looked up. With both, two slow tests ran in
    0.55 of their time (notes/house.md). Metadata only: the kernels' values are the
    interpreter's own (``test_kernels.py`` compares a kernel's bits with the patches taken
    back). Left alone where the interpreter's internals differ."""
    import inspect

    from triton.language import core
    try:
        from triton.runtime import interpreter as ti
        own_init, own_np_dtype = core.tuple.__init__, ti._get_np_dtype
        make_type = core._type_for_tuple_values
    except (ImportError, AttributeError):
        return False
    if list(inspect.signature(own_init).parameters) != ["self", "args", "type"] or \
            "type" in vars(core.tuple):
        return False

    def init(self, args, type=None):
        self.values = [i for i in args]
        self._type = type if type is None or isinstance(type, core.tuple_type) \
            else core.tuple_type(type)

    def get_type(self):
        if self._type is None:
            self._type = make_type(self.values)
        return self._type

    def set_type(self, value):
        self._type = value

    known = {}

    def np_dtype(tt):
        scalar = tt.element_ty if isinstance(tt, core.block_type) else tt
        if isinstance(scalar, core.pointer_type):
            return own_np_dtype(tt)
        if scalar not in known:
            known[scalar] = own_np_dtype(scalar)
        return known[scalar]

    core.tuple.__init__, core.tuple.type = init, property(get_type, set_type)
    ti._get_np_dtype = np_dtype
    init.replaced, np_dtype.replaced = own_init, own_np_dtype  # (for the test that compares)
    return True


SCANS_AT_ONCE = False  # whether the interpreter's element-by-element scans were replaced
TYPES_WHEN_ASKED = False  # whether the interpreter's tuples work out their types when asked
if os.environ.get("TRITON_INTERPRET") == "1":
    _patch_the_interpreter_once_a_launch()
    SCANS_AT_ONCE = _scan_slices_at_once()
    TYPES_WHEN_ASKED = _tuple_types_when_asked()


def make_inputs(batch, heads, n, r, d, dtype=torch.float32, device="cpu", seed=0, scale=1.0):
    """Random (never zero) inputs; scaled by 1/sqrt(r) so sums stay O(1) in half precision."""
    g = torch.Generator().manual_seed(seed)
    B, C = (torch.randn(batch, heads, n, r, generator=g) * scale / r ** 0.5 for _ in range(2))
    V = torch.randn(batch, heads, n, d, generator=g)
    return tuple(t.to(device=device, dtype=dtype) for t in (B, C, V))


def tolerance(dtype, tf32: bool = False) -> float:
    """The accuracy contract for ``dtype`` (``reference.TOLERANCE``); ``tf32``: a float32 result
    of a kernel's tf32 tensor-core products, documented and held to ``reference.TF32_TOLERANCE``."""
    from leetrepro.reference import TF32_TOLERANCE, TOLERANCE
    return TF32_TOLERANCE if tf32 and dtype == torch.float32 else TOLERANCE[dtype]


def shape_id(value):
    """Readable test ids: a shape (batch, heads, N, r, d) as ``B2-H3-N37-r8-d5``, a segment length
    as ``seg64`` (None: ``seg-default``), anything else as ``str``."""
    if isinstance(value, tuple) and len(value) == 5:
        return "B{}-H{}-N{}-r{}-d{}".format(*value)
    if value is None:
        return "seg-default"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"seg{value}"
    return str(value)


def random_gammas(heads, seed=0, low=0.5):
    g = torch.Generator().manual_seed(seed + 1)
    return low + (1 - low) * torch.rand(heads, generator=g, dtype=torch.float64)


def assert_close_to_reference(out, B, C, V, gamma, tol=None):
    assert out.shape == V.shape, (out.shape, V.shape)
    assert out.dtype == V.dtype
    ref = reference(B, C, V, gamma)
    err = rel_error(out, ref)
    tol = TOLERANCE[V.dtype] if tol is None else tol
    assert err <= tol, f"relative error {err:.3e} > {tol:.0e}"
    return err


@pytest.fixture
def inputs():
    return make_inputs


#: the interpreted FleetAttention kernel walks ranks and rows one scan at a time: 15-45 s a case
#: where the interpreter runs its scans element by element (:func:`_scan_slices_at_once` not
#: applied), about a second where it takes them a slice at a time
SLOW_INTERPRETED = {"FA", "FA_modify"} if not torch.cuda.is_available() and not SCANS_AT_ONCE \
    else set()


def method_params(abbrs):
    """pytest params of method abbreviations (or Method objects), the slow interpreted ones marked
    ``slow`` (left out of ``make test-fast``)."""
    return [pytest.param(a, id=getattr(a, "abbr", a),
                         marks=pytest.mark.slow if getattr(a, "abbr", a) in SLOW_INTERPRETED else ())
            for a in abbrs]


def interpreted_once(abbr, representative: bool) -> None:
    """Skip a case of a slow interpreted method (:data:`SLOW_INTERPRETED`: ~15-30 s a case on this
    CPU) unless it is the ``representative`` one its test keeps here; on a GPU every case runs."""
    if getattr(abbr, "abbr", abbr) in SLOW_INTERPRETED and not representative:
        pytest.skip("the interpreted FleetAttention kernel runs one representative case of this "
                    "test on the CPU (every case on a GPU)")


#: where the kernel tests run: a GPU if there is one, else Triton's interpreter on the CPU
KERNEL_DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
INTERPRETED = KERNEL_DEVICE == "cpu"
# Triton 3.6's interpreter computes bf16 tl.dot wrongly: the dot-based kernels refuse bf16 there
# (test_kernels.test_interpreted_bf16_is_refused); bf16 is checked on the GPU (gpu_check)
BF16 = pytest.param(torch.bfloat16, marks=pytest.mark.skipif(
    INTERPRETED, reason="bf16 dot kernels are refused under TRITON_INTERPRET=1 (checked on the GPU)"))


def check_kernel(method, shape, dtype, decay, **opts):
    """``method`` on random inputs of ``shape`` against the oracle, per-head decays when ``decay``;
    tf32's tolerance for fp32 on a GPU unless an exact fp32 mode is asked for."""
    from leetrepro import causal_linear_decoder
    B, C, V = make_inputs(*shape, dtype=dtype, device=KERNEL_DEVICE, seed=sum(shape))
    g = random_gammas(shape[1], seed=shape[2], low=0.9).to(KERNEL_DEVICE) if decay else None
    out = causal_linear_decoder(B, C, V, g, method=method, **opts)
    exact = opts.get("fp32_precision") in ("tf32x3", "ieee")
    assert_close_to_reference(out, B, C, V, g, tol=tolerance(dtype, tf32=not INTERPRETED and not exact))
    return B, C, V, g, out



def quick_lane(values, keep=(0,), unpack=False):
    """``values`` as parameters, each but those at the indices ``keep`` marked slow: the quick lane
    (``make test-fast``, under a minute) runs a representative, the full lane every one. An entry
    that is already a ``pytest.param`` keeps its id and marks; ``unpack``: each value is a tuple of
    several arguments."""
    out = []
    for i, v in enumerate(values):
        p = v if isinstance(v, type(pytest.param(None))) else pytest.param(*v) if unpack else pytest.param(v)
        marks = tuple(p.marks) + (() if i in keep else (pytest.mark.slow,))
        out.append(pytest.param(*p.values, id=p.id, marks=marks))
    return out


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """The quick lane (``-m "not slow"``) runs each parametrised test once: its first case that
    is not marked slow (by :func:`quick_lane`, :func:`method_params` or by hand); every other
    case is marked slow here, before pytest's own selection by marks. The full lane runs all."""
    groups = {}
    for item in items:
        if hasattr(item, "callspec"):
            groups.setdefault(item.nodeid.split("[", 1)[0], []).append(item)
    for cases in groups.values():
        quick = [c for c in cases if not c.get_closest_marker("slow")]
        for c in quick[1:]:
            c.add_marker(pytest.mark.slow)


def git_status() -> str | None:
    """``git status --porcelain`` of the checkout, untracked files listed one by one (what a test
    that runs notebooks or make targets compares before and after); None outside a git checkout."""
    import shutil
    import subprocess
    from leetrepro._paths import ROOT
    if shutil.which("git") is None or not os.path.isdir(os.path.join(ROOT, ".git")):
        return None
    return subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=ROOT,
                          capture_output=True, text=True, check=True).stdout


def real_codegen(*args: str, timeout: int = 600):
    """``python *args`` in a subprocess with Triton's real code generation (sm_90 and ptxas, not
    the interpreter the tests run under without a GPU): what the GPU will run compiles, and its
    resources can be read. Its completed process, asserted to have exited 0."""
    import subprocess
    import sys
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env,
                         timeout=timeout)
    assert res.returncode == 0, res.stdout + res.stderr[-2000:]
    return res


def budgets_or_skip(lines: list[str]) -> None:
    """Before a test holds kernels' probe lines to their register and spill budgets: each line
    was compiled by ptxas (its registers read); on a Triton release other than the one the budgets
    were set on (``probes.regs.TUNED_TRITON``) the test stops there, skipped and saying so."""
    import triton

    from leetrepro.probes import regs
    assert lines and all("registers" in line for line in lines), lines
    if not regs.budgets_apply():
        pytest.skip(f"{len(lines)} kernels compiled by Triton {triton.__version__}; their budgets "
                    f"were set on {regs.TUNED_TRITON}x and are not held here")


def patch_package(monkeypatch, package, name: str, value) -> None:
    """Replace ``name`` in ``package`` (Chunk's ``leetrepro.methods.chunk``, ``leetrepro.ops``) and
    in each of its modules that has it: a function is looked up where it is called (its own
    module, or a sibling's qualified name), so a test replaces it everywhere the package reads it."""
    import sys
    found = False
    for mod in [package] + [m for k, m in sorted(sys.modules.items())
                            if k.startswith(package.__name__ + ".") and m is not None]:
        if hasattr(mod, name):
            monkeypatch.setattr(mod, name, value)
            found = True
    assert found, f"{package.__name__} has no {name!r}"
    from leetrepro.ops import gate_sweeps  # (decisions made under the replaced name stay here)
    monkeypatch.setattr(gate_sweeps, "_PIECES", {})


def patch_chunk(monkeypatch, name: str, value) -> None:
    """:func:`patch_package` on Chunk's package."""
    from leetrepro.methods import chunk
    patch_package(monkeypatch, chunk, name, value)
