"""Generation: one decode step over a pool of recurrent states (:func:`decode_step`).

A serving engine keeps each running sequence's state ``(heads, r, d)`` in one preallocated pool
``(slots, heads, r, d)`` (fp32) and names a sequence by its slot. A step takes the new tokens of a
batch of sequences (usually one each), advances each sequence's state in its slot, in place, and
returns the outputs:

    S ← λ S + c_tᵀ v_t,   o_t = scale · b_t S          (the convention of :mod:`leetrepro._state`)

(with per-token gates ``g``, S ← λ e^(g_t) S + c_tᵀ v_t: the new tokens' own gates)

so prefilling N tokens (``causal_linear_decoder(..., output_final_state=True)``) and then k decode
steps from that state equals prefilling N + k. The memory traffic is the state, read and written
once per step (the tokens are a few hundred bytes): the floor is ``2 · batch·heads·r·d·4`` bytes.
On a GPU a Triton kernel (``kernels/decode_step.py``) with no host synchronisation: a step can be
captured in a CUDA graph (fixed shapes, slot ids on the device). Elsewhere PyTorch. Inference
only: no gradient.

Slots are checked without a host synchronisation where the step may be captured in a graph: a
slot outside the pool (negative, or past its last row) or a slot named twice in one step is a
ValueError naming it whenever the slot ids can be read for free (on the CPU) or when
``check_slots=True`` asks for it (one synchronisation); otherwise the GPU kernel checks them
itself: it never reads or writes outside the pool, and it poisons (NaN) the outputs of every
sequence whose slot is bad, and the pool row that two sequences named.
"""
from __future__ import annotations

import functools

import torch

from ._device import sm_count
from ._dtypes import FLOAT_DTYPES
from .decay.per_head import normalize_gamma
from .decay.per_token import check_gates
from .registry import GPU_DTYPES

try:
    from .kernels import decode_step as decode_kernels
except ImportError as err:  # without Triton: a clear error when the kernel is called
    from .methods._gpu import NoTriton
    decode_kernels = NoTriton(err)


def decode_step(B: torch.Tensor, C: torch.Tensor, V: torch.Tensor, gamma, state_pool: torch.Tensor,
                slots: torch.Tensor, *, scale: float = 1.0,
                check_slots: bool | None = None, g: torch.Tensor | None = None) -> torch.Tensor:
    """Advance ``state_pool[slots]`` by the new tokens and return their outputs.

    Args:
        B, C: ``(batch, heads, k, r)``; V: ``(batch, heads, k, d)``: k new tokens (usually 1) of
            each of ``batch`` sequences, one floating dtype: fp16, bf16, fp32 (the GPU kernel) or
            fp64 (PyTorch); last dim contiguous (flash-linear-attention's ``(batch, k, heads, r)``
            transposed is read in place). Integer tokens are refused.
        gamma: per-head decay in (0, 1] as in :func:`leetrepro.causal_linear_decoder`; None: 0-1.
        state_pool: ``(slots, heads, r, d)``, contiguous, float32 or float64 on any device (the
            state accumulates a whole sequence, so it is never kept in half precision; a float64
            pool runs the PyTorch path, for references); rows ``slots`` are read and overwritten
            in place.
        slots: ``(batch,)`` int32/int64 on the pool's device: sequence i's state is
            ``state_pool[slots[i]]``. Each in ``[0, slots)``, distinct within a step.
        scale: multiplies the outputs (flash-linear-attention's query scale).
        check_slots: read the slot ids on the host and raise a ValueError naming a slot outside
            the pool or named twice. None (default): where that costs no synchronisation (slots
            on the CPU) and on the PyTorch path; True: also on the GPU (one synchronisation, not
            allowed while a CUDA graph is captured); False: never on the host. Unchecked on the
            host, the GPU kernel checks on the device: a bad slot is never read or written, and
            the outputs of its sequences are NaN (a slot named twice: its pool row too).
        g: the new tokens' per-token log gates ``(batch, heads, k)`` (any float dtype, any
            strides), as :func:`leetrepro.causal_linear_decoder` takes them: each token decays
            the state by e^(g_t) (times λ with ``gamma``). None: no gates.

    Returns:
        O ``(batch, heads, k, d)`` in V's dtype.

    Cost: O(batch·heads·k·r·d) time; memory traffic 2·batch·heads·r·d·4 bytes (the states).
    """
    _check(B, C, V, state_pool, slots)
    if check_slots and _on_kernel(B, V, state_pool):  # the PyTorch path checks them in any case
        check_slot_values(slots, state_pool.shape[0])
    check_gates(g, B)
    lam = normalize_gamma(gamma, B.shape[1], B.device)
    if torch.compiler.is_compiling():
        return torch.ops.leetrepro.decode_step(B, C, V, lam, state_pool, slots, float(scale), g)
    # eager: the op's dispatch costs more host time than the step itself at batch 1 (NOTES.md)
    return _decode_step_impl(B, C, V, lam, state_pool, slots, float(scale), g)


