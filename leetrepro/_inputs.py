"""Input checking shared by every entry point.

Conventions (the whole package follows them):

* ``B, C``: ``(batch, heads, N, r)``; ``V``: ``(batch, heads, N, d)``; one floating dtype, one device.
  B and C may hold *groups* instead, ``(batch, groups, N, r)`` with groups dividing heads: head h
  reads group ``h // (heads / groups)`` (Mamba-2's grouped B and C, grouped-query attention);
  methods with ``Method.groups`` read them in place, others get them expanded.
* ``gamma``: the per-step decay factor λ of Eq. (4), one per head, in (0, 1]. Accepted as a Python
  float, or a tensor of shape ``()``, ``(1,)``, ``(H,)``, ``(1, 1)`` or ``(H, 1)`` (the paper's
  Listing 2 passes ``torch.full((heads, 1), 0.9)``). ``None`` means the plain 0-1 causal mask.
  Normalised here to a float64 tensor of shape ``(H,)`` on the inputs' device.
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


#: normalised decays already checked and copied to a device, so that a model calling the operator
#: every layer with the same gamma pays neither the host checks nor a blocking host-to-device copy
#: (which would serialise the CPU with the GPU). Keyed by value (host gamma) or by the tensor
#: itself and its version counter (device gamma, so an in-place change is seen).
_GAMMA_CACHE: dict = {}


def normalize_gamma(gamma, heads: int, device: torch.device) -> torch.Tensor | None:
    """Return ``gamma`` as a float64 tensor of shape ``(heads,)`` on ``device``, or None.

    Values are checked on the host the first time a gamma is seen (one small device-to-host copy
    when it lives on a GPU); the checked device copy is cached (``_GAMMA_CACHE``). While
    ``torch.compile`` traces, a tensor gamma is only reshaped (reading its values would break the
    graph): the operator checks the values when it runs (:func:`check_gamma_values`).
    """
    if gamma is None:
        return None
    if isinstance(gamma, (list, tuple)):  # one decay per head, as typed: float64, never rounded
        try:
            gamma = torch.tensor(gamma, dtype=torch.float64)
        except (TypeError, ValueError) as err:
            raise TypeError(f"gamma as a list must hold numbers, one per head ({err})") from None
    if isinstance(gamma, torch.Tensor) and gamma.requires_grad:
        raise ValueError("gamma requires grad, but the decays are fixed: no gradient is computed "
                         "for them; pass gamma.detach() (or a float)")
    if torch.compiler.is_compiling():
        if isinstance(gamma, torch.Tensor):
            return _shaped_gamma(gamma, heads).to(device=device, dtype=torch.float64)
        if isinstance(gamma, (int, float)) and not isinstance(gamma, bool):
            if not 0 < gamma <= 1:  # NaN fails this too
                raise ValueError(f"gamma must lie in (0, 1]; got {gamma}")
            return torch.full((heads,), float(gamma), dtype=torch.float64, device=device)
    # a tensor is looked up first as itself (id and version, confirmed by a weak reference: the
    # same tensor every layer), then a host one by its values
    ident = ("id", id(gamma), gamma._version, heads, device) \
        if isinstance(gamma, torch.Tensor) else None
    hit = _GAMMA_CACHE.get(ident) if ident is not None else None
    if hit is not None and hit[0]() is gamma:
        return hit[1]
    key = _gamma_key(gamma, heads, device)
    hit = _GAMMA_CACHE.get(key) if key is not None else None
    # a device gamma is keyed by id(): the entry holds a weak reference to be sure it is the same
    if hit is not None and (hit[0] is None or hit[0]() is gamma):
        g = hit[1]
    else:
        if isinstance(gamma, torch.Tensor) and gamma.is_cuda and \
                torch.cuda.is_current_stream_capturing():
            # a gamma computed in the captured code (a new tensor): a capture cannot read it back
            # to the host, and the warm-up calls every capture needs checked the same computation
            return _shaped_gamma(gamma.detach(), heads).to(device=device, dtype=torch.float64)
        g = _checked_gamma(gamma, heads, device)
        mark_checked(g)  # the op, which checks what it is given, need not read it again
    if len(_GAMMA_CACHE) >= 256:
        _GAMMA_CACHE.clear()
    if key is not None:
        _GAMMA_CACHE[key] = (weakref.ref(gamma) if key[0] == "device" else None, g)
    if ident is not None:
        _GAMMA_CACHE[ident] = (weakref.ref(gamma), g)
    return g


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


def _gamma_key(gamma, heads: int, device) -> tuple | None:
    dev = device if isinstance(device, torch.device) else torch.device(device)
    if isinstance(gamma, float) or (isinstance(gamma, int) and not isinstance(gamma, bool)):
        return ("value", float(gamma), heads, dev)
    if isinstance(gamma, torch.Tensor) and gamma.is_floating_point() and gamma.numel() <= 4096:
        if gamma.device.type == "cpu":
            return ("host", gamma.dtype, tuple(gamma.shape), gamma.contiguous().numpy().tobytes()
                    if gamma.dtype != torch.bfloat16 else gamma.float().numpy().tobytes(), heads, dev)
        return ("device", id(gamma), gamma._version, heads, dev)
    return None


def _shaped_gamma(g: torch.Tensor, heads: int) -> torch.Tensor:
    """A gamma tensor of shape (), (1,), (H,), (1, 1) or (H, 1) as ``(heads,)``; no value read."""
    if not g.is_floating_point():
        raise TypeError(f"gamma must be floating point, got dtype {g.dtype}")
    shape = tuple(g.shape)
    if g.dim() == 2 and g.shape[1] == 1:
        g = g[:, 0]
    if g.dim() > 1 or (g.dim() == 1 and g.shape[0] not in (1, heads)):
        raise ValueError(f"gamma of shape {shape} is not broadcastable to {heads} heads; use a float "
                         f"or shape ({heads},) or ({heads}, 1)")
    return g.reshape(-1).expand(heads)


#: significant digits a value of each dtype holds: an error shows 1.2, not float32's 1.2000000476837158
_DIGITS = {torch.float16: 4, torch.bfloat16: 3, torch.float32: 7}


def _check_values(g: torch.Tensor, dtype: torch.dtype | None = None) -> None:
    """Raise unless every decay of the float64 host tensor ``g`` lies in (0, 1]; ``dtype``: the
    caller's, whose digits the error shows (None: unknown; a value that is a float32 shows as one)."""
    if torch.isnan(g).any():
        raise ValueError("gamma contains NaN")
    bad = (g <= 0) | (g > 1)
    if bad.any():
        values = g[bad][:4]
        if dtype is None:
            dtype = torch.float32 if torch.equal(values.float().double(), values) else torch.float64
        digits = _DIGITS.get(dtype, 17)
        shown = [float(f"{v:.{digits}g}") for v in values.tolist()]
        raise ValueError(f"gamma must lie in (0, 1]; got {shown} "
                         f"(head(s) {bad.nonzero().flatten()[:4].tolist()})")


