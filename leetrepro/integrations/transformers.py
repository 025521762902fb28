"""Hugging Face ``transformers``' Mamba-2 family on this project's kernels.

    import leetrepro.integrations.transformers as lt
    lt.enable()            # before or after the model is built; lt.disable() undoes it

The six families whose modeling files share Mamba-2's mixer (:data:`FAMILIES`: Mamba-2, Zamba2,
Falcon-H1, Bamba, Granite-4.0-H, Nemotron-H) route its hot functions through
``use_kernel_func_from_hub_with_fallback``, resolved once when their module is imported:
mamba_ssm's kernels where it is installed, else a PyTorch reference that transformers calls
slow and that refuses packed sequences. :func:`enable` sets those five module attributes, which
the mixers call at run time, to this project's:

* ``mamba2_chunk_scan``: :func:`leetrepro.compat.mamba_chunk_scan_combined` (the SSD through
  the operator with per-token gates; ``seq_idx`` and ``cu_seqlens`` keep packed sequences apart);
* ``mamba2_split_conv1d_scan_combined`` (training, no cache): the block's causal convolution
  and SiLU, the SSD, the gated RMS norm over each group and the out-projection, each one pass
  on a GPU (``models._conv``, ``models._norm``), where the fallback returned None;
* ``causal_conv1d_fn``: the causal depthwise convolution with its SiLU, one pass each way on a
  GPU, read in place from the in-projection (a packed batch's ``seq_idx`` keeps each
  sequence's first rows from reading the one before);
* ``causal_conv1d_update``, ``mamba2_selective_state_update``: the decode step's convolution
  and state update (the latter one pass on a GPU).

5.24's ``Mamba2ForCausalLM.forward`` drops its keyword arguments instead of handing them to its
backbone, so a ``seq_idx`` given to it would be ignored and a packed batch run as one sequence,
silently: :func:`enable` also has it hand ``seq_idx`` and ``cu_seqlens`` on. In the hybrid
families the attention layers keep packed sequences apart only where transformers' own packing
does (``position_ids`` restarting per sequence with an attention that reads them, such as
``flash_attention_2``); this project serves the Mamba-2 layers.

The modeling code is not copied: only the names it calls are replaced. Written and tested
against transformers 5.24 (:data:`TESTED`); :func:`enable` refuses a family whose module lacks
one of the names, naming it, and warns on another release.

In 5.24 these six are every family that calls Mamba-2's kernels (a test holds the list to the
installed transformers). Not covered, each for its reason:

* Mamba-1's selective scan (``mamba``, ``falcon_mamba``, ``jamba``, ``zamba``): its decay
  ``exp(Δ_t A)`` differs along the state's dimension, so the pair (i, j) has no single mask
  entry per head: outside ``(B Cᵀ ⊙ M) V``;
* the delta rule (Gated DeltaNet in ``qwen3_next``, ``qwen3_5``, ``qwen3_5_moe``, ``qwen4_exp``,
  ``olmo_hybrid``, ``lara_mini``; Kimi's in ``kimi_linear``, ``bailing_hybrid``, ``glm5_next``):
  the state is also corrected by ``−β k kᵀ S``, not a decayed sum of outer products;
* short convolutions alone (``lfm2``, ``lfm2_moe``, ``lfm3``, ``inkling*``): no scan to serve;
  their ``causal_conv1d_fn`` is PyTorch's cuDNN convolution.
"""
from __future__ import annotations

import importlib
import math

import torch

#: transformers' model types whose mixer is Mamba-2's, and the release they were tested with
FAMILIES = ("mamba2", "zamba2", "falcon_h1", "bamba", "granitemoehybrid", "nemotron_h")
TESTED = "5.24"
NAMES = ("mamba2_chunk_scan", "mamba2_split_conv1d_scan_combined", "causal_conv1d_fn",
         "causal_conv1d_update", "mamba2_selective_state_update")
_SAVED: dict = {}
#: causal-LM classes whose forward does not hand its keyword arguments to its backbone (above)
_DROPS_PACKING = {"mamba2": "Mamba2ForCausalLM"}


def chunk_scan(hidden_states, dt, A, B, C, chunk_size, D=None, dt_bias=None,
               initial_states=None, dt_softplus=False, dt_limit=(0.0, math.inf),
               return_final_states=False, z=None, seq_idx=None, cu_seqlens=None, **_):
    """transformers' ``mamba2_chunk_scan`` (mamba_ssm's ``mamba_chunk_scan_combined``
    signature) by :func:`leetrepro.compat.mamba_chunk_scan_combined`."""
    from ..compat import mamba_chunk_scan_combined
    return mamba_chunk_scan_combined(
        hidden_states, dt, A, B, C, chunk_size, D=D, z=z, dt_bias=dt_bias,
        initial_states=initial_states, seq_idx=seq_idx, cu_seqlens=cu_seqlens,
        dt_softplus=dt_softplus, dt_limit=tuple(dt_limit), return_final_states=return_final_states)


