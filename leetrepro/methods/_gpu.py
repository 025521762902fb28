"""What the Triton and CUDA launchers share: input staging and the fp32 precision switch.

fp32 precision of the Triton kernels' dot products (``fp32_precision`` option, or the
``LEETREPRO_FP32_PRECISION`` environment variable for the default):

* ``"tf32"`` (default): tensor-core tf32, ~1e-3 relative error, the accuracy every public kernel of
  this operator has (original LeetDecoding, flash-linear-attention); held to 5e-3 in the tests.
* ``"tf32x3"``: three tf32 products (split operands), ~1e-6, meets the fp32 contract (1e-5).
* ``"ieee"``: plain fp32 FMA, the slowest.

fp16/bf16 inputs use fp16/bf16 tensor-core products with fp32 accumulation and an fp32 state.
"""
from __future__ import annotations

import functools
import json
import os

import torch

FP32_PRECISIONS = ("tf32", "tf32x3", "ieee")


def default_fp32_precision() -> str:
    p = os.environ.get("LEETREPRO_FP32_PRECISION", "tf32")
    if p not in FP32_PRECISIONS:
        raise ValueError(f"LEETREPRO_FP32_PRECISION={p!r}; use one of {FP32_PRECISIONS}")
    return p


def dot_precision(dtype: torch.dtype, fp32_precision: str | None) -> str:
    """The ``input_precision`` of the kernels' ``tl.dot`` on fp32 operands for this input dtype."""
    p = default_fp32_precision() if fp32_precision is None else fp32_precision
    if p not in FP32_PRECISIONS:
        raise ValueError(f"fp32_precision={p!r}; use one of {FP32_PRECISIONS}")
    # half-precision inputs: the fp32 state products stay on tensor cores in tf32
    return p if dtype == torch.float32 else "tf32"


def staged(B, C, V, gamma):
    """Contiguous inputs and the per-head decay as the kernels read it: float32 ``(H,)`` log λ
    (Triton) and λ (CUDA), or None for the 0-1 mask."""
    B, C, V = B.contiguous(), C.contiguous(), V.contiguous()
    if gamma is None:
        return B, C, V, None, None
    g64 = gamma.to(device=V.device, dtype=torch.float64)
    return B, C, V, torch.log(g64).to(torch.float32).contiguous(), g64.to(torch.float32).contiguous()


def staged_state(state: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor | None:
    """An initial state (checked by the API) as the kernels read it: float32, contiguous."""
    if state is None:
        return None
    return state.to(device=like.device, dtype=torch.float32).contiguous()


def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device (4 elsewhere: the interpreter's stand-in)."""
    if device.type != "cuda":
        return 4
    return _sm_count(device.index if device.index is not None else torch.cuda.current_device())


@functools.lru_cache(maxsize=None)
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def config_override(method: str) -> dict:
    """Tile-config entries from ``LEETREPRO_<METHOD>_CONFIG`` (JSON), for sweeps, not users:
    ``LEETREPRO_CHUNK_CONFIG='{"num_stages": 3}' python -m leetrepro._sweep Chunk``."""
    return json.loads(os.environ.get(f"LEETREPRO_{method.upper()}_CONFIG", "{}"))


def cdiv(a: int, b: int) -> int:
    """⌈a / b⌉ for positive integers (grid sizes, block counts)."""
    return -(-a // b)


def next_pow2(x: int, minimum: int = 16) -> int:
    return max(minimum, 1 << max(0, (x - 1).bit_length()))


def triton_kernels(module: str):
    """Import ``leetrepro.kernels.<module>`` (needs Triton), with a clear error without it."""
    try:
        import importlib
        return importlib.import_module(f"leetrepro.kernels.{module}")
    except ImportError as err:
        raise RuntimeError(f"this method needs Triton ({err}); `pip install triton` or use its "
                           f"_torch twin") from err
