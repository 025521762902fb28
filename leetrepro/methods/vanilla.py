"""vanilla (Vanilla): materialise the masked N×N attention matrix. O(N²(r+d)) time, O(N²) memory."""
from __future__ import annotations

import os

import torch

from ..registry import register
from ._common import torch_method


def free_bytes(device: torch.device) -> int | None:
    """Memory free for new tensors on ``device`` (a GPU's free memory, the host's available
    memory), or None where it cannot be told."""
    try:
        if device.type == "cuda":
            return torch.cuda.mem_get_info(device)[0]
        if device.type == "cpu":
            return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, RuntimeError, AttributeError):
        pass
    return None


def check_quadratic_memory(b: torch.Tensor, name: str = "Vanilla", copies: int = 3) -> None:
    """Refuse, before allocating, a call whose N × N matrices (``copies`` of them: scores, mask,
    masked scores) do not fit the device's free memory: an error that says so and names the
    methods of linear memory, instead of the allocator failing after seconds of work."""
    batch, heads, n, _ = b.shape
    need = copies * batch * heads * n * n * b.element_size()
    free = free_bytes(b.device)
    if free is not None and need > free:
        raise MemoryError(f"method {name} materialises N × N = {n} × {n} attention matrices "
                          f"(O(N²) memory): about {need / 2 ** 30:.1f} GiB for batch {batch} × "
                          f"{heads} heads, {free / 2 ** 30:.1f} GiB free on {b.device}; use a method "
                          f"of linear memory (Chunk, LA, Bb, LA_torch) or method='auto'")


@register("vanilla", "Vanilla", complexity="O(N²(r+d))", language="torch",
          decays=("per_head", "per_token"),
          summary="B Cᵀ ⊙ M materialised, then times V")
@torch_method
def vanilla(b, c, v, decay):
    """``(B Cᵀ ⊙ M) V``. B, C ``(batch, H, N, r)``, V ``(batch, H, N, d)``; ``decay``: per-head λ,
    or per-token gates, M[i, j] = exp(G_i − G_j) from their running sums (float64).

    The mask is built in one vectorised expression (the original built it row by row in Python).
    """
    check_quadratic_memory(b)
    mask = decay.mask(b.shape[2], dtype=b.dtype, device=b.device)
    return ((b @ c.transpose(-1, -2)) * mask) @ v