def causal_conv1d_fn(hidden_states, weight, bias=None, activation=None, seq_idx=None, **_):
    """causal-conv1d's ``causal_conv1d_fn``: x ``(batch, channels, seqlen)`` (here a transposed
    view of the in-projection's time-major slice), weight ``(channels, width)``; the SiLU where
    ``activation`` is ``"silu"``/``"swish"``; ``seq_idx`` ``(batch, seqlen)``: a row reads only
    rows of its own sequence. Returns ``(batch, channels, seqlen)`` (a transposed view of a
    time-major tensor, as the caller transposes it back)."""
    from ..models._conv import causal_conv_by_taps, causal_conv_silu
    x = hidden_states.transpose(1, 2)  # (batch, seqlen, channels): the in-projection's layout
    if activation in ("silu", "swish"):
        return causal_conv_silu(x, weight.unsqueeze(1), bias, seq_idx).transpose(1, 2)
    return causal_conv_by_taps(x, weight.unsqueeze(1), bias, seq_idx).transpose(1, 2)


def causal_conv1d_update(hidden_states, conv_state, weight, bias=None, activation=None, **_):
    """causal-conv1d's ``causal_conv1d_update``: the new rows x ``(batch, channels, L)`` shifted
    into ``conv_state`` ``(batch, channels, width)`` in place; returns their outputs
    ``(batch, channels, L)`` in x's dtype (:func:`leetrepro.models._conv.causal_conv_update`:
    one launch on a GPU)."""
    from ..models._conv import causal_conv_update
    if activation not in (None, "silu", "swish"):
        raise ValueError(f"causal_conv1d_update: activation {activation!r} is not computed here "
                         f"(None, 'silu' or 'swish')")
    return causal_conv_update(hidden_states, conv_state, weight, bias,
                              silu=activation is not None)


def selective_state_update(state, hidden_states, dt, A, B, C, D=None, dt_bias=None,
                           dt_softplus=False, z=None, **_):
    """mamba_ssm's ``selective_state_update`` for one token
    (:func:`leetrepro.methods.state_update.selective_state_update`: one pass on a GPU), the state
    ``(batch, heads, headdim, dstate)`` stepped in place."""
    from ..compat import selective_state_update as update
    return update(state, hidden_states, dt, A, B, C, D=D, z=z, dt_bias=dt_bias,
                  dt_softplus=dt_softplus)


