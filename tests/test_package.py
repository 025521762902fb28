"""The installed package: the wheel carries the kernels and the dispatch tables, and an installed
copy finds its own (not a checkout's)."""
import functools
import os
import re
import subprocess
import sys
import zipfile

import pytest

from leetrepro import _paths

from conftest import git_status

ROOT = _paths.ROOT


def test_a_checkout_uses_its_own_kernels_and_data():
    from leetrepro.methods import _gpu
    assert _gpu.kernel_source("chunk_scan.py") == os.path.join(ROOT, "leetrepro", "kernels", "chunk_scan.py")
    assert _paths.data("h100", "dispatch.csv") == os.path.join(ROOT, "data", "h100", "dispatch.csv")


@pytest.mark.slow
def test_the_wheel_ships_kernels_and_dispatch_tables_and_finds_them_installed(tmp_path):
    res = subprocess.run([sys.executable, "-m", "pip", "wheel", ROOT, "--no-deps",
                          "--no-build-isolation", "-v", "-w", str(tmp_path)],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    # a clean build: no deprecated license table, no data folder missing from the packages list
    log = res.stdout + res.stderr
    assert "BuildBackendWarning" not in log and "SetuptoolsDeprecationWarning" not in log, \
        [line for line in log.splitlines() if "Warning" in line][:5]
    wheel = next(tmp_path.glob("leetrepro-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"leetrepro/kernels/chunk_scan.py", "leetrepro/kernels/_tiles.py",
            "leetrepro/kernels/cdotp.cu", "leetrepro/data/h100/dispatch.csv"} <= names
    assert not any(n.startswith("leetrepro/data/h100/table") for n in names)  # only the tables
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    code = ("from leetrepro import dispatch, _paths; "
            "print(dispatch.table_path('h100')); from leetrepro.methods import _gpu; "
            "print(_gpu.KERNELS)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                         env=dict(os.environ, PYTHONPATH=str(site)), timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    table, kernels = out.stdout.split()
    assert table == str(site / "leetrepro" / "data" / "h100" / "dispatch.csv") and os.path.exists(table)
    assert kernels == str(site / "leetrepro" / "kernels")


def test_make_asks_for_the_gpu_only_when_a_target_needs_it(tmp_path):
    """The Makefile finds this machine's GPU tag (a Python start, seconds with torch) on first use:
    ``make help`` starts no Python; a target that names its data folder does."""
    import shutil
    if shutil.which("make") is None:
        pytest.skip("no make here")
    marker = tmp_path / "asked"
    fake = tmp_path / "python"
    fake.write_text(f"#!/bin/sh\ntouch {marker}\necho cpu\n")
    fake.chmod(0o755)
    run = lambda *args: subprocess.run(["make", "-s", *args, f"PY={fake}", "INSTALLED="],  # noqa: E731
                                       cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert run("help").returncode == 0 and not marker.exists()
    out = run("-n", "gpu-check")
    assert out.returncode == 0 and marker.exists(), out.stderr
    assert "--out data/h100" in out.stdout  # no GPU here: the default folder, h100's


#: the targets that measure on a GPU and cannot re-render without one
GPU_ONLY_TARGETS = ("test-gpu", "gpu-check", "bench-kernels", "profile", "tune", "bench-train",
                    "layouts", "bench-layer", "bench-sp", "bench-gates", "bench-ssd", "bench-model",
                    "bench-hf")


def test_gpu_only_targets_say_so_in_one_line_and_fail_without_a_gpu(tmp_path):
    """Without a GPU every target that only measures fails at once with one line that says why
    (``make test-gpu`` had run nothing and passed; ``make bench-sp`` died in torchrun's launcher
    with a bare AssertionError), and leaves git's view of the tree as it was."""
    import shutil
    if shutil.which("make") is None:
        pytest.skip("no make here")
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho cpu\n")
    fake.chmod(0o755)
    venv = tmp_path / "venv"
    venv.mkdir()
    (venv / ".installed").touch()
    status = git_status()
    for target in GPU_ONLY_TARGETS:
        out = subprocess.run(["make", "-s", target, f"PY={fake}", "INSTALLED=", f"VENV={venv}",
                              "GPUS=0"], cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert out.returncode != 0, (target, out.stdout, out.stderr)
        assert f"make {target}: needs a CUDA GPU" in out.stderr.splitlines()[0], out.stderr
    assert git_status() == status


@pytest.mark.slow
@pytest.mark.parametrize("target", ["train", "scaling", "results"])  # (claims: test_notebooks)
def test_a_target_rerenders_without_a_gpu_and_leaves_the_tree_as_it_was(target):
    """``make train`` read its CSV under the output folder instead of the committed
    data/h100/train_lm.csv and failed without a GPU; each re-render writes under rerendered/."""
    import shutil
    import torch
    if shutil.which("make") is None or torch.cuda.is_available():
        pytest.skip("needs make and a machine without a GPU")
    status = git_status()
    out = subprocess.run(["make", "-s", target, f"PY={sys.executable}", "INSTALLED="], cwd=ROOT,
                         capture_output=True, text=True, timeout=600,
                         env=dict(os.environ, MPLBACKEND="Agg"))
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    folder = {"scaling": "h200x2"}.get(target, "h100")
    if target == "train":  # (said on the terminal, not only inside the executed notebook)
        assert "train: NO GPU HERE: nothing was timed; re-rendered" in out.stdout, out.stdout[-500:]
    if target != "results":  # (results rewrites figures/results.md from data/: the same page)
        assert os.path.exists(os.path.join(ROOT, "rerendered", "figures", folder, f"{target}.ipynb"))
    assert git_status() == status


def test_design_names_code_that_exists():
    """DESIGN.md points each claim at code: every ``module.name`` it names in backticks, with
    module a part of the package, resolves; every file it names exists."""
    import importlib
    import re
    text = open(os.path.join(ROOT, "DESIGN.md"), encoding="utf-8").read()
    modules = {"_device", "_gpu", "_inputs", "_state", "api", "chunk", "tables", "plans",
               "hopper_launch", "gate_grads", "resolution", "forward", "gate_sweeps", "backward",
               "custom_op", "decode", "dispatch",
               "distributed", "ops", "reference", "registry", "tuning", "gpu_check", "harness",
               "sweep", "tune", "layouts", "regs", "conftest"}
    checked = 0
    for ref in set(re.findall(r"`([A-Za-z_./]+)\.([A-Za-z_][A-Za-z_0-9]*)`", text)):
        path, name = ref
        module = path.replace("/", ".").split(".")[-1]
        if module not in modules or name in ("py", "md", "csv"):
            continue
        where = {"_gpu": "leetrepro.methods._gpu", "chunk": "leetrepro.methods.chunk",
                 "tables": "leetrepro.methods.chunk.tables", "plans": "leetrepro.methods.chunk.plans",
                 "hopper_launch": "leetrepro.methods.chunk.hopper_launch",
                 "gate_grads": "leetrepro.methods.chunk.gate_grads",
                 **{m: f"leetrepro.ops.{m}" for m in ("resolution", "forward", "gate_sweeps",
                                                       "backward", "custom_op")},
                 "gpu_check": "leetrepro.bench.gpu_check", "harness": "leetrepro.bench.harness",
                 "sweep": "leetrepro.bench.sweep", "tune": "leetrepro.bench.tune",
                 "layouts": "leetrepro.bench.layouts", "regs": "leetrepro.probes.regs",
                 "conftest": "conftest"}.get(module, f"leetrepro.{module}")
        assert hasattr(importlib.import_module(where), name), f"DESIGN.md names {path}.{name}"
        checked += 1
    assert checked >= 40
    for f in set(re.findall(r"`((?:leetrepro/|tests/|notebooks/|kernels/)[A-Za-z_/]+\.(?:py|md))`", text)):
        assert os.path.exists(os.path.join(ROOT, f)) or os.path.exists(os.path.join(ROOT, "leetrepro", f)), f


def _module_state() -> set:
    """Every module-level cache, memo and piece of mutable state of the operator's path (the
    package less bench/, probes/ and reproduce/), read from the source: names bound at module level
    to an empty dict, list or set, or to a counter, and functions under a ``functools`` cache, as
    ``module.name`` (``methods.chunk.plans._PLANS``)."""
    import ast
    empty = {"{}", "[]", "set()", "dict()", "itertools.count()"}
    found = set()
    for path, text in _operator_sources():
        module = path[:-3].replace(os.sep, ".")
        for node in ast.parse(text).body:
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
                target = node.targets[0] if isinstance(node, ast.Assign) else node.target
                if isinstance(target, ast.Name) and ast.unparse(node.value) in empty:
                    found.add(f"{module}.{target.id}")
            elif isinstance(node, ast.FunctionDef) and any(
                    "cache" in ast.unparse(d) for d in node.decorator_list):
                found.add(f"{module}.{node.name}")
    return found


def _operator_sources():
    """``(path, text)`` of each Python file of the operator: the package less ``bench/``,
    ``probes/`` and ``reproduce/``, the path relative to the package (``ops/forward.py``)."""
    package = os.path.join(ROOT, "leetrepro")
    for folder, _, files in os.walk(package):
        rel = os.path.relpath(folder, package)
        if rel.split(os.sep)[0] in ("bench", "probes", "reproduce", "data", "__pycache__"):
            continue
        for f in files:
            if f.endswith(".py"):
                with open(os.path.join(folder, f), encoding="utf-8") as src:
                    yield os.path.normpath(os.path.join(rel, f)), src.read()


def test_design_cache_table_lists_every_module_level_cache():
    """DESIGN.md's table of caches names every cache, memo and piece of module state on the
    operator's path, as enumerated from the source, and nothing that is not there."""
    import re
    text = open(os.path.join(ROOT, "DESIGN.md"), encoding="utf-8").read()
    section = text.split("## Caches and what clears them", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    listed = {name for row in rows for name in re.findall(r"`([\w.]+)`", row.split("|")[1])}
    found = _module_state()
    assert len(found) >= 25 and "methods.chunk.plans._PLANS" in found and "tuning.rows" in found
    assert found - listed == set(), f"caches missing from DESIGN.md: {sorted(found - listed)}"
    assert listed - found == set(), f"DESIGN.md lists what is not there: {sorted(listed - found)}"


def test_environment_yml_pins_what_make_install_pins_without_a_gpu():
    """One statement of the CPU environment: the Makefile's TORCH line; environment.yml repeats
    its pins, and this keeps the two in step."""
    import re
    make = open(os.path.join(ROOT, "Makefile"), encoding="utf-8").read()
    triton = re.search(r"^TRITON \?= (\S+)", make, re.M).group(1)
    cpu = re.search(r"^TORCH\s+\?= \$\(if \$\(HAS_GPU\),torch,(.*)\)$", make, re.M).group(1)
    pins = {p.strip('"') for p in cpu.replace("$(TRITON)", triton).split()}
    assert pins == {"torch==2.13.0", f"triton=={triton}", "numpy<2.3"}, pins
    env = open(os.path.join(ROOT, "environment.yml"), encoding="utf-8").read()
    listed = set(re.findall(r"^\s+- (\S+)$", env, re.M))
    assert pins <= listed, pins - listed


def test_make_help_quotes_no_timings_and_marks_gpu_only_targets_only():
    """Timings live in the README alone; `(GPU)` in `make help` marks targets that cannot run
    without a GPU, not those that re-render without one."""
    import re
    import shutil
    if shutil.which("make") is None:
        pytest.skip("no make here")
    out = subprocess.run(["make", "-s", "help"], cwd=ROOT, capture_output=True, text=True,
                         timeout=60).stdout
    assert not re.search(r"about [^)]*(second|minute)", out), out
    for line in out.splitlines():
        target = line.split()[1] if line.startswith("make ") and len(line.split()) > 1 else None
        if "(GPU" in line and target not in GPU_ONLY_TARGETS:
            assert "re-render" in line or "no GPU" in line, line


def test_the_oracle_is_its_module_and_its_function():
    """``leetrepro.reference`` is callable (the float64 oracle) and is the module whose names
    the README cites (``GATE_GRAD_TOLERANCE``, ``ssd_reference``): a function of that name once
    shadowed the module, and ``import leetrepro.reference as R; R.ssd_reference`` failed."""
    import inspect

    import torch

    import leetrepro
    import leetrepro.reference as R
    from leetrepro.reference import reference as fn

    assert R is leetrepro.reference
    assert R.GATE_GRAD_TOLERANCE[torch.float32] > 0 and callable(R.ssd_reference)
    B = torch.randn(1, 2, 5, 3, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(leetrepro.reference(B, B, B, 0.9), fn(B, B, B, 0.9))
    assert list(inspect.signature(leetrepro.reference).parameters)[:4] == ["B", "C", "V", "gamma"]


def test_pip_runs_without_the_checkouts_pythonpath():
    """The Makefile exports PYTHONPATH (the checkout) for everything it runs; pip under it saw the
    checkout's egg-info and printed "ERROR: pip's dependency resolver … leetrepro requires
    pandas" into a green CI run while a virtualenv was still being built."""
    with open(os.path.join(ROOT, "Makefile"), encoding="utf-8") as f:
        installs = [line.strip() for line in f if "$(PIP) install" in line]
    assert installs and all(line.startswith("PYTHONPATH= $(PIP) install") for line in installs), \
        installs


def test_a_narrow_log_axis_shows_several_labels():
    """Table 3's speed-up panels spanning under a decade showed one label, or none."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from leetrepro.reproduce.tables import readable_log
    fig, ax = plt.subplots()
    ax.plot([1e2, 1e3, 1e4], [0.6, 1.0, 1.8])
    ax.set(xscale="log", yscale="log")
    readable_log(ax, "y")
    fig.canvas.draw()
    lo, hi = ax.get_ylim()
    shown = [t for t in ax.get_yticklabels() if t.get_text() and lo <= t.get_position()[1] <= hi]
    plt.close(fig)
    assert len(shown) >= 3, [t.get_text() for t in shown]


def test_the_eca_stage_timings_say_their_progress(monkeypatch, capsys):
    """The ECA notebook's longest cell times the stages shape by shape: each says so as it ends."""
    import torch

    from leetrepro.bench import related
    monkeypatch.setitem(related.STAGE_SHAPES, "cpu", ((64, 16), (128, 16)))
    rows = related.measure_eca_stages(torch.device("cpu"), reps=1)
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("eca stages")]
    assert len(lines) == 2 and "(2/2)" in lines[1] and len(rows) == 12


def _monkeypatch_targets():
    """Every ``monkeypatch.setattr(module, "NAME", …)`` in the tests whose module is one of this
    package's, imported in that file under that alias: ``(file, line, module path, NAME)``."""
    import ast
    import importlib
    import pathlib
    import pkgutil
    found = []
    for path in sorted(pathlib.Path(__file__).parent.glob("test_*.py")):
        tree = ast.parse(path.read_text())
        aliases = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("leetrepro"):
                for a in node.names:
                    aliases.setdefault(a.asname or a.name, set()).add(f"{node.module}.{a.name}")
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.startswith("leetrepro") and a.asname:
                        aliases.setdefault(a.asname, set()).add(a.name)
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            if isinstance(node.func, ast.Attribute) and node.func.attr == "setattr" and \
                    isinstance(node.func.value, ast.Name) and \
                    node.func.value.id == "monkeypatch" and len(node.args) >= 2:
                target, name, package = node.args[0], node.args[1], False
            elif isinstance(node.func, ast.Name) and node.func.id == "patch_chunk":
                target, name, package = ast.Name(id="leetrepro.methods.chunk"), node.args[1], True
                aliases.setdefault(target.id, {target.id})
            elif isinstance(node.func, ast.Name) and node.func.id == "patch_package":
                target, name, package = node.args[1], node.args[2], True
            else:
                continue
            # (a module's attribute: chunk.tables, the module under the alias then its path)
            attrs = []
            while isinstance(target, ast.Attribute):
                attrs.insert(0, target.attr)
                target = target.value
            if isinstance(target, ast.Name) and target.id in aliases and \
                    isinstance(name, ast.Constant) and isinstance(name.value, str):
                paths = {".".join([p, *attrs]) for p in aliases[target.id]}
                if package:  # (conftest.patch_package: the package and each of its modules)
                    paths |= {m.name for p in paths
                              for m in pkgutil.iter_modules(importlib.import_module(p).__path__,
                                                            p + ".")}
                found.append((path.name, node.lineno, paths, name.value))
    return found


def test_every_name_the_tests_patch_is_where_they_patch_it():
    """A test that patches a module's name the module no longer has, or only re-exports, would
    patch nothing where the code moved (GPU-only tests included, which this CPU never runs):
    every ``monkeypatch.setattr(module, "NAME", …)`` on this package's modules names an
    attribute the module defines or its own code reads."""
    import importlib
    targets = _monkeypatch_targets()
    assert len(targets) > 50
    missing = []
    for file, line, paths, name in targets:
        modules = []
        for p in paths:
            try:
                modules.append(importlib.import_module(p))
            except ImportError:  # (a name imported from a module, not a module)
                parent, _, attr = p.rpartition(".")
                modules.append(getattr(importlib.import_module(parent), attr))
        if not any(hasattr(m, name) and _reads_or_defines(m, name) for m in modules):
            missing.append(f"{file}:{line} {sorted(paths)} .{name}")
    assert not missing, missing


def _reads_or_defines(module, name: str) -> bool:
    """Whether a patch of ``module.name`` reaches code: the module defines the name at its top
    level (others read it as ``module.name``) or its own code reads it (an imported function
    its functions call); a name the module only re-exports is neither."""
    import inspect
    if not inspect.ismodule(module):
        return True
    names = _defined_and_read(module.__name__)
    return names is None or name in names[0] or name in names[1]


@functools.lru_cache(maxsize=None)
def _defined_and_read(module_name: str):
    """``(names defined at the top level, names read anywhere)`` of a module's source, parsed
    once; None where it has no source."""
    import ast
    import inspect
    try:
        tree = ast.parse(inspect.getsource(sys.modules[module_name]))
    except (OSError, TypeError):
        return None
    defined = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            for t in (node.targets if isinstance(node, ast.Assign) else [node.target]):
                defined.update(n.id for n in ast.walk(t) if isinstance(n, ast.Name))
    read = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    return defined, read


@pytest.mark.slow  # (a process importing torch)
def test_importing_the_package_leaves_torch_dynamo_unimported():
    """``import leetrepro`` does not import ``torch._dynamo`` (2 of its 5 seconds on a CPU, in
    every process a notebook, a rank or a benchmark starts), and the options' encoder carries the
    very mark ``torch.compiler.assume_constant_result`` would set (what ``torch.compile`` reads)."""
    code = ("import sys, leetrepro; assert 'torch._dynamo' not in sys.modules, "
            "'torch._dynamo imported by leetrepro'")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    import torch

    from leetrepro import ops

    def probe():
        return None
    marked = torch.compiler.assume_constant_result(probe)
    assert {k: v for k, v in vars(marked).items() if k.startswith("_dynamo")} == \
        {k: v for k, v in vars(ops.resolution._encode).items() if k.startswith("_dynamo")} != {}


#: where code tests for the per-token gates (comments and strings left out): the gates' tensor
#: or the kernels' constant compared, or a condition on a ``gates`` flag
_RULE_BRANCH = re.compile(r"\b(?:g|gate|t\.G|G)\s+is\s+(?:not\s+)?None\b|\bHAS_GATE\b|"
                          r"\b(?:if|and|or|not)\b[^\n]*\bgates\b")


def _code_only(text: str) -> str:
    """``text``'s Python tokens less its comments and strings (docstrings included)."""
    import io
    import tokenize
    out, last = [], None
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type in (tokenize.COMMENT, tokenize.STRING) or \
                tok.type == getattr(tokenize, "FSTRING_START", None):
            continue
        if last is not None and tok.start[0] != last:
            out.append("\n")
        out.append(tok.string + " ")
        last = tok.end[0]
    return "".join(out)


def _rule_branches() -> set:
    """The operator's files (the package less bench/, probes/, reproduce/) whose code branches
    on the per-token rule (:data:`_RULE_BRANCH`)."""
    return {path for path, text in _operator_sources() if _RULE_BRANCH.search(_code_only(text))}


def test_design_lists_the_files_that_branch_on_the_decay_rule():
    """DESIGN.md's "Adding a decay rule" names every file of the operator whose code branches on
    the per-token gates, and no other: the files a third rule would touch today, the number the
    house's refactor brings down."""
    text = open(os.path.join(ROOT, "DESIGN.md"), encoding="utf-8").read()
    section = text.split("## Adding a decay rule", 1)[1].split("\n## ", 1)[0]
    listed_part = section.split("*Files that branch on the rule*", 1)[1].split("\n\n", 1)[0]
    listed = set(re.findall(r"`([\w/]+\.py)`", listed_part.split("): ", 1)[1]))
    found = _rule_branches()
    assert len(found) >= 10
    assert found - listed == set(), f"branch on the rule, not in DESIGN.md: {sorted(found - listed)}"
    assert listed - found == set(), f"listed in DESIGN.md, no branch: {sorted(listed - found)}"
    count = re.search(r"\*Files that branch on the rule\*[^\d]*(\d+)", section)
    assert count and int(count.group(1)) == len(found), "the count in DESIGN.md"


def test_a_run_s_switches_come_from_the_environment(monkeypatch):
    """``LEETREPRO_SWITCHES`` sets the package's switches for a run (``tests/conftest.py``): each
    ``module.path.NAME=literal`` set, and a malformed item refused by name."""
    from conftest import _switches_from_the_environment
    from leetrepro.methods.chunk import tables
    monkeypatch.setattr(tables, "HOPPER_PIECES_SEGMENTS", tables.HOPPER_PIECES_SEGMENTS)
    monkeypatch.setattr(tables, "HOPPER_DUAL_PIECES_SHARE", tables.HOPPER_DUAL_PIECES_SHARE)
    monkeypatch.setenv("LEETREPRO_SWITCHES", "methods.chunk.tables.HOPPER_PIECES_SEGMENTS=True,"
                       "methods.chunk.tables.HOPPER_DUAL_PIECES_SHARE=0.5")
    assert _switches_from_the_environment() == [
        "methods.chunk.tables.HOPPER_PIECES_SEGMENTS=True",
        "methods.chunk.tables.HOPPER_DUAL_PIECES_SHARE=0.5"]
    assert tables.HOPPER_PIECES_SEGMENTS is True and tables.HOPPER_DUAL_PIECES_SHARE == 0.5
    monkeypatch.setenv("LEETREPRO_SWITCHES", "methods.chunk.tables.HOPPER_PIECES_SEGMENTS")
    with pytest.raises(ValueError, match="HOPPER_PIECES_SEGMENTS.*NAME=value"):
        _switches_from_the_environment()
