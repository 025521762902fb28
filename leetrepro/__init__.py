"""leetrepro: the reference reproduction of LeetDecoding (exponentially decaying causal linear
attention, ``O = (B Cᵀ ⊙ M) V`` with ``M[i, j] = γ^(i-j)`` for i ≥ j).

    from leetrepro import causal_linear_decoder
    O = causal_linear_decoder(B, C, V, gamma=0.9)        # B, C: (batch, H, N, r); V: (batch, H, N, d)
"""
from . import complexity, methods
from .api import auto_method, causal_linear_decoder
from .bench import benchmark_method
from .reference import reference, rel_error
from .registry import available, register

__version__ = "0.1.0"
__all__ = ["causal_linear_decoder", "reference", "rel_error", "benchmark_method", "available",
           "register", "methods", "complexity", "auto_method"]