def split_conv1d_scan_combined(zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D, chunk_size,
                               initial_states=None, dt_limit=(0.0, math.inf),
                               return_final_states=False, activation="silu",
                               rmsnorm_weight=None, rmsnorm_eps=1e-6, outproj_weight=None,
                               outproj_bias=None, headdim=None, ngroups=1,
                               norm_before_gate=True, seq_idx=None, cu_seqlens=None, **_):
    """mamba_ssm's ``mamba_split_conv1d_scan_combined`` as transformers' mixers call it in
    training: zxbcdt ``(batch, seqlen, d_inner + conv channels + heads)`` split in place, the
    convolution and SiLU, the SSD, the gated RMS norm over each of ``ngroups`` groups
    (``norm_before_gate=False``: the norm of ``y·silu(z)``; without ``rmsnorm_weight``, the gate
    ``y·silu(z)`` alone, taken inside the SSD, as Falcon-H1's default) and the out-projection.
    None (the caller's unfused path) where it asks for what this does not compute: another
    activation, the norm before the gate."""
    if activation not in ("silu", "swish") or (norm_before_gate and rmsnorm_weight is not None):
        return None
    from ..models._norm import gated_rms_norm
    heads = A.shape[0]
    d_inner = heads * headdim
    conv = conv1d_weight.shape[0]
    dstate = (conv - d_inner) // (2 * ngroups)
    z, xbc, dt = zxbcdt.split([d_inner, conv, heads], -1)
    xbc = causal_conv1d_fn(xbc.transpose(1, 2), conv1d_weight, conv1d_bias, activation,
                           seq_idx=seq_idx).transpose(1, 2)
    x, B, C = xbc.split([d_inner, ngroups * dstate, ngroups * dstate], -1)
    lead = x.shape[:-1]
    res = chunk_scan(x.unflatten(-1, (heads, headdim)), dt, A,
                     B.unflatten(-1, (ngroups, dstate)), C.unflatten(-1, (ngroups, dstate)),
                     chunk_size, D=D, dt_bias=dt_bias, initial_states=initial_states,
                     dt_softplus=True, dt_limit=dt_limit, return_final_states=return_final_states,
                     seq_idx=seq_idx, cu_seqlens=cu_seqlens,
                     z=None if rmsnorm_weight is not None else z.unflatten(-1, (heads, headdim)))
    y, final = res if return_final_states else (res, None)
    y = y.reshape(*lead, d_inner)
    if rmsnorm_weight is not None:
        y = gated_rms_norm(y, z, rmsnorm_weight, rmsnorm_eps, group_size=d_inner // ngroups)
    out = torch.nn.functional.linear(y, outproj_weight, outproj_bias) \
        if outproj_weight is not None else y
    return (out, final) if return_final_states else out


_OURS = {"mamba2_chunk_scan": chunk_scan,
         "mamba2_split_conv1d_scan_combined": split_conv1d_scan_combined,
         "causal_conv1d_fn": causal_conv1d_fn, "causal_conv1d_update": causal_conv1d_update,
         "mamba2_selective_state_update": selective_state_update}


def _module(family: str):
    return importlib.import_module(f"transformers.models.{family}.modeling_{family}")


def enable(families=FAMILIES) -> list[str]:
    """Route each family's Mamba-2 mixer through this project (module docstring); returns the
    families enabled. A family whose modeling module lacks one of :data:`NAMES` (another
    transformers release) raises a RuntimeError naming it and the name, changing nothing."""
    if isinstance(families, str):
        families = (families,)
    unknown = [f for f in families if f not in FAMILIES]
    if unknown:
        raise ValueError(f"unknown families {unknown}; these have Mamba-2's mixer: {FAMILIES}")
    modules = {f: _module(f) for f in families}
    for family, mod in modules.items():
        missing = [n for n in NAMES if not hasattr(mod, n)]
        if missing:
            import transformers
            raise RuntimeError(f"transformers {transformers.__version__}'s {family} has no "
                               f"{missing} (tested with {TESTED}): not enabled")
    import transformers
    _warn_of_release(modules, transformers.__version__)
    for family, mod in modules.items():
        for name in NAMES:
            _SAVED.setdefault((family, name), getattr(mod, name))
            setattr(mod, name, _OURS[name])
        cls = getattr(mod, _DROPS_PACKING.get(family, ""), None)
        if cls is not None and (family, "forward") not in _SAVED:
            _SAVED[(family, "forward")] = cls.forward
            cls.forward = _packing_on(cls.forward)
    return list(modules)


def _packing_on(forward):
    """A causal LM's ``forward`` that hands ``seq_idx`` and ``cu_seqlens`` on to its backbone
    (a pre-hook for the call; no hook where neither is given)."""
    import functools

    @functools.wraps(forward)
    def call(self, *args, seq_idx=None, cu_seqlens=None, **kwargs):
        extra = {k: v for k, v in (("seq_idx", seq_idx), ("cu_seqlens", cu_seqlens))
                 if v is not None}
        if not extra:
            return forward(self, *args, **kwargs)
        hook = self.backbone.register_forward_pre_hook(
            lambda module, a, kw: (a, {**kw, **extra}), with_kwargs=True)
        try:
            return forward(self, *args, **kwargs)
        finally:
            hook.remove()
    return call


def _warn_of_release(modules: dict, version: str) -> None:
    """Warn where transformers is not the tested release, and name the families whose own gated
    norm takes all channels at once (5.17's Mamba-2 does): their fused training call
    (mamba_ssm's, and this project's) normalises each of ``n_groups`` groups, so with more than
    one group training and evaluation compute different functions, with or without this
    project."""
    import inspect
    import warnings
    release = ".".join(version.split(".")[:2])
    if release == TESTED:
        return
    whole = [f"{family} ({name})" for family, mod in modules.items()
             for name, cls in vars(mod).items()
             if name.endswith("RMSNormGated") and isinstance(cls, type)
             and not {"group_size", "n_groups"} & set(inspect.signature(cls).parameters)]
    note = (f"; its {', '.join(whole)} normalises all channels at once where the fused "
            "training call normalises each of n_groups groups (as mamba_ssm): with n_groups > 1 "
            "a model's training and evaluation differ") if whole else ""
    warnings.warn(f"leetrepro.integrations.transformers was tested with transformers {TESTED}, "
                  f"not {version}{note}", stacklevel=3)


def disable() -> None:
    """Undo :func:`enable`: each family's own functions back."""
    for (family, name), fn in list(_SAVED.items()):
        owner = getattr(_module(family), _DROPS_PACKING[family]) if name == "forward" else \
            _module(family)
        setattr(owner, name, fn)
        del _SAVED[(family, name)]
