"""How big the kernels' functions are: each function's parameters and lines, read from the source
(nothing is imported or compiled), against the ceilings a newcomer can still read:
:data:`MAX_PARAMS` for a kernel or device function (``@triton.jit``, ``@gluon.jit``),
:data:`MAX_LINES` for any function of the kernels and of Chunk's launchers. A test holds them.

``python -m leetrepro.probes.sizes [--all]`` prints the functions over a ceiling (``--all``: every
function, largest first).
"""
from __future__ import annotations

import argparse
import ast
import os
import sys
import typing

from .._paths import PACKAGE

#: parameters of a kernel or device function, at most (a bundle or an aggregate counts as one)
MAX_PARAMS = 15
#: lines of a function (its signature and docstring included), at most
MAX_LINES = 80
#: the package's folders of tools that measure the operator (benchmarks, the paper's tables, the
#: probes): :func:`operator_files` leaves them out
TOOLS = ("bench", "reproduce", "probes")


def operator_files() -> tuple:
    """Every Python file of the package but :data:`TOOLS`', relative to the package: the
    operator, its methods, kernels, models and integrations, whose functions a test holds to
    :data:`MAX_LINES`."""
    found = []
    for folder, dirs, names in os.walk(PACKAGE):
        rel = os.path.relpath(folder, PACKAGE)
        dirs[:] = sorted(d for d in dirs if d != "__pycache__" and
                         (rel != "." or d not in TOOLS))
        found += [os.path.normpath(os.path.join(rel, n)) for n in sorted(names) if n.endswith(".py")]
    return tuple(found)


#: the files read, relative to the package: every Triton and Gluon kernel, and the launchers that
#: build the operator's kernels' arguments
FILES = tuple(f for f in operator_files()
              if f.startswith("kernels/") and f != "kernels/__init__.py") + (
    "methods/chunk/tables.py", "methods/chunk/hopper_launch.py", "methods/chunk/plans.py",
    "methods/chunk/scan.py", "methods/chunk/gate_grads.py", "methods/_gpu.py",
    "methods/lightning.py", "methods/fleet.py", "decode.py", "methods/normalizer.py")


class Size(typing.NamedTuple):
    file: str
    function: str   # (a method as Class.name)
    params: int     # self and cls not counted
    lines: int
    jit: bool       # a kernel or device function


def sizes(files: typing.Iterable[str] = FILES) -> list[Size]:
    """Every function (methods included) of ``files``."""
    found = []
    for name in files:
        with open(os.path.join(PACKAGE, name), encoding="utf-8") as f:
            tree = ast.parse(f.read())
        found += _functions(name, tree.body, "")
    return found


def _functions(name: str, body: list, prefix: str) -> list[Size]:
    found = []
    for node in body:
        if isinstance(node, ast.ClassDef):
            found += _functions(name, node.body, f"{prefix}{node.name}.")
        elif isinstance(node, ast.FunctionDef):
            a = node.args
            params = [p.arg for p in a.posonlyargs + a.args + a.kwonlyargs]
            params = [p for p in params if p not in ("self", "cls")]
            params += [v.arg for v in (a.vararg, a.kwarg) if v is not None]
            jit = any("jit" in ast.unparse(d) for d in node.decorator_list)
            found.append(Size(name, prefix + node.name, len(params),
                              node.end_lineno - node.lineno + 1, jit))
    return found


def over(found: list[Size]) -> list[Size]:
    """The functions over a ceiling."""
    return [s for s in found if (s.jit and s.params > MAX_PARAMS) or s.lines > MAX_LINES]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--all", action="store_true", help="every function, largest first")
    args = p.parse_args(argv)
    found = sizes()
    shown = sorted(found, key=lambda s: (-s.params, -s.lines)) if args.all else over(found)
    print(f"ceilings: {MAX_PARAMS} parameters (kernel and device functions), {MAX_LINES} lines")
    for s in shown:
        print(f"{s.file:28s} {s.function:34s} {'jit ' if s.jit else '    '}"
              f"params {s.params:3d}  lines {s.lines:4d}")
    return 1 if over(found) else 0


if __name__ == "__main__":
    sys.exit(main())