def _check(B, C, V, pool, slots):
    for name, t in (("B", B), ("C", C), ("V", V), ("state_pool", pool), ("slots", slots)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if B.dim() != 4 or C.shape != B.shape or V.dim() != 4 or V.shape[:3] != B.shape[:3]:
        raise ValueError(f"B, C must be (batch, heads, k, r) and V (batch, heads, k, d), got "
                         f"B {tuple(B.shape)}, C {tuple(C.shape)}, V {tuple(V.shape)}")
    batch, heads, _, r = B.shape
    if pool.dim() != 4 or tuple(pool.shape[1:]) != (heads, r, V.shape[-1]):
        raise ValueError(f"state_pool must be (slots, heads, r, d) = (…, {heads}, {r}, "
                         f"{V.shape[-1]}), got {tuple(pool.shape)}")
    if pool.dtype not in POOL_DTYPES:
        raise ValueError(f"state_pool must be float32 or float64 (the state accumulates the whole "
                         f"sequence; it is never kept in half precision), got {pool.dtype}")
    if not pool.is_contiguous():
        raise ValueError("state_pool must be contiguous (its rows are updated in place)")
    if slots.shape != (batch,) or slots.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"slots must be an int32/int64 tensor of shape (batch,) = ({batch},), "
                         f"got {slots.dtype} {tuple(slots.shape)}")
    for name, t in (("B", B), ("C", C), ("V", V)):
        if t.dtype not in FLOAT_DTYPES:
            raise ValueError(f"{name} must be a floating tensor (float16, bfloat16, float32 or "
                             f"float64), got {t.dtype}: integer tokens would be truncated")
    if not B.dtype == C.dtype == V.dtype:
        raise TypeError(f"B, C and V must share one dtype, got {B.dtype}, {C.dtype}, {V.dtype}")
    devices = {t.device for t in (B, C, V, pool, slots)}
    if len(devices) != 1:
        raise ValueError(f"B, C, V, state_pool and slots must be on one device, got {devices}")


#: the pool's dtypes: the state accumulates a whole sequence (tokens take any of FLOAT_DTYPES)
POOL_DTYPES = frozenset({torch.float32, torch.float64})


def check_slot_values(slots: torch.Tensor, pool_slots: int) -> None:
    """A ValueError naming the first slot outside ``[0, pool_slots)`` or named twice. Reads the
    slot ids on the host: a synchronisation if they are on a GPU (refused during graph capture)."""
    if slots.is_cuda and torch.cuda.is_current_stream_capturing():
        raise ValueError("check_slots=True reads the slot ids on the host, which a CUDA graph "
                         "cannot capture: capture with check_slots=False (the kernel then checks "
                         "them on the device and poisons bad sequences' outputs with NaN)")
    seen: dict[int, int] = {}
    for i, s in enumerate(slots.tolist()):
        if not 0 <= s < pool_slots:
            raise ValueError(f"slots[{i}] = {s} is outside the state pool, whose slots are "
                             f"0 … {pool_slots - 1}")
        if s in seen:
            raise ValueError(f"slots[{seen[s]}] and slots[{i}] both name slot {s}: each sequence "
                             f"of a step needs its own slot (one of the two updates would be lost)")
        seen[s] = i


def _on_kernel(B, V, state_pool) -> bool:
    """Whether the step runs the Triton kernel (else PyTorch)."""
    return B.is_cuda and V.dtype in GPU_DTYPES and state_pool.dtype == torch.float32


