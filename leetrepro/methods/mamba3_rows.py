"""Mamba-3's rows around the operator (:func:`leetrepro.compat.mamba3_siso_combined`), one pass
each way: the running angles, the turned rows the operator reads, and the gated output after
it.

The running angles (:func:`angle_sums`): each (sequence, head)'s sum of tanh(Angles)·π·dt down
its rows in float64, one program walking them (packed sequences each started again); back, the
suffix sums of dθ likewise in float64.

The turned rows, per (row, head): q + Q_bias and k + K_bias (read from their q/k head in place)
turned by the running angles (:func:`leetrepro.decay.trapezoid.rotate_pairs`), the keys also
weighted by w (:func:`leetrepro.decay.trapezoid.key_weights`), each rounded once to Q's dtype
and held in θ's (float32; float64 for float64 inputs), and each row's pair with itself
Σ q̃·k̃ (what the layer reads of k̃ besides the keys). Backward, each q/k head's gradient summed
over the heads that read it in the same pass. Where no gradient is wanted the rows come in Q's
own dtype, for the operator to run in it. The gated output ``(o + w·v)·silu(z)``: one pass each
way. One launch of ``kernels/mamba3_rows.py`` each on a GPU, where PyTorch took about thirty
passes (strided even and odd columns, the biases, the cosines and sines, the repeats over a
group's heads: 11 ms of a 44 ms step at 4 × 4096 rows × 64 heads on the H200, NOTES.md);
PyTorch's expressions elsewhere.

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

import math

import torch

from .._direct import apply, direct
from ..decay.trapezoid import rotate_pairs, running_angles, sequence_starts
from ._gpu import NoTriton, cdiv, launch, next_pow2, on_row_kernels, sm_count

try:
    from ..kernels import mamba3_rows as kernels
except ImportError as err:  # without Triton: PyTorch's expressions
    kernels = NoTriton(err)

_TRITON_DTYPE = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}
BLOCK_T = 32  # rows a program
#: rows a program of the backward, which holds a q/k head's two sums beside a head's rows
BLOCK_T_BACK = 16
#: rows a program of the gated output, and its warps (at 4 its backward took 208 registers a
#: thread at headdim 64, at 8 109: sm_90, ``probes.regs``' passes)
BLOCK_T_OUT, WARPS_OUT = 32, 8
#: warps of the forward and the backward program: with 4 the backward spilled 64 bytes a thread
#: at headdim_qk 128 (sm_90), with 8 none (``probes.regs``' passes)
WARPS = (8, 8)


def _on_kernel(Q: torch.Tensor, theta: torch.Tensor) -> bool:
    return on_row_kernels(Q, kernels) and Q.dtype in _TRITON_DTYPE and \
        theta.dtype == torch.float32 and Q.numel() > 0


def _on_output_kernel(v: torch.Tensor) -> bool:
    return on_row_kernels(v, kernels) and v.dtype in _TRITON_DTYPE and v.numel() > 0


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
                  theta: torch.Tensor, w: torch.Tensor, narrow: bool = False
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(q̃, w·k̃, Σ_d q̃·k̃)``: the first two ``(batch, seqlen, heads, headdim_qk)`` contiguous
    in θ's dtype with values of Q's (``narrow``: in Q's dtype), the own pairs ``(batch, seqlen,
    heads)`` in θ's dtype, taken at the rounded rows. Q, K ``(batch, seqlen, nheads_qk,
    headdim_qk)``; biases ``(heads, headdim_qk)``; θ ``(batch, seqlen, heads, A)`` and w
    ``(batch, seqlen, heads)`` (any strides). O(batch·seqlen·heads·headdim_qk)."""
    batch, n, hqk, p = Q.shape
    heads, a = theta.shape[2], theta.shape[3]
    acc = theta.dtype
    out = Q.dtype if narrow else acc
    if not _on_kernel(Q, theta):
        q, turned = _round(_turned(Q, Q_bias, theta), Q), _turned(K, K_bias, theta)
        k = _round(turned, Q)
        return (q.to(out).contiguous(), _round(turned * w.to(acc)[..., None], Q).to(out).contiguous(),
                (q * k).sum(-1).contiguous())
    q, key = (torch.empty(batch, n, heads, p, dtype=out, device=Q.device) for _ in range(2))
    own = torch.empty(batch, n, heads, dtype=acc, device=Q.device)
    launch(kernels.rotate_rows, (cdiv(n, BLOCK_T), batch * heads),
           dict(Q=_rows(Q), K=_rows(K), QB=Q_bias.float().contiguous(),
                KB=K_bias.float().contiguous(), TH=(theta, *theta.stride()),
                W=(w, *w.stride()), OUT_Q=q, OUT_KEY=key, OWN=own, SIZE=(n, heads),
                CONST=kernels.RowConstants(REP=heads // hqk, ROUND=_TRITON_DTYPE[Q.dtype],
                                           TH_T=theta.stride(1) == 1, **_blocks(a, p))),
           num_warps=WARPS[0])
    return q, key, own


