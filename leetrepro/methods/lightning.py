"""lightningAttention-2 (LA): intra-block quadratic part plus inter-block state (Qin et al., 2024).

For blocks of L rows, block i gets
    O_[i] = (B_[i] C_[i]ᵀ ⊙ M) V_[i] + diag(λ^1..λ^L) B_[i] H_i,
    H_i   = Σ_{j<i} λ^(L(i-1-j)) S_j,   S_j = (diag(λ^(L-1)..λ^0) C_[j])ᵀ V_[j].
The PyTorch twin (LA_torch) computes all intra-block parts in one batched product and the states
H_i by a discounted scan over blocks; O(N·(L·(r+d) + r·d)) time, O((N/L)·r·d) state memory.
The Triton kernel (LA) keeps H on chip and makes one pass over the inputs.

Per-token gates: LA_torch takes them (each block's mask and weights from its own running gate
sums, the block states chained by each block's total gate, one small product per block); the
Triton kernel LA does not (Chunk is its gated twin).
"""
from __future__ import annotations

import torch

from ..decay.blocks import of_blocks
from ..decay.per_head import scale_rows
from .._state import add_initial_state, final_state
from .. import tuning
from ..registry import GPU_DTYPES, register
from ..tuning import LA_TABLE
from ._common import torch_method
from ._gpu import (NoTriton, cdiv, dot_precision, next_pow2, refuse_interpreted_bf16,
                   segment_rows, sm_count, staged)

try:
    from ..kernels import _tiles as tiles, lightning_attn as la_kernels
except ImportError as err:  # without Triton: a clear error when a kernel is called
    tiles = la_kernels = NoTriton(err)


@register("lightningAttention-2_torch", "LA_torch", complexity="O(N·(L·(r+d) + r·d))",
          language="torch", state=True, decays=("per_head", "per_token"),
          summary="all blocks' intra parts batched, block states by a discounted scan; state in/out",
          options={"block_size": 128})
@torch_method
def lightning_attention2_torch(b, c, v, decay, block_size: int = 128,
                               initial_state=None, output_final_state: bool = False):
    """Shapes and gamma as in :func:`leetrepro.causal_linear_decoder`; ``block_size`` = L.
    ``initial_state``/``output_final_state``: :mod:`leetrepro._state` (S_N in float32, float64
    for float64 inputs). ``decay``: per-head λ or per-token gates (module docstring)."""
    s0 = None if initial_state is None else initial_state.to(b.dtype)
    b_in, c_in, v_in = b, c, v
    batch, heads, n, r = b.shape
    d = v.shape[-1]
    kw = dict(dtype=b.dtype, device=b.device)
    size = min(block_size, n)
    nb = cdiv(n, size)
    pad = nb * size - n
    b, c, v = (torch.nn.functional.pad(t, (0, 0, 0, pad)).view(batch, heads, nb, size, -1)
               for t in (b, c, v))
    blocks = decay.batched(nb, size, **kw)
    out = ((b @ c.transpose(-1, -2)) * blocks.mask) @ v
    if nb > 1:  # (the states entering blocks 1 .. nb-1, from blocks 0 .. nb-2's own)
        s = scale_rows(c[:, :, :-1], of_blocks(blocks.out_of, slice(0, nb - 1))) \
            .transpose(-1, -2) @ v[:, :, :-1]
        out[:, :, 1:] += scale_rows(b[:, :, 1:], of_blocks(blocks.into, slice(1, nb))) \
            @ decay.chained(s, blocks)
    out = out.reshape(batch, heads, nb * size, d)[:, :, :n]
    if s0 is None and not output_final_state:
        return out
    weights = decay.state_weights()
    out = add_initial_state(out, b_in, s0, *weights)
    if output_final_state:
        return out, final_state(c_in, v_in, weights[0], s0, weights[1])
    return out