def _decode_step_impl(B, C, V, gamma, state_pool, slots, scale, g=None):
    if _on_kernel(B, V, state_pool):
        return _triton_step(B, C, V, gamma, state_pool, slots, scale, g)
    # PyTorch indexing would wrap a negative slot and drop a repeated one's update: the slots are
    # checked here, whatever check_slots said (this path is not the one a graph captures)
    check_slot_values(slots, state_pool.shape[0])
    return _torch_step(B, C, V, gamma, state_pool, slots, scale, g)


@torch.library.custom_op("leetrepro::decode_step", mutates_args=("state_pool",))
def _decode_step(B: torch.Tensor, C: torch.Tensor, V: torch.Tensor, gamma: torch.Tensor | None,
                 state_pool: torch.Tensor, slots: torch.Tensor, scale: float,
                 g: torch.Tensor | None = None) -> torch.Tensor:
    return _decode_step_impl(B, C, V, gamma, state_pool, slots, scale, g)


@_decode_step.register_fake
def _(B, C, V, gamma, state_pool, slots, scale, g=None):
    return V.new_empty(V.shape)


def _torch_step(B, C, V, gamma, pool, slots, scale, g=None):
    """The same recurrence in PyTorch, in float64 (a step is small; the pool keeps its dtype)."""
    idx = slots.long()
    state = pool[idx].double()
    lam = None if gamma is None else gamma.double().view(1, -1, 1, 1)
    b, c, v = B.double(), C.double(), V.double()
    out = []
    for t in range(B.shape[2]):
        if lam is not None:
            state = state * lam
        if g is not None:
            state = state * torch.exp(g[:, :, t].double())[..., None, None]
        state = state + c[:, :, t, :, None] * v[:, :, t, None, :]
        out.append((b[:, :, t, None, :] @ state).squeeze(-2) * scale)
    pool[idx] = state.to(pool.dtype)
    o = torch.stack(out, 2) if out else V.new_zeros(V.shape, dtype=torch.float64)
    return o.to(V.dtype)


def _triton_step(B, C, V, gamma, pool, slots, scale, g=None):
    from .methods._gpu import launch, next_pow2, same_rows, strided

    batch, heads, k, r = B.shape
    d = V.shape[-1]
    B, C = same_rows(B, C)
    V, _ = same_rows(V, None)
    out = torch.empty(V.shape, dtype=V.dtype, device=V.device)
    if batch == 0 or heads == 0 or k == 0 or d == 0:
        return out.zero_()
    block_r, block_d, warps = _tiles(batch * heads, r, d, V.device)
    launch(decode_kernels.decode_step_kernel, (batch * heads, -(-d // block_d)),
           dict(B=strided(B), C=(C, *B.stride()[:3]), V=strided(V), O=strided(out), POOL=pool,
                SLOTS=slots, DECAY=(gamma, None if g is None else strided(g.float())),
                SIZE=(k, r, d, heads, batch, pool.shape[0]), SCALE=scale,
                HAS_DECAY=gamma is not None, HAS_GATE=g is not None, BLOCK_R=block_r,
                BLOCK_D=block_d,
                BLOCK_S=min(256, next_pow2(batch))), num_warps=warps)
    return out


@functools.lru_cache(maxsize=256)
def _tiles(lanes: int, r: int, d: int, device) -> tuple[int, int, int]:
    """(BLOCK_R, BLOCK_D, warps): the whole r per program; at 4 (sequence, head) lanes per SM or
    more, the whole state of a lane too (up to 128 × 128: 512-byte rows, the slot ids checked once
    per lane), 4 warps, measured fastest from 64 sequences × 32 heads up (NOTES.md); below, column
    blocks of 16 or 32, enough programs to fill the GPU."""
    from .methods._gpu import next_pow2

    block_r = next_pow2(r)
    if lanes >= 4 * sm_count(device):
        block_d = min(next_pow2(d), max(16, 16384 // block_r))
        return block_r, block_d, 4 if block_r * block_d <= 16384 else 8
    block_d = 16 if lanes * max(1, d // 32) < 2 * sm_count(device) else 32
    block_d = min(block_d, next_pow2(d))
    return block_r, block_d, 4 if block_r * block_d <= 4096 else 8
