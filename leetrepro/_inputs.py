"""Input checking shared by every entry point.

Conventions (the whole package follows them):

* ``B, C``: ``(batch, heads, N, r)``; ``V``: ``(batch, heads, N, d)``; one floating dtype, one device.
  B and C may hold *groups* instead, ``(batch, groups, N, r)`` with groups dividing heads: head h
  reads group ``h // (heads / groups)`` (Mamba-2's grouped B and C, grouped-query attention);
  methods with ``Method.groups`` read them in place, others get them expanded.
* The decay rules, ``gamma`` per head and ``g`` per token, are checked and normalised by their
  own modules (:mod:`leetrepro.decay`).
"""
from __future__ import annotations

import weakref

import torch

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
DTYPE_NAMES = {torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float32: "float32",
               torch.float64: "float64"}
#: the short names tables and CSV columns use (fp16, bf16, fp32, fp64)
SHORT_NAMES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32",
               torch.float64: "fp64"}


def parse_dtype(dtype) -> torch.dtype:
    """``"fp16"``, ``"float16"``, ``"half"``, ``torch.float16`` ... -> ``torch.float16``."""
    if isinstance(dtype, torch.dtype):
        if dtype not in FLOAT_DTYPES:
            raise ValueError(f"dtype {dtype} is not supported; use one of float16, bfloat16, "
                             f"float32, float64")
        return dtype
    aliases = {"fp16": torch.float16, "float16": torch.float16, "half": torch.float16,
               "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
               "fp32": torch.float32, "float32": torch.float32, "float": torch.float32,
               "fp64": torch.float64, "float64": torch.float64, "double": torch.float64}
    try:
        return aliases[str(dtype).lower()]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {sorted(aliases)}") from None


def check_4d(named) -> None:
    """Each ``(name, tensor, layout)`` of ``named`` a 4-D torch.Tensor, else a TypeError/ValueError
    naming the argument and the layout it should have."""
    for name, t, layout in named:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D {layout}, got shape {tuple(t.shape)}")


def check_qkv(B: torch.Tensor, C: torch.Tensor, V: torch.Tensor) -> None:
    """Raise a ValueError/TypeError naming the problem and the shapes."""
    check_4d((("B", B, "(batch, heads, N, r)"), ("C", C, "(batch, heads, N, r)"),
              ("V", V, "(batch, heads, N, d)")))
    shapes = f"B {tuple(B.shape)}, C {tuple(C.shape)}, V {tuple(V.shape)}"
    for axis, label in ((0, "batch"), (2, "N (sequence length)")):
        if not B.shape[axis] == C.shape[axis] == V.shape[axis]:
            raise ValueError(f"B, C and V disagree on {label} (dim {axis}): {shapes}")
    if B.shape[1] != C.shape[1] or (V.shape[1] != B.shape[1] and
                                    (B.shape[1] == 0 or V.shape[1] % B.shape[1])):
        raise ValueError(f"B, C and V disagree on heads (dim 1): B and C need V's heads, or both "
                         f"the same number of groups dividing them: {shapes}")
    if B.shape[3] != C.shape[3]:
        raise ValueError(f"B and C must have the same rank r (last dim): {shapes}")
    for name, t in (("B", B), ("C", C), ("V", V)):
        if t.dtype not in FLOAT_DTYPES:
            raise TypeError(f"{name} has dtype {t.dtype}; expected one of float16, bfloat16, "
                            f"float32, float64")
    if not B.dtype == C.dtype == V.dtype:
        raise TypeError(f"B, C and V must share one dtype, got B {B.dtype}, C {C.dtype}, V {V.dtype}")
    if not B.device == C.device == V.device:
        raise ValueError(f"B, C and V must be on one device, got B on {B.device}, C on {C.device}, "
                         f"V on {V.device}")


