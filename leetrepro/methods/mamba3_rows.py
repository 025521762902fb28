"""Mamba-3's rotated rows: q̃, k̃ and the weighted keys the operator reads
(:func:`leetrepro.compat.mamba3_siso_combined`), one pass each way.

Forward, per (row, head): q + Q_bias and k + K_bias (read from their q/k head in place) turned
by the running angles (:func:`leetrepro.decay.trapezoid.rotate_pairs`), and the keys also
weighted by w (:func:`leetrepro.decay.trapezoid.key_weights`); each rounded once to Q's dtype
and held in θ's (float32; float64 for float64 inputs). One launch of ``kernels/mamba3_rows.py``
on a GPU where PyTorch took about thirty passes (strided even and odd columns, the biases, the
cosines and sines, the repeats over a group's heads: 11 ms of a 44 ms step at 4 × 4096 rows ×
64 heads on the H200, NOTES.md); PyTorch's expressions elsewhere.

Why held in float32 and differentiated at the rounded values: the output depends on the angles
only through θ_t − θ_s of each pair of rows, so each pair's parts of dθ_t and dθ_s cancel, and
the running sums that turn dθ into the Angles' and dt's gradients add up whatever is left.
Autograd's own Jacobian holds the unrounded q̃ on one side of a pair and the rounded key (inside
the operator's gradient) on the other; a 16-bit operand's gradient from the operator is rounded
too. Either left 1.2e-2 to 1.5e-2 of relative error in bf16 Angles' and DT's gradients at 97
rows. With both sides at the rounded values (dθ_i = dy_(2i+1)·y_2i − dy_2i·y_(2i+1)) and the
operator's gradients in float32 they cancel to float32's rounding.
"""
from __future__ import annotations

import torch

from .._direct import direct
from ..decay.trapezoid import rotate_pairs
from ._gpu import NoTriton, cdiv, launch, next_pow2, on_row_kernels

try:
    from ..kernels import mamba3_rows as kernels
except ImportError as err:  # without Triton: PyTorch's expressions
    kernels = NoTriton(err)

_TRITON_DTYPE = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}
BLOCK_T = 32  # rows a program
#: warps of the forward and the backward program: with 4 the backward spilled 64 bytes a thread
#: at headdim_qk 128 (sm_90), with 8 none (``probes.regs``' passes)
WARPS = (8, 8)


def _on_kernel(Q: torch.Tensor, theta: torch.Tensor) -> bool:
    return on_row_kernels(Q, kernels) and Q.dtype in _TRITON_DTYPE and \
        theta.dtype == torch.float32 and Q.numel() > 0


def _rows(t: torch.Tensor) -> tuple:
    """``(t, batch, seqlen, head strides)`` of ``(batch, seqlen, heads, ·)`` rows, the last dim
    contiguous."""
    t = t if t.stride(-1) == 1 else t.contiguous()
    return (t, *t.stride()[:3])


def _blocks(a: int, p: int) -> dict:
    return dict(A=a, P=p, BLOCK_T=BLOCK_T, BLOCK_A=next_pow2(a), BLOCK_E=next_pow2(max(p - 2 * a,
                                                                                         1)))


def _quarter(dy: torch.Tensor, y: torch.Tensor, a: int) -> torch.Tensor:
    return dy[..., 1:2 * a:2] * y[..., 0:2 * a:2] - dy[..., 0:2 * a:2] * y[..., 1:2 * a:2]