def _checked_gamma(gamma, heads: int, device) -> torch.Tensor:
    if isinstance(gamma, bool) or not isinstance(gamma, (int, float, torch.Tensor)):
        raise TypeError(f"gamma must be None, a float or a tensor, got {type(gamma).__name__}")
    if isinstance(gamma, torch.Tensor) and gamma.device.type == "meta":
        raise ValueError("gamma is on the meta device (it has no values to check); pass a float, "
                         "or a tensor on the CPU or on B's device")
    # a Python number stays float64 (torch.as_tensor would round 0.9 to float32 first)
    g = gamma.detach() if isinstance(gamma, torch.Tensor) else torch.tensor(float(gamma), dtype=torch.float64)
    g = _shaped_gamma(g, heads).to(device="cpu", dtype=torch.float64).contiguous()
    _check_values(g, gamma.dtype if isinstance(gamma, torch.Tensor) else torch.float64)
    return g.to(device)


_CHECKED: dict = {}


def check_gamma_values(g: torch.Tensor | None) -> None:
    """The operator's own check of a normalised gamma ``(H,)``, for calls whose values were not
    seen on the host (a compiled graph): cached per tensor and version, so one check per gamma."""
    if g is None:
        return
    key = (id(g), g._version)
    hit = _CHECKED.get(key)
    if hit is not None and hit() is g:
        return
    if g.is_cuda and torch.cuda.is_current_stream_capturing():
        # a capture cannot read values back to the host; the warm-up runs every capture needs
        # (cudagraph trees', ``torch.cuda.graph``'s) checked the same computation's values
        return
    _check_values(g.detach().to(device="cpu", dtype=torch.float64))
    mark_checked(g)


