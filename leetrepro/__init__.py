"""leetrepro: the reference reproduction of LeetDecoding (exponentially decaying causal linear
attention, ``O = (B Cᵀ ⊙ M) V`` with ``M[i, j] = γ^(i-j)`` for i ≥ j).

    from leetrepro import causal_linear_decoder
    O = causal_linear_decoder(B, C, V, gamma=0.9)        # B, C: (batch, H, N, r); V: (batch, H, N, d)

The operator lives here (API, custom op with its backward, one module per method family, oracle,
registry, dispatch); the tools that measure it live in :mod:`leetrepro.bench` (``from
leetrepro.bench import benchmark_method``, the paper's Listing 1), the reproduction of the paper's
tables in :mod:`leetrepro.reproduce`, the paper's two models in :mod:`leetrepro.models`. One
sequence over several GPUs: :func:`causal_linear_decoder_sp` (:mod:`leetrepro.distributed`).
Serving: packed prompts (``cu_seqlens=``), :func:`decode_step` over a pool of states
(:mod:`leetrepro.decode`), and flash-linear-attention's :func:`chunk_simple_gla` and
:func:`fused_recurrent_simple_gla` as drop-ins (:mod:`leetrepro.compat`). Per-token gates (simple
GLA's and Mamba-2's data-dependent decay): ``causal_linear_decoder(..., g=log_gates)``.
"""
from . import complexity, methods
from .api import causal_linear_decoder
from .compat import chunk_simple_gla, fused_recurrent_simple_gla
from .decode import decode_step
from .dispatch import auto_method
from .distributed import causal_linear_decoder_sp
from .projection import split_projection
from . import reference  # (the module, callable as the oracle: reference.py says why)
from .reference import rel_error
from .registry import available, register

__version__ = "0.2.0"
__all__ = ["causal_linear_decoder", "causal_linear_decoder_sp", "chunk_simple_gla",
           "fused_recurrent_simple_gla", "decode_step",
           "split_projection",
           "reference", "rel_error", "available", "register", "methods",
           "complexity", "auto_method"]