def la_config(r: int, d: int, precision: str, half: bool = False, decay: bool = False,
              device=None, config: dict | None = None) -> dict:
    """Block sizes for the Triton kernel: sized so that an H100
    (:data:`leetrepro._device.SM90_SHARED_BYTES` of shared memory per program) launches every
    dtype and precision up to r = d = 256 (the original's fp16 config needed 245760 bytes); warps
    and stages from the table measured on ``device``'s GPU (``data/<gpu>/la_config.csv``), else
    :data:`leetrepro.tuning.LA_TABLE`. ``config``: entries replacing those (``num_warps``, ``num_stages``, …; the
    sweeps of ``make tune``)."""
    block_r = next_pow2(r)
    if block_r > 128:
        cfg = dict(BLOCK_N=32, BLOCK_R=block_r, BLOCK_D=min(32, next_pow2(d)), num_warps=8,
                   num_stages=1)
    else:
        kind = "half" if half else precision
        warps, stages = tuning.launch_table(device, "la_config.csv", ("warps", "stages")).get(
            (kind, decay), LA_TABLE[(kind, decay)])
        cfg = dict(BLOCK_N=64, BLOCK_R=block_r, BLOCK_D=min(64, next_pow2(d)), num_warps=warps,
                   num_stages=stages)
    return cfg | (config or {})


#: LA's kernel (4 warps, ~50 KB of shared memory at r = d = 128) runs about this many programs per
#: SM at once; its segment states cost an extra read of C and V, worth it only for segments of at
#: least LA_MIN_SEGMENT rows (:func:`leetrepro.methods._gpu.segment_rows`)
LA_PER_SM = 4
LA_MIN_SEGMENT = 1024


@register("lightningAttention-2", "LA", complexity="O(N·(L·(r+d) + r·d))", language="triton",
          dtypes=GPU_DTYPES, devices=("cuda",),
          summary="Triton: intra-block quadratic + on-chip inter-block state, one sweep over N",
          options={"fp32_precision": "tf32", "config": None})
def lightning_attention2(B, C, V, gamma, fp32_precision: str | None = None,
                         config: dict | None = None):
    """Triton lightningAttention-2. Shapes and gamma as in :func:`leetrepro.causal_linear_decoder`.

    fp32 inputs use tf32 dot products unless ``fp32_precision`` says otherwise (``"tf32x3"``,
    ``"ieee"``; see :mod:`leetrepro.methods._gpu`). Grid: (batch·heads, d / BLOCK_D, segments
    of N), segments only when batch·heads is too small to fill the GPU (:func:`segment_rows`).
    ``config``: launch settings replacing the measured table's (:func:`la_config`), for sweeps.
    """
    refuse_interpreted_bf16(V.dtype, "LA")
    batch, heads, n, r = B.shape
    d = V.shape[-1]
    B, C, V, lam = staged(B, C, V, gamma)
    out = torch.empty_like(V)
    precision = dot_precision(V.dtype, fp32_precision)
    cfg = la_config(r, d, precision, half=V.dtype != torch.float32, decay=lam is not None,
                    device=V.device, config=config)
    d_blocks = cdiv(d, cfg["BLOCK_D"])
    # up to LA_PER_SM programs share an SM; segments of at least LA_MIN_SEGMENT rows
    seg = segment_rows(n, batch * heads * d_blocks, cfg["BLOCK_N"], LA_PER_SM * sm_count(V.device),
                       min_rows=LA_MIN_SEGMENT)
    n_seg = cdiv(n, seg)
    grid = (batch * heads, d_blocks, n_seg)
    consts = tiles.constants(cfg, HAS_DECAY=lam is not None, HALF_RANGE=V.dtype != torch.float32,
                             PRECISION=precision)
    options = dict(num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    size = (n, r, d, heads, seg)
    states = None
    if n_seg > 1:
        states = torch.empty(batch * heads, n_seg, cfg["BLOCK_R"], d, dtype=torch.float32,
                             device=V.device)
        la_kernels.la_state_kernel[grid](C=C, V=V, S=states, GAMMA=lam, SIZE=size, K=consts,
                                         **options)
    flags = torch.zeros(batch * heads * d_blocks, dtype=torch.int32, device=V.device)
    la_kernels.la_fwd_kernel[grid](B=B, C=C, V=V, O=out, S=states, FLAGS=flags, GAMMA=lam,
                                   SIZE=size, K=consts, SPLIT=n_seg > 1, REPAIR=False, **options)
    # lanes whose outputs came out non-finite, recomputed without letting a row reach earlier ones
    la_kernels.la_fwd_kernel[grid[:2] + (1,)](
        B=B, C=C, V=V, O=out, S=None, FLAGS=flags, GAMMA=lam, SIZE=(n, r, d, heads, n), K=consts,
        SPLIT=False, REPAIR=True, num_warps=cfg["num_warps"], num_stages=1)
    return out