def mark_checked(g: torch.Tensor) -> None:
    """Record a normalised gamma ``(H,)`` as checked (its values known to lie in (0, 1]), so that
    the operator does not read it back to the host (:func:`check_gamma_values`)."""
    if len(_CHECKED) >= 256:
        _CHECKED.clear()
    _CHECKED[(id(g), g._version)] = weakref.ref(g)


def log_gamma(gamma: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """log λ per head as ``(H, 1, 1)`` in ``dtype`` (≤ 0; 0 exactly where λ = 1)."""
    if gamma is None:
        return None
    return torch.log(gamma.to(torch.float64)).to(dtype).view(-1, 1, 1)


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The accumulation dtype of the PyTorch methods: at least float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def alibi_gammas(heads: int) -> torch.Tensor:
    """Default per-head decays for benchmarks: λ_h = exp(-2^(-8(h+1)/H)), ALiBi-style slopes
    (Press et al., 2022), the convention of TransNormerLLM/lightning attention. For H = 32 they
    span 0.43 ... 0.996."""
    h = torch.arange(1, heads + 1, dtype=torch.float64)
    return torch.exp(-torch.pow(2.0, -8.0 * h / heads))


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


def check_gates(g, B: torch.Tensor) -> None:
    """Raise a TypeError/ValueError naming ``g`` unless it is None or the per-token log gates of
    B's rows: a floating tensor ``(batch, heads, N)`` on B's device, any strides (a time-major
    ``(batch, N, heads)`` tensor passed as ``g.transpose(1, 2)`` is read in place). Gate values
    are log decays, ≤ 0 in every model that uses them (``log a_t``, a_t in (0, 1]; −inf a hard
    reset). On the CPU they are read (no synchronisation to pay) and a positive gate, most often
    a decay passed without its log, is refused; on a GPU they are not read (a host
    synchronisation per call): a positive gate there is a growth computed as given, whose rows
    turn non-finite once the growth passes the dtype's range (e^(3·40) at g = +3 over 40 rows
    already overflows float32)."""
    if g is None:
        return
    if not isinstance(g, torch.Tensor):
        raise TypeError(f"g (the per-token log gates) must be a torch.Tensor, got "
                        f"{type(g).__name__}")
    want = tuple(B.shape[:3])
    if tuple(g.shape) != want:
        raise ValueError(f"g (the per-token log gates) must have shape (batch, heads, N) = "
                         f"{want}, got {tuple(g.shape)}"
                         + ("; it looks time-major (batch, N, heads): pass g.transpose(1, 2)"
                            if g.dim() == 3 and tuple(g.shape) == (want[0], want[2], want[1])
                            else ""))
    if not g.is_floating_point():
        raise TypeError(f"g (the per-token log gates) must be floating point, got {g.dtype}")
    if g.device != B.device:
        raise ValueError(f"g is on {g.device}, the inputs on {B.device}")
    top = positive_where_free(g)
    if top is not None:
        raise ValueError(f"g (the per-token log gates) must be ≤ 0 (log decays, log a_t with "
                         f"a_t in (0, 1]); its largest is {top:g}: pass torch.log(a) if these "
                         f"are the decays a_t themselves")


def positive_where_free(t: torch.Tensor) -> float | None:
    """The largest entry of ``t`` if it is positive and reading it costs no synchronisation (a
    CPU tensor, outside a compiled graph's tracing); else None (fine, or not read)."""
    if t.device.type != "cpu" or not t.numel() or torch.compiler.is_compiling():
        return None
    top = t.detach().max().item()
    return top if top > 0 else None


def gate_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype gates are computed in: float32 whatever the inputs' (float64 for float64)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


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
