"""The Mamba-2 block's short causal depthwise convolution and its SiLU on time-major rows:
``silu(conv1d(x, w, bias))`` causal (``K − 1`` zeros before each sequence), x ``(batch, N, C)``
at any row stride (its channels contiguous: the in-projection's slice read in place), the output
``(batch, N, C)`` contiguous in x's dtype. One pass each way on a GPU
(``kernels/causal_conv.py``; :data:`ON_GPU`), where PyTorch ran
its depthwise convolution channel-major (x transposed), then the SiLU and a copy back to
time-major, and three kernels back: 4.5 ms of the Codestral block's 35.6 in the convolution
alone (H200, notes/gates.md). PyTorch's
``conv1d`` on a CPU (or with ``LEETREPRO_ROWS_KERNEL=1`` beside ``TRITON_INTERPRET=1`` the
kernels interpreted: the tests). Custom ops (``torch.library``) with their fakes and autograd.
"""
from __future__ import annotations

import torch

from .._direct import direct
from ..methods._gpu import NoTriton, cdiv, launch, next_pow2, on_row_kernels, rows_contiguous

try:
    from ..kernels import causal_conv as conv_kernels
except ImportError as err:  # without Triton: PyTorch's convolution
    conv_kernels = NoTriton(err)

#: (rows, channels, warps) of a program's tile, forward and backward: the fastest of the tiles
#: timed (H200, bf16, the 125M LM's and Codestral's blocks, notes/gates.md), none spilling
#: compiled for sm_90 (``probes.regs --passes``); a forward tile writes all but its first K − 1
#: rows, a backward tile all but its first and last K − 1. The backward's programs take tiles in
#: steps so that at most about ``PROGRAMS`` programs share the rows (their per-program sums of w's
#: gradient, ``(K + 1)·programs·BLOCK_C`` floats, stay bounded)
FORWARD, BACKWARD, PROGRAMS = (32, 64, 2), (128, 32, 8), 65536


#: whether the convolution's kernels run on a GPU (``tests/test_mamba.py``'s GPU test checks them
#: there against float64; with the gated norm's they took the Codestral block from 54.3 to 23.9 ms,
#: H200, bf16, graph, notes/gates.md); False: PyTorch's expressions
ON_GPU = True


def _kernel(x: torch.Tensor, width: int = 4) -> bool:
    """Whether the kernels take x and a convolution ``width`` wide (a tile must hold its own rows
    besides the K − 1 it reads before them, and in the backward K − 1 after: wider, PyTorch's)."""
    return on_row_kernels(x, conv_kernels) and x.numel() > 0 and \
        x.stride(-1) == 1 and x.dtype in (torch.float16, torch.bfloat16, torch.float32) and \
        (ON_GPU or not x.is_cuda) and width - 1 < FORWARD[0] // 2 and \
        2 * (width - 1) < BACKWARD[0] // 2