@torch.library.custom_op("leetrepro::mamba3_rotate", mutates_args=())
def mamba3_rotate(Q: torch.Tensor, K: torch.Tensor, Q_bias: torch.Tensor, K_bias: torch.Tensor,
                  theta: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor,
                                                                 torch.Tensor]:
    """``(q̃, k̃, w·k̃)``, each ``(batch, seqlen, heads, headdim_qk)`` contiguous in θ's dtype with
    values of Q's: Q, K ``(batch, seqlen, nheads_qk, headdim_qk)``; biases ``(heads,
    headdim_qk)``; θ ``(batch, seqlen, heads, A)`` and w ``(batch, seqlen, heads)`` (any strides).
    O(batch·seqlen·heads·headdim_qk)."""
    batch, n, hqk, p = Q.shape
    heads, a = theta.shape[2], theta.shape[3]
    acc = theta.dtype
    if not _on_kernel(Q, theta):
        rep = heads // hqk
        xq = Q.repeat_interleave(rep, 2).to(acc) + Q_bias.to(acc)
        xk = K.repeat_interleave(rep, 2).to(acc) + K_bias.to(acc)
        turned = rotate_pairs(xk, theta)
        return tuple(x.to(Q.dtype).to(acc).contiguous() for x in (
            rotate_pairs(xq, theta), turned, turned * w.to(acc)[..., None]))
    outs = [torch.empty(batch, n, heads, p, dtype=acc, device=Q.device) for _ in range(3)]
    launch(kernels.rotate_rows, (cdiv(n, BLOCK_T), batch * heads),
           dict(Q=_rows(Q), K=_rows(K), QB=Q_bias.float().contiguous(),
                KB=K_bias.float().contiguous(), TH=(theta, *theta.stride()),
                W=(w, *w.stride()), OUT_Q=outs[0], OUT_K=outs[1], OUT_KEY=outs[2],
                SIZE=(n, heads), REP=heads // hqk, ROUND=_TRITON_DTYPE[Q.dtype], **_blocks(a, p)),
           num_warps=WARPS[0])
    return tuple(outs)


@mamba3_rotate.register_fake
def _(Q, K, Q_bias, K_bias, theta, w):
    shape = (*Q.shape[:2], theta.shape[2], Q.shape[3])
    return tuple(Q.new_empty(shape, dtype=theta.dtype) for _ in range(3))


@torch.library.custom_op("leetrepro::mamba3_rotate_backward", mutates_args=())
def mamba3_rotate_backward(dq: torch.Tensor, dk: torch.Tensor, dkey: torch.Tensor,
                           q: torch.Tensor, k: torch.Tensor, key: torch.Tensor, K: torch.Tensor,
                           K_bias: torch.Tensor, theta: torch.Tensor, w: torch.Tensor
                           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The gradients of :func:`mamba3_rotate`'s turned rows a head each, ``(dXq, dXk, dθ, dw)``:
    dXq, dXk ``(batch, seqlen, heads, headdim_qk)`` (the rows before the turn, biases added),
    dθ ``(batch, seqlen, heads, A)``, dw ``(batch, seqlen, heads)``, all contiguous in θ's dtype;
    dθ taken at the rounded outputs q, k, key (the module docstring)."""
    batch, n, heads, p = q.shape
    a = theta.shape[3]
    acc = theta.dtype
    if not _on_kernel(K, theta):
        dq, dk, dkey = (x.to(acc) for x in (dq, dk, dkey))
        dtheta = _quarter(dq, q, a) + _quarter(dk, k, a) + _quarter(dkey, key, a)
        wk = w.to(acc)[..., None]
        xk = K.repeat_interleave(heads // K.shape[2], 2).to(acc) + K_bias.to(acc)
        return (rotate_pairs(dq, -theta).contiguous(),
                rotate_pairs(dk + wk * dkey, -theta).contiguous(), dtheta.contiguous(),
                (rotate_pairs(xk, theta) * dkey).sum(-1).contiguous())
    dxq, dxk = (torch.empty(batch, n, heads, p, dtype=acc, device=q.device) for _ in range(2))
    dth = torch.empty(batch, n, heads, a, dtype=acc, device=q.device)
    dw = torch.empty(batch, n, heads, dtype=acc, device=q.device)
    launch(kernels.rotate_rows_backward, (cdiv(n, BLOCK_T), batch * heads),
           dict(DQ=_rows(dq), DK=_rows(dk), DKEY=_rows(dkey), RQ=q, RK=k, RKEY=key, K=_rows(K),
                KB=K_bias.float().contiguous(), TH=(theta, *theta.stride()), W=(w, *w.stride()),
                DXQ=dxq, DXK=dxk, DTH=dth, DW=dw, SIZE=(n, heads), REP=heads // K.shape[2],
                **_blocks(a, p)),
           num_warps=WARPS[1])
    return dxq, dxk, dth, dw


@mamba3_rotate_backward.register_fake
def _(dq, dk, dkey, q, k, key, K, K_bias, theta, w):
    return (torch.empty_like(q), torch.empty_like(q), q.new_empty(*q.shape[:3], theta.shape[3]),
            q.new_empty(q.shape[:3]))


_rotate, _rotate_backward = direct(mamba3_rotate), direct(mamba3_rotate_backward)


class _TurnedRows(torch.autograd.Function):
    @staticmethod
    def forward(ctx, Q, K, Q_bias, K_bias, theta, w):
        q, k, key = _rotate(Q, K, Q_bias, K_bias, theta, w)
        ctx.save_for_backward(K, K_bias, theta, w, q, k, key)
        ctx.shapes = (Q.shape, Q.dtype, Q_bias.dtype, K_bias.dtype)
        return q, k, key

    @staticmethod
    def backward(ctx, dq, dk, dkey):
        K, K_bias, theta, w, q, k, key = ctx.saved_tensors
        shape, dtype, qb_dtype, kb_dtype = ctx.shapes
        dq, dk, dkey = (torch.zeros_like(q) if x is None else x for x in (dq, dk, dkey))
        dxq, dxk, dtheta, dw = _rotate_backward(dq, dk, dkey, q, k, key, K, K_bias, theta, w)
        batch, n, hqk, p = shape
        # (each q/k head's gradient summed over the heads that read it; the biases' over rows)
        grads = [dxq.view(batch, n, hqk, -1, p).sum(3).to(dtype),
                 dxk.view(batch, n, hqk, -1, p).sum(3).to(dtype),
                 dxq.sum((0, 1)).to(qb_dtype), dxk.sum((0, 1)).to(kb_dtype), dtheta, dw]
        return tuple(g if need else None for g, need in zip(grads, ctx.needs_input_grad))


def turned_rows(Q: torch.Tensor, K: torch.Tensor, Q_bias: torch.Tensor, K_bias: torch.Tensor,
                theta: torch.Tensor, w: torch.Tensor) -> tuple:
    """``(q̃, k̃, w·k̃)`` of :func:`mamba3_rotate`, differentiable in every input, dθ taken at the
    rounded values (the module docstring)."""
    return _TurnedRows.apply(Q, K, Q_bias, K_bias, theta, w)
