"""Times LA at batch 1, N = 100000 (fp32, fp16; both masks) for each config in argv (JSON).
A development aid behind NOTES.md's LA rows: ``python -m leetrepro._la_sweep '{"num_warps": 8}'``."""
import os
import sys

import torch

from . import causal_linear_decoder
from .bench import time_calls


def main():
    for cfg in sys.argv[1:]:
        os.environ["LEETREPRO_LA_CONFIG"] = cfg
        for dtype in (torch.float32, torch.float16):
            B, C, V = (torch.randn(1, 32, 100000, 128, device="cuda", dtype=dtype) for _ in range(3))
            for g in (None, torch.full((32,), 0.99, device="cuda")):
                try:
                    causal_linear_decoder(B, C, V, g, method="LA")
                    t = sorted(time_calls(lambda *a: causal_linear_decoder(*a, g, method="LA"),
                                          [(B, C, V)], 9, "cuda"))[4]
                    print(f"{cfg:45s} {str(dtype):14s} decay={g is not None!s:5s} {t * 1e3:7.3f} ms",
                          flush=True)
                except Exception as exc:
                    print(f"{cfg:45s} {str(dtype):14s} {type(exc).__name__}: {str(exc)[:80]}")


if __name__ == "__main__":
    main()
