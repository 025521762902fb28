"""The per-head decay λ (the paper's Eq. (4)): its checks, its normalised form, and the mask
M[i, j] = λ^(i-j) (i ≥ j) with the pieces of it the methods need.

``gamma`` is accepted as a Python float, a list of one per head, or a tensor of shape ``()``,
``(1,)``, ``(H,)``, ``(1, 1)`` or ``(H, 1)`` (the paper's Listing 2 passes
``torch.full((heads, 1), 0.9)``); ``None`` means the plain 0-1 causal mask. It is normalised to a
float64 tensor of shape ``(H,)`` on the inputs' device (:func:`normalize_gamma`).

Every mask helper takes ``lg = log λ`` of shape ``(H, 1, 1)`` (or None for the 0-1 mask) and only
ever evaluates λ^k with k ≥ 0, so nothing overflows however small λ is (λ^k underflows to 0, which
is its correct value in floating point).
"""
from __future__ import annotations

import weakref

import torch

from .._direct import outside_transforms, unwrapped


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
    if torch._C._functorch.peek_interpreter_stack() is not None:  # (torch.func.grad: the
        # decays take no gradient, so they are made outside it; a C call: no host time)
        with outside_transforms():
            return normalize_gamma(unwrapped(gamma), heads, device)
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


def check_gamma_values(gamma: torch.Tensor | None) -> None:
    """The operator's own check of a normalised gamma ``(H,)``, for calls whose values were not
    seen on the host (a compiled graph): cached per tensor and version, so one check per gamma."""
    if gamma is None:
        return
    key = (id(gamma), gamma._version)
    hit = _CHECKED.get(key)
    if hit is not None and hit() is gamma:
        return
    if gamma.is_cuda and torch.cuda.is_current_stream_capturing():
        # a capture cannot read values back to the host; the warm-up runs every capture needs
        # (cudagraph trees', ``torch.cuda.graph``'s) checked the same computation's values
        return
    _check_values(gamma.detach().to(device="cpu", dtype=torch.float64))
    mark_checked(gamma)


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


def alibi_gammas(heads: int) -> torch.Tensor:
    """Default per-head decays for benchmarks: λ_h = exp(-2^(-8(h+1)/H)), ALiBi-style slopes
    (Press et al., 2022), the convention of TransNormerLLM/lightning attention. For H = 32 they
    span 0.43 ... 0.996."""
    h = torch.arange(1, heads + 1, dtype=torch.float64)
    return torch.exp(-torch.pow(2.0, -8.0 * h / heads))


def causal_mask(n: int, lg: torch.Tensor | None, *, dtype: torch.dtype, device,
                m: int | None = None, row_offset: int = 0) -> torch.Tensor:
    """``(H or 1, n, m)`` mask of rows ``row_offset .. row_offset+n-1`` and columns ``0 .. m-1``:
    λ^(i-j) for i ≥ j, else 0 (square, offset 0, by default)."""
    m = n if m is None else m
    diff = (torch.arange(row_offset, row_offset + n, device=device)[:, None]
            - torch.arange(m, device=device)[None, :])
    lower = diff >= 0
    if lg is None:
        return lower.to(dtype).unsqueeze(0)
    w = torch.exp(diff.clamp_min(0).to(lg.dtype) * lg)  # (H, n, m), exponent ≤ 0
    return torch.where(lower, w, torch.zeros((), dtype=w.dtype, device=device)).to(dtype)


def powers(lg: torch.Tensor | None, n: int, *, start: int = 0, reverse: bool = False,
           dtype: torch.dtype, device) -> torch.Tensor | None:
    """``(H, n, 1)`` column λ^(start + k), k = 0..n-1 (k = n-1..0 with ``reverse``); None for 0-1."""
    if lg is None:
        return None
    k = torch.arange(n, device=device, dtype=lg.dtype)
    if reverse:
        k = k.flip(0)
    return torch.exp((k + start).view(1, n, 1) * lg).to(dtype)


def scale_rows(x: torch.Tensor, w: torch.Tensor | None) -> torch.Tensor:
    """x * w with x ``(batch, H, n, k)`` and w ``(H, n, 1)``; identity when w is None."""
    return x if w is None else x * w


def discounted_cumsum(x: torch.Tensor, lg: torch.Tensor | None, chunk: int = 64) -> torch.Tensor:
    """λ-cumsum of Appendix C.1 along dim -2: y_i = x_i + λ y_{i-1}, for x ``(batch, H, N, d)``.

    Evaluated in chunks of ``chunk`` rows (a small lower-triangular matrix product each), the chunk
    ends combined by the same operator with λ^chunk, recursively: O(N·chunk·d) work, log_chunk(N)
    levels, and no negative power of λ anywhere (the textbook λ^i·cumsum(λ^-i x) overflows).
    """
    if lg is None:
        return x.cumsum(-2)
    n = x.shape[-2]
    if n <= chunk:
        return causal_mask(n, lg, dtype=x.dtype, device=x.device) @ x
    pad = (-n) % chunk
    xp = torch.nn.functional.pad(x, (0, 0, 0, pad))
    *lead, total, d = xp.shape
    xr = xp.reshape(*lead, total // chunk, chunk, d)
    mask = causal_mask(chunk, lg, dtype=x.dtype, device=x.device).unsqueeze(1)  # (H, 1, L, L)
    y = mask @ xr
    ends = discounted_cumsum(y[..., -1, :], lg * chunk, chunk)  # inclusive scan of chunk ends
    carry = torch.nn.functional.pad(ends[..., :-1, :], (0, 0, 1, 0))  # the one before each chunk
    lead_in = powers(lg, chunk, start=1, dtype=x.dtype, device=x.device).unsqueeze(1)  # (H,1,L,1)
    y = y + lead_in * carry.unsqueeze(-2)
    return y.reshape(*lead, total, d)[..., :n, :]


def decayed_by(x: torch.Tensor, gamma: torch.Tensor | None, power: int) -> torch.Tensor:
    """x · λ^power per head (x ``(batch, heads, …)``), in x's dtype."""
    if gamma is None:
        return x
    return (x.to(torch.float64) * gamma.view(1, -1, 1, 1) ** power).to(x.dtype)
