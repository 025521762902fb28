"""causal-dot-product (Cdotp): the row-based Algorithm 1 (Appendix B.1; Vyas et al., 2020;
Choromanski et al., 2020, Eq. 11), with decay: U_i = λ U_{i-1} + c_iᵀ v_i, o_i = b_i U_i.

O(N·r·d) time, O(r·d) state per (batch, head). The PyTorch twin steps through the tokens in Python
(vectorised over batch and heads); the CUDA kernel (``Cdotp``) keeps the state on chip.
"""
from __future__ import annotations

import functools

import torch

from ..registry import GPU_DTYPES, register
from ._common import torch_method
from ._gpu import kernel_source, staged


@register("causal-dot-product_torch", "Cdotp_torch", complexity="O(N·r·d)", language="torch",
          summary="Algorithm 1: one r×d state update and one row of output per token")
@torch_method
def causal_dot_product_torch(b, c, v, decay):
    """Shapes and gamma as in :func:`leetrepro.causal_linear_decoder` (``decay``: its log λ)."""
    batch, heads, n, r = b.shape
    lg = decay.lg
    if lg is not None:
        # λ as hi + lo: λ near 1 rounded to the compute dtype is off by up to 3e-8 (fp32), which
        # compounds over N steps (1e-4 at N = 4096); the lo part carries the rest
        lam = torch.exp(lg.double()).view(1, heads, 1, 1)
        hi = lam.to(b.dtype)
        lo = (lam - hi.double()).to(b.dtype)
    state = torch.zeros(batch, heads, r, v.shape[-1], dtype=b.dtype, device=b.device)
    out = torch.empty(batch, heads, n, v.shape[-1], dtype=b.dtype, device=b.device)
    for i in range(n):
        if lg is not None:
            state = torch.addcmul(state * lo, state, hi)
        state.add_(c[:, :, i, :, None] * v[:, :, i, None, :])
        out[:, :, i] = (b[:, :, i, None, :] @ state).squeeze(-2)
    return out


@functools.lru_cache(maxsize=1)
def cuda_extension():
    """Build (first use; cached by torch under ``$TORCH_EXTENSIONS_DIR``) and load the CUDA kernel."""
    from torch.utils import cpp_extension

    if cpp_extension.CUDA_HOME is None:
        raise RuntimeError(
            "Cdotp builds its CUDA kernel on first use and needs the CUDA toolkit (nvcc), which was "
            "not found: install the toolkit matching torch.version.cuda = "
            f"{torch.version.cuda} and set CUDA_HOME, or use method='Cdotp_torch'")
    sources = [kernel_source("cdotp_binding.cpp"), kernel_source("cdotp.cu")]
    return cpp_extension.load(name="leetrepro_cdotp", sources=sources,
                              extra_cuda_cflags=["-O3", "-std=c++17"], verbose=False)


@register("causal-dot-product", "Cdotp", complexity="O(N·r·d)", language="cuda", dtypes=GPU_DTYPES,
          devices=("cuda",),
          summary="CUDA: r×32 state per thread block on chip, one sweep over N (Vyas et al. style)")
def causal_dot_product(B, C, V, gamma):
    """CUDA causal-dot-product. Shapes and gamma as in :func:`leetrepro.causal_linear_decoder`;
    r ≤ 256. fp32 accumulation for every dtype. Grid: (batch·heads, d / 32)."""
    if B.shape[-1] > 256:
        raise ValueError(f"Cdotp supports rank r ≤ 256, got r = {B.shape[-1]}; use LA or Cdotp_torch")
    B, C, V, g = staged(B, C, V, gamma)
    return cuda_extension().forward(B, C, V, g, torch.cuda.current_stream(V.device).cuda_stream)