@mamba3_rotate.register_fake
def _(Q, K, Q_bias, K_bias, theta, w, narrow=False):
    shape = (*Q.shape[:2], theta.shape[2], Q.shape[3])
    out = Q.dtype if narrow else theta.dtype
    return (Q.new_empty(shape, dtype=out), Q.new_empty(shape, dtype=out),
            Q.new_empty(shape[:3], dtype=theta.dtype))


def _round(x: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """x rounded to like's dtype, held in x's."""
    return x.to(like.dtype).to(x.dtype)


def _turned(X: torch.Tensor, X_bias: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
    """R(θ)(X + X_bias) a head each, in θ's dtype: the kernels' rows in PyTorch."""
    acc = theta.dtype
    return rotate_pairs(X.repeat_interleave(theta.shape[2] // X.shape[2], 2).to(acc) +
                        X_bias.to(acc), theta)


@torch.library.custom_op("leetrepro::mamba3_rotate_backward", mutates_args=())
def mamba3_rotate_backward(dq: torch.Tensor, dkey: torch.Tensor, down: torch.Tensor,
                           q: torch.Tensor, key: torch.Tensor, K: torch.Tensor,
                           K_bias: torch.Tensor, theta: torch.Tensor, w: torch.Tensor,
                           need_theta: bool = True
                           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                                      torch.Tensor, torch.Tensor]:
    """The gradients of :func:`mamba3_rotate`'s inputs from those of its outputs (dq, dkey
    ``(batch, seqlen, heads, headdim_qk)``, down ``(batch, seqlen, heads)``) and its outputs q
    and key: ``(dQ, dK, dQ_bias, dK_bias, dθ, dw)``, dQ and dK ``(batch, seqlen, nheads_qk,
    headdim_qk)`` in K's dtype (each q/k head's summed over the heads that read it, in θ's
    dtype), the biases' ``(heads, headdim_qk)``, dθ ``(batch, seqlen, heads, A)`` and dw
    ``(batch, seqlen, heads)``, all in θ's dtype; dθ taken at the rounded q and key, the own
    pairs' parts of it left out (they cancel: both rows turn together). Without
    ``need_theta`` dθ is an empty tensor (the key rows are then not read)."""
    batch, n, heads, p = q.shape
    hqk, a = K.shape[2], theta.shape[3]
    acc = theta.dtype
    if not _on_kernel(K, theta):
        dq, dkey, down = (x.to(acc) for x in (dq, dkey, down))
        turned = _turned(K, K_bias, theta)
        k = _round(turned, K)
        dtheta = _quarter(dq, q, a) + _quarter(dkey, key, a) if need_theta else theta.new_empty(0)
        dxq = rotate_pairs(dq + down[..., None] * k, -theta)
        dxk = rotate_pairs(down[..., None] * q + w.to(acc)[..., None] * dkey, -theta)
        return (dxq.view(batch, n, hqk, -1, p).sum(3).to(K.dtype),
                dxk.view(batch, n, hqk, -1, p).sum(3).to(K.dtype), dxq.sum((0, 1)),
                dxk.sum((0, 1)), dtheta.contiguous(), (turned * dkey).sum(-1).contiguous())
    blocks = cdiv(n, BLOCK_T_BACK)
    dxq, dxk = (torch.empty(batch, n, hqk, p, dtype=K.dtype, device=q.device) for _ in range(2))
    dqb, dkb = (torch.empty(batch, blocks, heads, p, dtype=acc, device=q.device)
                for _ in range(2))
    dth = torch.empty((batch, n, heads, a) if need_theta else (0,), dtype=acc, device=q.device)
    dw = torch.empty(batch, n, heads, dtype=acc, device=q.device)
    launch(kernels.rotate_rows_backward, (blocks, batch * hqk),
           dict(DQ=_rows(dq), DKEY=_rows(dkey), DOWN=down.contiguous(), RQ=q, RKEY=key,
                K=_rows(K), KB=K_bias.float().contiguous(), TH=(theta, *theta.stride()),
                W=(w, *w.stride()), OUT=(dxq, dxk, dqb, dkb, dth, dw), SIZE=(n, heads),
                CONST=kernels.RowConstants(REP=heads // hqk, ROUND=_TRITON_DTYPE[K.dtype],
                                           TH_T=theta.stride(1) == 1, DTHETA=need_theta,
                                           **dict(_blocks(a, p), BLOCK_T=BLOCK_T_BACK))),
           num_warps=WARPS[1])
    return dxq, dxk, dqb.sum((0, 1)), dkb.sum((0, 1)), dth, dw


@mamba3_rotate_backward.register_fake
def _(dq, dkey, down, q, key, K, K_bias, theta, w, need_theta=True):
    shape = (*q.shape[:2], K.shape[2], q.shape[3])
    acc = theta.dtype
    return (K.new_empty(shape), K.new_empty(shape), q.new_empty(q.shape[2:], dtype=acc),
            q.new_empty(q.shape[2:], dtype=acc),
            q.new_empty((*q.shape[:3], theta.shape[3]) if need_theta else (0,), dtype=acc),
            q.new_empty(q.shape[:3], dtype=acc))


rotate, rotate_backward = direct(mamba3_rotate), direct(mamba3_rotate_backward)


class _TurnedRows(torch.autograd.Function):
    @staticmethod
    def forward(ctx, Q, K, Q_bias, K_bias, theta, w):
        q, key, own = rotate(Q, K, Q_bias, K_bias, theta, w)
        ctx.save_for_backward(K, K_bias, theta, w, q, key)
        ctx.dtypes = (Q_bias.dtype, K_bias.dtype)
        return q, key, own

    @staticmethod
    def backward(ctx, dq, dkey, down):
        K, K_bias, theta, w, q, key = ctx.saved_tensors
        dq, dkey = (torch.zeros_like(q) if x is None else x for x in (dq, dkey))
        down = torch.zeros(q.shape[:3], dtype=q.dtype, device=q.device) if down is None else down
        dQ, dK, dqb, dkb, dtheta, dw = rotate_backward(dq, dkey, down, q, key, K, K_bias, theta,
                                                        w)
        grads = [dQ, dK, dqb.to(ctx.dtypes[0]), dkb.to(ctx.dtypes[1]), dtheta, dw]
        return tuple(g if need else None for g, need in zip(grads, ctx.needs_input_grad))


def turned_rows(Q: torch.Tensor, K: torch.Tensor, Q_bias: torch.Tensor, K_bias: torch.Tensor,
                theta: torch.Tensor, w: torch.Tensor, narrow: bool = False) -> tuple:
    """``(q̃, w·k̃, Σ_d q̃·k̃)`` of :func:`mamba3_rotate`, differentiable in every input, dθ taken
    at the rounded values (the module docstring); ``narrow`` (for calls that want no gradient):
    q̃ and w·k̃ in Q's dtype, not differentiable."""
    if narrow:
        return rotate(Q, K, Q_bias, K_bias, theta, w, True)
    return apply(_TurnedRows, Q, K, Q_bias, K_bias, theta, w)


@torch.library.custom_op("leetrepro::mamba3_gated_output", mutates_args=())
def mamba3_gated_output(o: torch.Tensor, v: torch.Tensor, z: torch.Tensor | None,
                        w: torch.Tensor) -> torch.Tensor:
    """``(o + w·v)·silu(z)`` (z None: ``o + w·v``) in v's dtype, contiguous: o, v, z ``(batch,
    seqlen, heads, headdim)`` (any strides), w float32 ``(batch, seqlen, heads)`` (any strides);
    products in float32 (float64 for float64 v). O(batch·seqlen·heads·headdim)."""
    if not _on_output_kernel(v):
        acc = torch.float64 if v.dtype == torch.float64 else torch.float32
        y = o.to(acc) + w.to(acc)[..., None] * v.to(acc)
        y = y if z is None else y * torch.nn.functional.silu(z.to(acc))
        return y.to(v.dtype).contiguous()
    batch, n, heads, d = v.shape
    y = torch.empty(batch, n, heads, d, dtype=v.dtype, device=v.device)
    launch(kernels.gated_output, (cdiv(n, BLOCK_T_OUT), batch * heads),
           dict(O=_rows(o), V=_rows(v), Z=_rows(z if z is not None else v), W=(w, *w.stride()),
                Y=y, SIZE=(n, heads, d), HAS_Z=z is not None, BLOCK_T=BLOCK_T_OUT,
                BLOCK_D=next_pow2(d)), num_warps=WARPS_OUT)
    return y


@mamba3_gated_output.register_fake
def _(o, v, z, w):
    return torch.empty_like(v, memory_format=torch.contiguous_format)


@torch.library.custom_op("leetrepro::mamba3_gated_output_backward", mutates_args=())
def mamba3_gated_output_backward(dy: torch.Tensor, o: torch.Tensor, v: torch.Tensor,
                                 z: torch.Tensor | None, w: torch.Tensor
                                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                            torch.Tensor]:
    """The gradients of :func:`mamba3_gated_output` ``(do, dv, dz, dw)``: do, dv, dz contiguous
    in o's, v's and z's dtypes (dz empty without z), dw float32 (float64 for float64 v)."""
    acc = torch.float64 if v.dtype == torch.float64 else torch.float32
    if not _on_output_kernel(v):
        dy = dy.to(acc)
        v_, w_ = v.to(acc), w.to(acc)[..., None]
        dz = v.new_empty(0)
        if z is not None:
            z_ = z.to(acc)
            sig = torch.sigmoid(z_)
            dz = (dy * (o.to(acc) + w_ * v_) * sig * (1 + z_ * (1 - sig))).to(z.dtype)
            dy = dy * z_ * sig
        return (dy.to(o.dtype).contiguous(), (w_ * dy).to(v.dtype).contiguous(),
                dz.contiguous(), (v_ * dy).sum(-1).contiguous())
    batch, n, heads, d = v.shape
    do = torch.empty(batch, n, heads, d, dtype=o.dtype, device=v.device)
    dv = torch.empty(batch, n, heads, d, dtype=v.dtype, device=v.device)
    dz = torch.empty(batch, n, heads, d, dtype=z.dtype, device=v.device) if z is not None \
        else v.new_empty(0)
    dw = torch.empty(batch, n, heads, dtype=acc, device=v.device)
    launch(kernels.gated_output_backward, (cdiv(n, BLOCK_T_OUT), batch * heads),
           dict(DY=_rows(dy), O=_rows(o), V=_rows(v), Z=_rows(z if z is not None else v),
                W=(w, *w.stride()), DO=do, DV=dv, DZ=dz if z is not None else dv, DW=dw,
                SIZE=(n, heads, d), HAS_Z=z is not None, BLOCK_T=BLOCK_T_OUT,
                BLOCK_D=next_pow2(d)), num_warps=WARPS_OUT)
    return do, dv, dz, dw


@mamba3_gated_output_backward.register_fake
def _(dy, o, v, z, w):
    dz = torch.empty_like(z, memory_format=torch.contiguous_format) if z is not None else \
        v.new_empty(0)
    return (torch.empty_like(o, memory_format=torch.contiguous_format),
            torch.empty_like(v, memory_format=torch.contiguous_format), dz,
            v.new_empty(v.shape[:3], dtype=torch.float64 if v.dtype == torch.float64 else
                        torch.float32))


_gated, _gated_backward = direct(mamba3_gated_output), direct(mamba3_gated_output_backward)


class _GatedOutput(torch.autograd.Function):
    @staticmethod
    def forward(ctx, o, v, z, w):
        ctx.save_for_backward(o, v, z, w)
        return _gated(o, v, z, w)

    @staticmethod
    def backward(ctx, dy):
        o, v, z, w = ctx.saved_tensors
        do, dv, dz, dw = _gated_backward(dy, o, v, z, w)
        grads = (do, dv, dz if z is not None else None, dw.to(w.dtype))
        return tuple(g if need else None for g, need in zip(grads, ctx.needs_input_grad))


def gated_output(o: torch.Tensor, v: torch.Tensor, z: torch.Tensor | None,
                 w: torch.Tensor) -> torch.Tensor:
    """``(o + w·v)·silu(z)`` of :func:`mamba3_gated_output`, differentiable in every input; one
    pass each way on a GPU."""
    return apply(_GatedOutput, o, v, z, w)


#: rows a step of the angles' programs (one program a (sequence, head) walks its rows), and
#: their warps (at 4 the backward spilled 60 bytes a thread at 32 angles in float64; sm_90)
BLOCK_T_ANGLES, WARPS_ANGLES = 64, 8


def _on_angle_kernel(Angles: torch.Tensor) -> bool:
    return on_row_kernels(Angles, kernels) and Angles.dtype in _TRITON_DTYPE and \
        Angles.numel() > 0


#: the fewest angles a program of the angles' kernels takes where fewer (batch rows × heads)
#: than SMs split the angles among more programs
ANGLE_MIN_BLOCK = 8


def _angle_block(lanes: int, a: int, device) -> int:
    """Angles a program: all of them, halved while the programs stay fewer than the SMs (each
    walks its rows one block after another, so at few batch rows × heads over long rows the
    programs, not the bytes, bound the time) down to :data:`ANGLE_MIN_BLOCK`."""
    block = next_pow2(a)
    while block > ANGLE_MIN_BLOCK and lanes * cdiv(a, block) < sm_count(device):
        block //= 2
    return block


def _angle_operands(Angles: torch.Tensor, DT: torch.Tensor, cu_seqlens) -> tuple:
    """``(grid, the angles' kernels' shared arguments)``; packed, each row's sequence (int64)."""
    batch, n, heads, a = Angles.shape
    seq = None if cu_seqlens is None else sequence_starts(n, cu_seqlens, Angles.device)[0]
    block = _angle_block(batch * heads, a, Angles.device)
    return (batch * heads, cdiv(a, block)), dict(
        ANG=(Angles, *Angles.stride()), DT=(DT, *DT.stride()), SEQ=seq, SIZE=(n, heads, a),
        VARLEN=cu_seqlens is not None, BLOCK_T=BLOCK_T_ANGLES, BLOCK_A=block)


@torch.library.custom_op("leetrepro::mamba3_angles", mutates_args=())
def mamba3_angles(Angles: torch.Tensor, DT: torch.Tensor, theta0: torch.Tensor | None,
                  cu_seqlens: torch.Tensor | None) -> torch.Tensor:
    """:func:`leetrepro.decay.trapezoid.running_angles` (float32, a view of contiguous
    ``(batch, heads, A, seqlen)``): Angles ``(batch, seqlen, heads, A)`` and DT ``(batch, heads,
    seqlen)`` fp16/bf16/fp32 (any strides), theta0 ``(sequences, heads, A)`` or None,
    ``cu_seqlens`` packed sequences' offsets or None; summed in float64 in one pass on a GPU.
    O(batch·seqlen·heads·A)."""
    batch, n, heads, a = Angles.shape
    out = torch.empty(batch, heads, a, n, dtype=torch.float32, device=Angles.device)
    if not _on_angle_kernel(Angles):
        out.copy_(running_angles(Angles, DT, theta0, cu_seqlens).permute(0, 2, 3, 1))
        return out.permute(0, 3, 1, 2)
    th0 = theta0.float().contiguous() if theta0 is not None else out
    grid, common = _angle_operands(Angles, DT, cu_seqlens)
    launch(kernels.angle_sums, grid,
           dict(TH0=th0, TH=out, HAS_TH0=theta0 is not None, **common), num_warps=WARPS_ANGLES)
    return out.permute(0, 3, 1, 2)


@mamba3_angles.register_fake
def _(Angles, DT, theta0, cu_seqlens):
    batch, n, heads, a = Angles.shape
    return Angles.new_empty(batch, heads, a, n, dtype=torch.float32).permute(0, 3, 1, 2)


@torch.library.custom_op("leetrepro::mamba3_angles_backward", mutates_args=())
def mamba3_angles_backward(dtheta: torch.Tensor, Angles: torch.Tensor, DT: torch.Tensor,
                           cu_seqlens: torch.Tensor | None, sequences: int
                           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The gradients of :func:`mamba3_angles` ``(dAngles, dDT, dtheta0)``: contiguous, in
    Angles', DT's dtype and float32 (``(sequences, heads, A)``, zeros for a sequence without
    rows); each row's suffix sum of dθ within its sequence taken in float64."""
    batch, n, heads, a = Angles.shape
    if not _on_angle_kernel(Angles):
        full = torch.nn.functional.pad(dtheta.to(torch.float64).flip(1).cumsum(1).flip(1),
                                       (0, 0, 0, 0, 0, 1))
        dth0 = dtheta.new_zeros(sequences, heads, a, dtype=torch.float32)
        if cu_seqlens is None:
            suffix = full[:, :n]
            if n:
                dth0 = suffix[:, 0].float()
        else:  # (a sequence's suffix sums: the whole's less what follows its last row)
            cu = cu_seqlens.to(device=Angles.device, dtype=torch.int64)
            seq = sequence_starts(n, cu_seqlens, Angles.device)[0]
            suffix = full[:, :n] - full[:, cu[seq + 1]]
            has = cu[1:] > cu[:-1]
            dth0[has] = suffix[0, cu[:-1][has]].float()
        th = torch.tanh(Angles.to(torch.float64))
        dt = DT.to(torch.float64).transpose(1, 2)[..., None]
        return ((suffix * math.pi * dt * (1 - th * th)).to(Angles.dtype).contiguous(),
                (suffix * math.pi * th).sum(-1).transpose(1, 2).to(DT.dtype).contiguous(),
                dth0.contiguous())
    grid, common = _angle_operands(Angles, DT, cu_seqlens)
    dang = torch.empty(batch, n, heads, a, dtype=Angles.dtype, device=Angles.device)
    # (each angle block's part of ddt, summed after where the angles are split)
    ddt = torch.empty(grid[1], batch, heads, n, dtype=DT.dtype if grid[1] == 1 else
                      torch.float32, device=DT.device)
    dth0 = torch.zeros(sequences, heads, a, dtype=torch.float32, device=Angles.device)
    launch(kernels.angle_sums_backward, grid,
           dict(DTH=(dtheta, *dtheta.stride()), DANG=dang, DDT=ddt, DTH0=dth0, **common),
           num_warps=WARPS_ANGLES)
    return dang, (ddt[0] if grid[1] == 1 else ddt.sum(0).to(DT.dtype)), dth0


@mamba3_angles_backward.register_fake
def _(dtheta, Angles, DT, cu_seqlens, sequences):
    batch, n, heads, a = Angles.shape
    return (torch.empty_like(Angles, memory_format=torch.contiguous_format),
            torch.empty_like(DT, memory_format=torch.contiguous_format),
            Angles.new_empty(sequences, heads, a, dtype=torch.float32))


_angles, _angles_backward = direct(mamba3_angles), direct(mamba3_angles_backward)


class _Angles(torch.autograd.Function):
    @staticmethod
    def forward(ctx, Angles, DT, theta0, cu_seqlens):
        ctx.save_for_backward(Angles, DT, cu_seqlens)
        ctx.theta0_dtype = None if theta0 is None else theta0.dtype
        ctx.sequences = Angles.shape[0] if cu_seqlens is None else cu_seqlens.numel() - 1
        return _angles(Angles, DT, theta0, cu_seqlens)

    @staticmethod
    def backward(ctx, dtheta):
        Angles, DT, cu_seqlens = ctx.saved_tensors
        dang, ddt, dth0 = _angles_backward(dtheta, Angles, DT, cu_seqlens, ctx.sequences)
        want = ctx.needs_input_grad
        return (dang if want[0] else None, ddt if want[1] else None,
                dth0.to(ctx.theta0_dtype) if want[2] else None, None)


def angle_sums(Angles: torch.Tensor, DT: torch.Tensor, theta0: torch.Tensor | None = None,
               cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`leetrepro.decay.trapezoid.running_angles`, one pass each way on a GPU (summed in
    float64 there too, packed sequences each from its own start); PyTorch's passes elsewhere."""
    if not _on_angle_kernel(Angles):
        return running_angles(Angles, DT, theta0, cu_seqlens)
    return apply(_Angles, Angles, DT, theta0, cu_seqlens)


def pair_sums_on_kernel(V: torch.Tensor, r: int, angles: int) -> bool:
    """Whether :func:`mamba3_pair_sums` runs for these rows: V ``(…)`` fp16/bf16/fp32 on the
    row kernels' terms (:func:`on_row_kernels`: a GPU, or the interpreter asked for by name)
    where Triton imported, the turned dims within the kernel's r (``2·angles ≤
    chunk.tables.STRADDLE_MAX_R``)."""
    from . import chunk
    return chunk.HAS_TRITON and on_row_kernels(V, chunk.gate_grads.straddle_kernels) and \
        V.dtype in _TRITON_DTYPE and 0 < 2 * angles <= min(r, chunk.tables.STRADDLE_MAX_R)


@torch.library.custom_op("leetrepro::mamba3_pair_sums", mutates_args=())
def mamba3_pair_sums(q: torch.Tensor, key: torch.Tensor, v: torch.Tensor, dO: torch.Tensor,
                     g: torch.Tensor, initial_state: torch.Tensor | None,
                     dS: torch.Tensor | None, SN: torch.Tensor | None,
                     cu_seqlens: torch.Tensor | None, angles: int, precision: str | None
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(dg, S)``: the gates' gradient float32 ``(batch, heads, N)`` and the sums of the
    angles' gradient from each row on, float32 ``(batch, heads, N, angles)``, of ⟨dO, O⟩ +
    ⟨dS, S_N⟩ for the operator O, S_N on the turned rows q, key ``(batch, heads, N, r)``,
    v, dO ``(batch, heads, N, d)`` with the gates g: both sums over the pairs of rows that
    straddle each row (:func:`leetrepro.methods.chunk.gate_gradient` with ``angles``), so
    neither adds up a rounding along the rows. The states (``initial_state``, S_N) are turned
    by no angle; SN: the forward's final state, where dS is given. ``precision``: fp32's
    products (16-bit inputs: its operands hold 16-bit values; None: the kernel's default). O(N·(r·d + 256·(r + d))) a
    (batch, head), about twice dg's alone."""
    from . import chunk
    return chunk.gate_gradient(q, key, v, dO, g, initial_state=initial_state, dS=dS,
                               final_state=SN, cu_seqlens=cu_seqlens, precision=precision,
                               angles=angles)


@mamba3_pair_sums.register_fake
def _(q, key, v, dO, g, initial_state, dS, SN, cu_seqlens, angles, precision):
    return g.new_empty(v.shape[:3], dtype=torch.float32), \
        g.new_empty(*v.shape[:3], angles, dtype=torch.float32)


pair_sums = direct(mamba3_pair_sums)


def suffix_differences(sums: torch.Tensor, cu_seqlens: torch.Tensor | None) -> torch.Tensor:
    """Per row t, S_t − S_(t+1) in float64 from suffix sums S ``(batch, seqlen, heads, A)``
    (S past each sequence's last row taken as 0): what a running sum from each sequence's last
    row turns back into S, exactly (S float32, its differences exact in float64)."""
    wide = sums.to(torch.float64)
    out = wide - torch.nn.functional.pad(wide[:, 1:], (0, 0, 0, 0, 0, 1))
    if cu_seqlens is not None and wide.shape[1]:
        # (row t is a sequence's last where t + 1 ends one; an empty first sequence's −1 is
        # sent to the last row, a last row anyway)
        last = cu_seqlens[1:].to(device=wide.device, dtype=torch.int64) - 1
        last = torch.where(last < 0, wide.shape[1] - 1, last)
        out[:, last] = wide[:, last]
    return out
