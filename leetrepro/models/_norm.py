"""The gated RMS norm of a Mamba-2 block's output: ``(y·silu(z)) · rstd · w``, ``rstd =
1/√(mean((y·silu(z))²) + eps)`` over each group of ``group_size`` channels of the last dimension
(mamba_ssm's ``RMSNormGated(group_size=d_inner // ngroups)``; the whole dimension by default),
forward and backward in one pass each on
a GPU (``kernels/gated_norm.py``; :data:`ON_GPU`), where
PyTorch's expressions made about eight passes forward and fifteen back on generic (not
vectorised) kernels over the block's widest tensors (z a strided slice of the in-projection):
8.3 ms of the Codestral block's 35.6 went to such kernels (H200, notes/gates.md). PyTorch's
expressions on a CPU (in float32), or with ``LEETREPRO_ROWS_KERNEL=1`` beside
``TRITON_INTERPRET=1`` the kernels interpreted (the tests).

Shapes: y, z ``(…, D)`` (z may be strided: its last dimension contiguous), w ``(D,)``; the output
in y's dtype, shaped like y; the saved rstd float32 ``(…, D / group_size)``. Gradients for y,
z and w; custom ops (``torch.library``) with their fakes, so ``torch.compile`` traces them.
"""
from __future__ import annotations

import torch

from .._direct import direct
from ..methods._gpu import NoTriton, cdiv, launch, next_pow2, on_row_kernels, rows_contiguous

try:
    from ..kernels import gated_norm as norm_kernels
except ImportError as err:  # without Triton: PyTorch's expressions
    norm_kernels = NoTriton(err)


def _rows(t: torch.Tensor) -> torch.Tensor:
    """t as ``(rows, D)`` with its last dimension contiguous (a view where strides allow)."""
    return rows_contiguous(t).reshape(-1, t.shape[-1])


#: about as many programs as this (several waves of a GPU's SMs) each take their share of the rows
PROGRAMS = 1024


def _programs(rows: int) -> tuple[int, int]:
    """``(programs, rows a program)``: about :data:`PROGRAMS` programs, so that the backward's
    per-program sums of w's gradient stay small; a function of the row count alone, so the same
    inputs give the same sums."""
    per = max(1, cdiv(rows, PROGRAMS))
    return cdiv(rows, per), per


#: whether the gated norm's kernels run on a GPU (``tests/test_mamba.py``'s GPU test checks them
#: there against float64; with the convolution's they took the Codestral block from 54.3 to
#: 23.9 ms, H200, bf16, graph, notes/gates.md); False: PyTorch's expressions
ON_GPU = True


def _kernel(y: torch.Tensor) -> bool:
    return on_row_kernels(y, norm_kernels) and y.numel() > 0 and \
        (ON_GPU or not y.is_cuda)


