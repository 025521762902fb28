"""Times one Triton method at batch 1, N = 100000 and batch 16, N = 25600 (fp32 and fp16, both
masks) for each tile config in argv (JSON, through ``LEETREPRO_<METHOD>_CONFIG``). A development
aid behind NOTES.md's sweep rows: ``python -m leetrepro.bench.sweep Chunk '{"num_stages": 3}'``."""
import os
import sys

import torch

from ..api import causal_linear_decoder
from .harness import random_inputs, time_calls


def main():
    method, configs = sys.argv[1], sys.argv[2:] or ["{}"]
    for batch, n in ((1, 100000), (16, 25600)):
        for dtype in (torch.float32, torch.float16):
            B, C, V = random_inputs(batch, 32, n, 128, 128, dtype=dtype, device="cuda")
            for g in (None, torch.full((32,), 0.99, device="cuda", dtype=torch.float64)):
                for cfg in configs:
                    os.environ[f"LEETREPRO_{method.upper()}_CONFIG"] = cfg
                    try:
                        causal_linear_decoder(B, C, V, g, method=method)
                        t = sorted(time_calls(lambda *a: causal_linear_decoder(*a, g, method=method),
                                              [(B, C, V)], 7, "cuda"))[3]
                        print(f"{method} b{batch} N={n} {str(dtype)[6:]:8s} decay={g is not None!s:5s} "
                              f"{cfg:32s} {t * 1e3:8.3f} ms", flush=True)
                    except Exception as exc:
                        print(f"{method} b{batch} {cfg:32s} {str(dtype)[6:]} {type(exc).__name__}: "
                              f"{str(exc)[:100]}", flush=True)
            del B, C, V


if __name__ == "__main__":
    main()