def _pre(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """PyTorch's causal depthwise convolution ``(batch, C, N)`` of x ``(batch, N, C)``."""
    k = w.shape[-1]
    return torch.nn.functional.conv1d(x.transpose(1, 2), w, bias, padding=k - 1,
                                      groups=x.shape[-1])[..., :x.shape[1]]


def _same_sequence(seq_idx: torch.Tensor, shift: int) -> torch.Tensor:
    """``(batch, N, 1)``: whether row t − shift is of row t's sequence (False before row 0)."""
    n = seq_idx.shape[1]
    same = torch.zeros_like(seq_idx, dtype=torch.bool)
    same[:, shift:] = seq_idx[:, shift:] == seq_idx[:, :n - shift]
    return same[..., None]


def _earlier(t: torch.Tensor, shift: int) -> torch.Tensor:
    """Row t − shift of t ``(batch, N, C)`` at row t (zeros before the first)."""
    return torch.nn.functional.pad(t, (0, 0, shift, 0))[:, :t.shape[1]]


def causal_conv_by_taps(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                        seq_idx: torch.Tensor | None) -> torch.Tensor:
    """The causal depthwise convolution ``(batch, N, C)`` of x ``(batch, N, C)`` by weight ``(C,
    1, K)`` in PyTorch, tap by tap, each row reading only rows of its own sequence (``seq_idx``
    ``(batch, N)``, or one sequence a row of the batch); in x's dtype."""
    k = weight.shape[-1]
    out = 0 if bias is None else bias.to(x.dtype)
    for i in range(k):
        shift = k - 1 - i
        tap = _earlier(x, shift) * weight[:, 0, i].to(x.dtype)
        out = out + (tap * _same_sequence(seq_idx, shift) if seq_idx is not None and shift
                     else tap)
    return out


def _by_taps_backward(dout, x, weight, bias, seq_idx) -> tuple:
    """``(dx, dw, db)`` of ``silu(causal_conv_by_taps(…))`` in float32, written out (a custom
    op's backward runs below autograd)."""
    k, n = weight.shape[-1], x.shape[1]
    xf, wf = x.float(), weight.float()
    pre = causal_conv_by_taps(xf, wf, None if bias is None else bias.float(), seq_idx)
    sig = torch.sigmoid(pre)
    dpre = dout.float() * sig * (1 + pre * (1 - sig))
    dx, dw = torch.zeros_like(xf), []
    for i in range(k):
        shift = k - 1 - i
        reach = dpre * _same_sequence(seq_idx, shift) if shift else dpre
        dw.append((reach * _earlier(xf, shift)).sum((0, 1)))
        # (dpre at row t + shift reaches dx at row t)
        dx = dx + torch.nn.functional.pad(reach, (0, 0, 0, shift))[:, shift:shift + n] * wf[:, 0, i]
    db = dpre.sum((0, 1))
    return (dx.to(x.dtype).contiguous(), torch.stack(dw, -1)[:, None].to(weight.dtype),
            db.to(bias.dtype) if bias is not None else x.new_empty(0))


def _empty_seq(x: torch.Tensor) -> torch.Tensor:
    return x.new_empty(0, dtype=torch.int32)


@torch.library.custom_op("leetrepro::causal_conv_silu", mutates_args=())
def causal_conv_silu_fwd(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                         seq_idx: torch.Tensor | None = None) -> torch.Tensor:
    """``silu(causal depthwise conv(x))``: x ``(batch, N, C)``, weight ``(C, 1, K)`` (a depthwise
    ``nn.Conv1d``'s), bias ``(C,)`` or None, seq_idx int32 ``(batch, N)`` or None (packed
    sequences); ``(batch, N, C)`` contiguous in x's dtype."""
    if not _kernel(x, weight.shape[-1]):
        if seq_idx is not None:
            return torch.nn.functional.silu(causal_conv_by_taps(x, weight, bias, seq_idx)) \
                .contiguous()
        return torch.nn.functional.silu(_pre(x, weight, bias)).transpose(1, 2).contiguous()
    batch, n, c = x.shape
    k = weight.shape[-1]
    block_t, block_c, warps = FORWARD
    rows = block_t - k + 1
    out = torch.empty(batch, n, c, dtype=x.dtype, device=x.device)
    launch(conv_kernels.causal_conv_forward, (batch, cdiv(n, rows), cdiv(c, block_c)),
           dict(X=(x, x.stride(0), x.stride(1)), W=weight.reshape(c, k).contiguous(), BIAS=bias,
                SEQ=_empty_seq(x) if seq_idx is None else seq_idx, OUT=out, SIZE=(n, c), K=k,
                BLOCK_T=block_t, BLOCK_C=block_c, HAS_BIAS=bias is not None,
                HAS_SEQ=seq_idx is not None),
           # (the sequence masks spilled 108 bytes a thread on two warps, none on four)
           num_warps=warps if seq_idx is None else 2 * warps)
    return out


@causal_conv_silu_fwd.register_fake
def _(x, weight, bias, seq_idx=None):
    return x.new_empty(x.shape)


@torch.library.custom_op("leetrepro::causal_conv_silu_backward", mutates_args=())
def causal_conv_silu_bwd(dout: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                         bias: torch.Tensor | None, seq_idx: torch.Tensor | None = None
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(dx, dweight, dbias)`` (dbias empty without a bias): dx ``(batch, N, C)`` contiguous in
    x's dtype, the others in their parameters' dtypes, summed in float32 per program then over
    programs in a fixed order."""
    batch, n, c = x.shape
    k = weight.shape[-1]
    if not _kernel(x, k):
        if seq_idx is not None:
            return _by_taps_backward(dout, x, weight, bias, seq_idx)
        wide, w32 = x.float().transpose(1, 2), weight.float()
        pre = _pre(x.float(), w32, None if bias is None else bias.float())
        sig = torch.sigmoid(pre)
        dpre = dout.float().transpose(1, 2) * sig * (1 + pre * (1 - sig))  # (batch, C, N)
        # (the convolution's own backward, over its padded output: one call for dx, dw and db)
        dx, dw, db = torch.ops.aten.convolution_backward(
            torch.nn.functional.pad(dpre, (0, k - 1)), wide, w32, [c], [1], [k - 1], [1], False,
            [0], c, [True, True, bias is not None])
        return (dx.transpose(1, 2).to(x.dtype).contiguous(), dw.to(weight.dtype),
                db.to(bias.dtype) if bias is not None else x.new_empty(0))
    block_t, block_c, warps = BACKWARD
    blocks = cdiv(n, block_t - 2 * (k - 1))
    steps = max(1, cdiv(batch * blocks * cdiv(c, block_c), PROGRAMS))
    groups = cdiv(blocks, steps)
    dx = torch.empty(batch, n, c, dtype=x.dtype, device=x.device)
    parts = torch.empty(k + 1, batch * groups, c, dtype=torch.float32, device=x.device)
    launch(conv_kernels.causal_conv_backward, (batch, groups, cdiv(c, block_c)),
           dict(X=(x, x.stride(0), x.stride(1)), W=weight.reshape(c, k).contiguous(), BIAS=bias,
                SEQ=_empty_seq(x) if seq_idx is None else seq_idx,
                DOUT=(dout, dout.stride(0), dout.stride(1)), DX=dx, PARTS=parts,
                SIZE=(n, c, steps), K=k, K_PAD=next_pow2(k), BLOCK_T=block_t, BLOCK_C=block_c,
                HAS_BIAS=bias is not None, HAS_SEQ=seq_idx is not None), num_warps=warps)
    sums = parts.sum(1)  # (K + 1, C)
    # (copies: outputs of a custom op may not alias one another)
    dw = sums[:k].t().contiguous().to(weight.dtype).reshape(c, 1, k)
    db = sums[k].to(bias.dtype, copy=True) if bias is not None else x.new_empty(0)
    return dx, dw, db


@causal_conv_silu_bwd.register_fake
def _(dout, x, weight, bias, seq_idx=None):
    return (x.new_empty(x.shape), torch.empty_like(weight),
            torch.empty_like(bias) if bias is not None else x.new_empty(0))


def _setup(ctx, inputs, output):
    x, weight, bias, seq_idx = inputs
    ctx.save_for_backward(x, weight, bias, seq_idx)


def _backward(ctx, dout):
    x, weight, bias, seq_idx = ctx.saved_tensors
    dx, dw, db = _causal_conv_silu_bwd(rows_contiguous(dout), x, weight, bias, seq_idx)
    need_x, need_w, need_b = ctx.needs_input_grad[:3]
    return dx if need_x else None, dw if need_w else None, \
        db if need_b and bias is not None else None, None


causal_conv_silu_fwd.register_autograd(_backward, setup_context=_setup)
# (eager calls skip the dispatcher: leetrepro._direct)
_causal_conv_silu_fwd, _causal_conv_silu_bwd = direct(causal_conv_silu_fwd), direct(causal_conv_silu_bwd)


def causal_conv_silu(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                     seq_idx: torch.Tensor | None = None) -> torch.Tensor:
    """``silu`` of x's causal depthwise convolution by a depthwise ``nn.Conv1d``'s ``weight``
    ``(C, 1, K)`` and ``bias``: x ``(batch, N, C)`` (channels contiguous, any other strides) →
    ``(batch, N, C)`` contiguous in x's dtype, row t from rows t − K + 1 … t of its own
    sequence: a batch row's, or with ``seq_idx`` (integer ``(batch, N)``, packed sequences)
    those of row t's number. Differentiable in x, weight and bias. O(batch·N·C·K)."""
    x = rows_contiguous(x)
    if seq_idx is not None:
        seq_idx = seq_idx.to(device=x.device, dtype=torch.int32).contiguous()
    return _causal_conv_silu_fwd(x, weight, bias, seq_idx)


def _update_by_taps(x, conv_state, weight, bias, silu):
    """PyTorch's expressions of :func:`causal_conv_update` (a CPU, or where the kernel does not
    take the tensors), in float32 (float64 where x or the state is)."""
    n = x.shape[-1]
    acc = torch.promote_types(torch.promote_types(x.dtype, conv_state.dtype), torch.float32)
    window = torch.cat([conv_state, x.to(conv_state.dtype)], -1)
    conv_state.copy_(window[..., -conv_state.shape[-1]:])
    taps = window.unfold(-1, weight.shape[-1], 1)[..., -n:, :].to(acc)  # (batch, C, L, K)
    out = (taps * weight.to(acc)[:, None, :]).sum(-1)
    if bias is not None:
        out = out + bias.to(acc)[:, None]
    return (torch.nn.functional.silu(out) if silu else out).to(x.dtype)


def _update_kernel(x: torch.Tensor, conv_state: torch.Tensor) -> bool:
    """Whether :func:`causal_conv_update`'s kernel takes these tensors (a window of at most 16)."""
    floats = (torch.float16, torch.bfloat16, torch.float32)
    return on_row_kernels(x, conv_kernels) and x.numel() > 0 and (ON_GPU or not x.is_cuda) and \
        x.dtype in floats and conv_state.dtype in floats and conv_state.shape[-1] <= 16


@torch.library.custom_op("leetrepro::causal_conv_update", mutates_args=("conv_state",))
def causal_conv_update_op(x: torch.Tensor, conv_state: torch.Tensor, weight: torch.Tensor,
                          bias: torch.Tensor | None, silu: bool) -> torch.Tensor:
    """:func:`causal_conv_update` with weight ``(C, K)``."""
    batch, c, n = x.shape
    k = weight.shape[-1]
    if not _update_kernel(x, conv_state):
        return _update_by_taps(x, conv_state, weight, bias, silu)
    out = torch.empty(batch, c, n, dtype=x.dtype, device=x.device)
    block_c = min(256, next_pow2(c))
    launch(conv_kernels.causal_conv_update, (batch, cdiv(c, block_c)),
           dict(X=x, STATE=conv_state, W=weight.contiguous(), BIAS=bias, OUT=out,
                SIZE=(c, k, n), XS=tuple(x.stride()), SS=tuple(conv_state.stride()),
                OS=tuple(out.stride()), BLOCK_C=block_c, BLOCK_W=next_pow2(k),
                HAS_BIAS=bias is not None, SILU=bool(silu)),
           num_warps=4)
    return out


@causal_conv_update_op.register_fake
def _(x, conv_state, weight, bias, silu):
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


_causal_conv_update = direct(causal_conv_update_op)


def causal_conv_update(x: torch.Tensor, conv_state: torch.Tensor, weight: torch.Tensor,
                       bias: torch.Tensor | None = None, silu: bool = True) -> torch.Tensor:
    """One decode step of the causal depthwise convolution (``causal_conv1d_update``'s
    semantics): x ``(batch, C, L)`` the L new inputs of each channel (any strides), shifted into
    ``conv_state`` ``(batch, C, K)``, the last K inputs, in place; returns ``(batch, C, L)`` in x's
    dtype, ``act(bias + Σ_k w[·, k] · new[t + 1 + k])`` over ``new = [conv_state, x]`` (``silu``:
    the SiLU), products and sums in float32. weight ``(C, K)`` or a depthwise ``nn.Conv1d``'s
    ``(C, 1, K)``. One launch on a GPU (``kernels/causal_conv.py``), where PyTorch's expressions
    take six to nine. O(batch·C·(K + L)·L)."""
    weight = weight.reshape(weight.shape[0], weight.shape[-1])
    if x.dim() != 3 or conv_state.dim() != 3 or conv_state.shape[:2] != x.shape[:2] or \
            conv_state.shape[-1] != weight.shape[-1] or weight.shape[0] != x.shape[1]:
        raise ValueError(f"causal_conv_update: x (batch, C, L) {tuple(x.shape)}, conv_state "
                         f"(batch, C, K) {tuple(conv_state.shape)} and weight (C, K) "
                         f"{tuple(weight.shape)} do not agree")
    return _causal_conv_update(x, conv_state, weight, bias, bool(silu))