@torch.library.custom_op("leetrepro::gated_rms_norm", mutates_args=())
def gated_rms_norm_fwd(y: torch.Tensor, z: torch.Tensor, w: torch.Tensor, eps: float,
                       groups: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """``(out, rstd)``: out like y (dense, y's dtype), rstd float32 ``(…, groups)``."""
    gs = y.shape[-1] // groups
    if not _kernel(y):
        g = (y.float() * torch.nn.functional.silu(z.float())).unflatten(-1, (groups, gs))
        rstd = torch.rsqrt(g.pow(2).mean(-1) + eps)
        return (g * rstd[..., None]).flatten(-2).mul(w.float()).to(y.dtype), rstd
    y2, z2 = _rows(y), _rows(z)
    rows, d = y2.shape
    out = torch.empty(rows, d, dtype=y.dtype, device=y.device)
    rstd = torch.empty(rows, groups, dtype=torch.float32, device=y.device)
    programs, per = _programs(rows)
    launch(norm_kernels.gated_norm_forward, (programs, groups),
           dict(Y=(y2, y2.stride(0)), Z=(z2, z2.stride(0)), W=w.contiguous(), OUT=out, RSTD=rstd,
                SIZE=(rows, groups, gs), eps=float(eps), BLOCK_G=next_pow2(gs), ROWS=per),
           num_warps=_warps(gs))
    return out.view(y.shape), rstd.view(*y.shape[:-1], groups)


@gated_rms_norm_fwd.register_fake
def _(y, z, w, eps, groups=1):
    return torch.empty_like(y, memory_format=torch.contiguous_format), \
        y.new_empty(*y.shape[:-1], groups, dtype=torch.float32)


def _warps(gs: int) -> int:
    """Warps of a program taking a group of gs channels: compiled for sm_90, neither pass spills
    on these, 1024 to 8192 channels (``probes.regs``)."""
    width = next_pow2(gs)
    return 4 if width <= 1024 else 8 if width <= 4096 else 32


@torch.library.custom_op("leetrepro::gated_rms_norm_backward", mutates_args=())
def gated_rms_norm_bwd(dout: torch.Tensor, y: torch.Tensor, z: torch.Tensor, w: torch.Tensor,
                       rstd: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(dy, dz, dw)``: dy like y, dz like z (dense, in their dtypes), dw like w (the sums
    over rows per program, then over programs, in float32, in a fixed order)."""
    groups = rstd.shape[-1]
    gs = y.shape[-1] // groups
    if not _kernel(y):
        yf, zf, df, wf = (t.float().unflatten(-1, (groups, gs)) for t in (y, z, dout, w))
        sig = torch.sigmoid(zf)
        s = zf * sig
        n = yf * s * rstd[..., None]
        dn = df * wf
        dg = rstd[..., None] * (dn - n * (dn * n).mean(-1, keepdim=True))
        dz = dg * yf * sig * (1 + zf * (1 - sig))
        dw = (df * n).reshape(-1, w.shape[0]).sum(0)
        return (dg * s).flatten(-2).to(y.dtype), dz.flatten(-2).to(z.dtype), dw.to(w.dtype)
    y2, z2, d2 = _rows(y), _rows(z), _rows(dout)
    rows, d = y2.shape
    programs, per = _programs(rows)
    dy = torch.empty(rows, d, dtype=y.dtype, device=y.device)
    dz = torch.empty(rows, d, dtype=z.dtype, device=y.device)
    dw = torch.empty(programs, d, dtype=torch.float32, device=y.device)
    launch(norm_kernels.gated_norm_backward, (programs, groups),
           dict(DOUT=(d2, d2.stride(0)), Y=(y2, y2.stride(0)), Z=(z2, z2.stride(0)), W=w.contiguous(),
                RSTD=rstd.reshape(-1, groups).contiguous(), DY=dy, DZ=dz, DW=dw,
                SIZE=(rows, groups, gs), BLOCK_G=next_pow2(gs), ROWS=per),
           num_warps=_warps(gs))
    return dy.view(y.shape), dz.view(z.shape), dw.sum(0).to(w.dtype)


@gated_rms_norm_bwd.register_fake
def _(dout, y, z, w, rstd):
    return (torch.empty_like(y, memory_format=torch.contiguous_format),
            torch.empty_like(z, memory_format=torch.contiguous_format), torch.empty_like(w))


def _setup(ctx, inputs, output):
    y, z, w = inputs[:3]
    ctx.save_for_backward(y, z, w, output[1])


def _backward(ctx, dout, _drstd):
    y, z, w, rstd = ctx.saved_tensors
    dy, dz, dw = _gated_rms_norm_bwd(dout, y, z, w, rstd)
    need_y, need_z, need_w = ctx.needs_input_grad[:3]
    return dy if need_y else None, dz if need_z else None, dw if need_w else None, None, None


gated_rms_norm_fwd.register_autograd(_backward, setup_context=_setup)
# (eager calls skip the dispatcher: leetrepro._direct)
_gated_rms_norm_fwd, _gated_rms_norm_bwd = direct(gated_rms_norm_fwd), direct(gated_rms_norm_bwd)


def gated_rms_norm(y: torch.Tensor, z: torch.Tensor, w: torch.Tensor, eps: float = 1e-5,
                   group_size: int | None = None) -> torch.Tensor:
    """``(y·silu(z)) · w / √(mean((y·silu(z))²) + eps)``, the mean over each group of
    ``group_size`` channels of the last dimension D (all D by default): y, z ``(…, D)`` (z's last
    dimension contiguous, any other strides), w ``(D,)``; y's dtype and shape, float32 inside.
    Differentiable in y, z and w. O(rows·D)."""
    d = y.shape[-1]
    group_size = d if group_size is None else int(group_size)
    if group_size <= 0 or d % group_size:
        raise ValueError(f"group_size {group_size} must divide the last dimension {d}")
    return _gated_rms_norm_fwd(y, z, w, float(eps), d // group_size)[0]