def memo_by_tensor(cache: dict, t: torch.Tensor, make):
    """``make(t)``, cached per tensor object and version (keyed by id, confirmed by a weak
    reference; at most 256 entries): what a model computes from the same decay tensor every layer.
    Not traceable (a tensor's version breaks a ``torch.compile`` graph): call it where the graph
    runs (inside a custom op), not where it is traced."""
    key = (id(t), t._version)
    hit = cache.get(key)
    if hit is not None and hit[0]() is t:
        return hit[1]
    value = make(t)
    if len(cache) >= 256:
        cache.clear()
    cache[key] = (weakref.ref(t), value)
    return value


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The accumulation dtype of the PyTorch methods: at least float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def check_cu_seqlens(cu_seqlens, B: torch.Tensor, host=None) -> int | None:
    """The number of sequences packed along N, after checking ``cu_seqlens`` (None: not packed).

    ``cu_seqlens``: 1-D int32/int64 offsets on B's device, ``cu[0] = 0``, non-decreasing,
    ``cu[-1] = N``; B's batch must be 1 (flash-linear-attention's convention). The values are
    checked on the host (one small device-to-host copy) unless ``torch.compile`` is tracing or
    ``host``, the same offsets as a CPU tensor (flash-linear-attention's ``cu_seqlens_cpu``), is
    given: its values are checked instead, with no synchronisation."""
    if cu_seqlens is None:
        if host is not None:
            raise ValueError("cu_seqlens_cpu is given without cu_seqlens (the offsets on the "
                             "inputs' device)")
        return None
    if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.dim() != 1 \
            or cu_seqlens.dtype not in (torch.int32, torch.int64) or cu_seqlens.numel() < 1:
        raise TypeError("cu_seqlens must be a 1-D int32 (or int64) tensor of offsets "
                        "[0, len_0, len_0 + len_1, ..., N]")
    if cu_seqlens.device != B.device:
        raise ValueError(f"cu_seqlens is on {cu_seqlens.device}, the inputs on {B.device}")
    if host is not None and (not isinstance(host, torch.Tensor) or host.device.type != "cpu"
                             or host.shape != cu_seqlens.shape or host.is_floating_point()):
        raise ValueError(f"cu_seqlens_cpu must be the offsets of cu_seqlens as an integer CPU "
                         f"tensor of shape {tuple(cu_seqlens.shape)}, got "
                         f"{getattr(host, 'device', type(host).__name__)} "
                         f"{tuple(getattr(host, 'shape', ()))}")
    if B.shape[0] != 1:
        raise ValueError(f"with cu_seqlens the sequences are packed along N of a batch of one; "
                         f"got batch {B.shape[0]}")
    if not torch.compiler.is_compiling():
        cu = (cu_seqlens if host is None else host).tolist()
        if cu[0] != 0 or cu[-1] != B.shape[2] or any(b < a for a, b in zip(cu, cu[1:])):
            raise ValueError(f"cu_seqlens must start at 0, never decrease and end at N = "
                             f"{B.shape[2]}; got {cu[:4]}{' ...' if len(cu) > 4 else ''} "
                             f"ending at {cu[-1]}")
    return cu_seqlens.numel() - 1


def positive_where_free(t: torch.Tensor) -> float | None:
    """The largest entry of ``t`` if it is positive and reading it costs no synchronisation (a
    CPU tensor, outside a compiled graph's tracing); else None (fine, or not read)."""
    if t.device.type != "cpu" or not t.numel() or torch.compiler.is_compiling():
        return None
    top = t.detach().max().item()
    return top if top > 0 else None


def lane_heads(*tensors) -> int:
    """The heads of a call whose tensors ``(batch, heads or groups, …)`` may hold groups (a head
    shared by heads/groups lanes): the most any has (None ignored)."""
    return max(t.shape[1] for t in tensors if t is not None)


def expand_groups(x: torch.Tensor | None, heads: int) -> torch.Tensor | None:
    """x ``(batch, groups, …)`` with a head each: group g repeated for heads g·k … g·k + k − 1
    (k = heads / groups), a copy; x itself where it has a head each (or is None)."""
    if x is None or x.shape[1] == heads:
        return x
    return x.repeat_interleave(heads // x.shape[1], 1)


def sum_groups(x: torch.Tensor, groups: int) -> torch.Tensor:
    """The adjoint of :func:`expand_groups`: x ``(batch, heads, …)`` summed over each group's
    heads to ``(batch, groups, …)``, accumulated in float32 (or float64 for float64) and
    returned in x's dtype; x itself where it has a head a group."""
    if x.shape[1] == groups:
        return x
    wide = torch.float64 if x.dtype == torch.float64 else torch.float32
    return x.unflatten(1, (groups, -1)).sum(2, dtype=wide).to(x.dtype)
