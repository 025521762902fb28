"""The floating dtypes the package takes and their names: the long names PyTorch gives and the
short ones tables and CSV columns use, and a parser for either."""
from __future__ import annotations

import torch

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
DTYPE_NAMES = {torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float32: "float32",
               torch.float64: "float64"}
#: the short names tables and CSV columns use (fp16, bf16, fp32, fp64)
SHORT_NAMES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32",
               torch.float64: "fp64"}


def parse_dtype(dtype) -> torch.dtype:
    """``"fp16"``, ``"float16"``, ``"half"``, ``torch.float16`` ... -> ``torch.float16``."""
    if isinstance(dtype, torch.dtype):
        if dtype not in FLOAT_DTYPES:
            raise ValueError(f"dtype {dtype} is not supported; use one of float16, bfloat16, "
                             f"float32, float64")
        return dtype
    aliases = {"fp16": torch.float16, "float16": torch.float16, "half": torch.float16,
               "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
               "fp32": torch.float32, "float32": torch.float32, "float": torch.float32,
               "fp64": torch.float64, "float64": torch.float64, "double": torch.float64}
    try:
        return aliases[str(dtype).lower()]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {sorted(aliases)}") from None
