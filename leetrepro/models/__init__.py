"""Decoder blocks of the two linear-attention LLMs of the paper's Section 5.2 (Tables 7-8), with the
attention computation swappable for any registered method (``attention_method=``), the model's own
way (``"original"``) or the float64 oracle (``"reference"``).

Weights are seeded random with the published shapes (wall time does not depend on their values);
see :mod:`leetrepro.models.configs` for the shapes and their sources. :class:`Mamba2Block`: a
Mamba-2 mixer on the operator with per-token gates (:mod:`leetrepro.models.mamba2`);
:class:`Mamba3Block`: Mamba-3's (SISO), its trapezoidal rule folded in (:mod:`leetrepro.models.mamba3`).
"""
from .configs import CONFIGS, config
from .mamba2 import Mamba2Block
from .mamba3 import Mamba3Block
from .retnet import RetNet
from .transnormer import TransNormerLLM

MODELS = {"transnormer": TransNormerLLM, "retnet": RetNet}


def build(name: str, cfg: dict | None = None, *, seed: int = 0, **overrides):
    """A model by name (``"transnormer"``, ``"retnet"``) with seeded random weights."""
    import torch
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; use one of {sorted(MODELS)}")
    torch.manual_seed(seed)
    return MODELS[name](cfg or config(name, **overrides))


__all__ = ["CONFIGS", "MODELS", "Mamba2Block", "Mamba3Block", "RetNet", "TransNormerLLM", "build", "config"]
