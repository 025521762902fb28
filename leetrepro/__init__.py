"""leetrepro: the reference reproduction of LeetDecoding (exponentially decaying causal linear
attention, ``O = (B Cᵀ ⊙ M) V`` with ``M[i, j] = γ^(i-j)`` for i ≥ j).

    from leetrepro import causal_linear_decoder
    O = causal_linear_decoder(B, C, V, gamma=0.9)        # B, C: (batch, H, N, r); V: (batch, H, N, d)
"""
import importlib.util as _ilu
import os as _os
import sys as _sys


def _kernels_from_checkout() -> None:
    # Installed, kernels/ ships as leetrepro.kernels (pyproject's package-dir). Run from a source
    # checkout (PYTHONPATH=.), map the top-level kernels/ folder to that name.
    if "leetrepro.kernels" in _sys.modules or _ilu.find_spec("leetrepro.kernels") is not None:
        return
    root = _os.path.join(_os.path.dirname(_os.path.dirname(_os.path.abspath(__file__))), "kernels")
    if _os.path.isfile(_os.path.join(root, "__init__.py")):
        spec = _ilu.spec_from_file_location("leetrepro.kernels", _os.path.join(root, "__init__.py"),
                                            submodule_search_locations=[root])
        module = _ilu.module_from_spec(spec)
        _sys.modules["leetrepro.kernels"] = module
        spec.loader.exec_module(module)


_kernels_from_checkout()

from . import complexity, methods  # noqa: E402
from .api import auto_method, causal_linear_decoder  # noqa: E402
from .bench import benchmark_method  # noqa: E402
from .reference import reference, rel_error  # noqa: E402
from .registry import available, register  # noqa: E402

__version__ = "0.1.0"
__all__ = ["causal_linear_decoder", "reference", "rel_error", "benchmark_method", "available",
           "register", "methods", "complexity", "auto_method"]
