"""Normalised linear attention's passes around the operator, one Triton launch each
(``kernels/normalizer.py``), where PyTorch's composition took about twenty float32 passes (running
sums, row dots, divisions, casts) beside the operator itself.

With f(x) = c + x and the operator's numerator ``num = op(q, k, v)`` (γ = 1):

* :func:`normalized_output`: ``o = (num + c·cumsum(v)) / (c·(i + 1) + q·cumsum(k) + eps)``, in
  v's dtype, and the denominators (float32): two passes (the chunks' sums of k and v, then
  the output), reading q, k, v and num once each, and between them one scan of the chunks'
  sums;
* :func:`normalized_prologue`: the operator's dO (``dO / den``, in v's dtype), ``dden =
  −(dO·o) / den`` and the chunks' sums the last pass starts from: one pass, then one scan of
  them all (k's forward, the others reversed);
* :func:`normalized_epilogue`: ``dq + dden·cumsum(k)``, ``dk + revcumsum(dden·q)``, ``dv +
  c·revcumsum(dO / den)``: one launch.

And the kernel paper's row normalisation of q and k (its Eq. 22), one pass each way:
:func:`row_normalized` (``x / max(‖x‖₂, eps)`` and the norms) and
:func:`row_normalized_backward`, in any layout a model hands them (a time-major view's rows
stay where they are), where PyTorch's ``normalize`` takes about eight passes, strided where the
norm is broadcast.

Each is a custom op (``torch.library``) with its fake, so that a compiled graph holds it. Shapes:
q, k ``(batch, heads, N, r)``, v, num, o, dO ``(batch, heads, N, d)`` (any strides but a
contiguous last dimension), fp16/bf16/fp32; the denominators ``(batch, heads, N)`` float32.
Running sums in float32, in chunks of :data:`BLOCK_N` rows (the backward's:
:data:`BACKWARD_BLOCK_N`) from the prefix of the chunks' sums.
A pass's chunk sums sit side by side in one tensor (each part padded to its block), and their
sums before (or after) each chunk are one small launch (:func:`_scan`).
O(N·(r + d)) per head. :func:`on_kernels` says where they run (a GPU; on a CPU, Triton's
interpreter asked for by name).
"""
from __future__ import annotations

import torch

from ._gpu import (NoTriton, cdiv, interpreted_bf16, launch, next_pow2, on_row_kernels,
                   rows_contiguous, strided)

try:
    from ..kernels import normalizer as kernels
except ImportError as err:  # without Triton: PyTorch's composition
    kernels = NoTriton(err)

#: rows a program takes (its running sums within the chunk, from the chunks' prefix): the
#: forward's passes and the row normalisation, and the backward's (prologue and epilogue: at
#: N = 16384, r = d = 128, bf16, H200, every pair of 16-64 rows and 1-8 warps tried, the
#: epilogue took 408 µs at 16 rows and two warps against 484 at 32 and four, 454 against 745
#: with the rows' normalisation folded in; one warp, 369 and 458, spills 148 bytes a thread on
#: sm_90 with the normalisation, two none)
BLOCK_N, BACKWARD_BLOCK_N = 32, 16
DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def on_kernels(*tensors: torch.Tensor) -> bool:
    """Whether the passes run on their kernels for these inputs (:func:`on_row_kernels`;
    fp16/bf16/fp32, r and d at most 256)."""
    q, v = tensors[0], tensors[-1]
    return on_row_kernels(q, kernels) and all(t.dtype in DTYPES for t in tensors) and \
        q.shape[-1] <= 256 and v.shape[-1] <= 256 and q.numel() > 0 and v.numel() > 0


def _shape(q: torch.Tensor, v: torch.Tensor) -> tuple:
    batch, heads, n, r = q.shape
    return batch, heads, n, r, v.shape[-1]


#: whether the running sums within a chunk of 16-bit inputs run on the tensor cores (a
#: triangular matrix of ones times the rows, split in two 16-bit parts: ``kernels._triangular``)
#: rather than as ``tl.cumsum``. Off: at N = 16384, r = d = 128, bf16, H200 (torch's profiler)
#: the product took the epilogue 468 → 413 µs with each gradient's part reading its own tiles,
#: but kept to a non-finite entry's side (as ``tl.cumsum`` is, and the operator) it took 601
#: against 559 µs with the tiles read once, the forward's pass 252 against 189; not measured
#: kept to its side with each part's own tiles (notes/other_papers.md). fp32 never takes it
RUN_ON_MMA = False


def _run(dtype: torch.dtype) -> int:
    """The kernels' ``RUN`` for inputs of ``dtype``: 0 ``tl.cumsum``, 1 the tensor cores in bf16,
    2 in fp16 (under Triton's interpreter, whose bf16 dot products are wrong)."""
    if not RUN_ON_MMA or dtype == torch.float32:
        return 0
    return 2 if interpreted_bf16(torch.bfloat16) else 1


def _options(r: int, d: int, block_n: int = BLOCK_N) -> dict:
    return dict(BLOCK_N=block_n, BLOCK_R=next_pow2(r), BLOCK_D=next_pow2(d))


#: warps of each pass's programs (a chunk of BLOCK_N rows by the head's width): few, so that a
#: chunk's column sums and running sums stay within a warp's threads; with 8 warps the totals
#: pass ran at 5× its memory floor, L1-bound on the sums across warps (ncu, H200; the sweep in
#: notes/other_papers.md chose these at N = 16384, r = d = 128)
WARPS = {"totals": 1, "forward": 4, "prologue": 1, "epilogue": 2, "rows": 2}
#: chunks a program of the chunk scan takes at once, its columns and warps (a few hundred
#: programs, each a few steps: the scan is latency-bound)
SCAN_BLOCK = (128, 16, 2)


def _warps(kind: str, r: int, d: int) -> int:
    """Warps for the pass ``kind``, doubled past 128 columns (the tiles' registers)."""
    return WARPS[kind] * (2 if max(r, d) > 128 else 1)


def _scan(sums: torch.Tensor, reverse_from: int) -> torch.Tensor:
    """Each chunk's sum over the chunks before it, or after it for the columns from
    ``reverse_from`` on (a multiple of the scan's column block, where the passes' parts start):
    float32 ``(batch·heads, chunks, width)``, one launch."""
    bh, chunks, width = sums.shape
    out = torch.empty_like(sums)
    block_c, block_w, warps = SCAN_BLOCK
    launch(kernels.normalizer_chunk_scan, (bh, cdiv(width, block_w)),
           dict(SUMS=sums, OUT=out, CHUNKS=chunks, WIDTH=width, REVERSE_FROM=reverse_from,
                BLOCK_C=block_c, BLOCK_W=block_w), num_warps=warps)
    return out


def _before(sums: torch.Tensor) -> torch.Tensor:
    return _scan(sums, sums.shape[-1])


def _sums(batch_heads: int, chunks: int, width: int, like: torch.Tensor) -> torch.Tensor:
    """A pass's chunk sums, its parts side by side in ``width`` columns (each part padded to its
    block: the kernels' layout), float32."""
    return torch.empty(batch_heads, chunks, width, dtype=torch.float32, device=like.device)


#: whether the layer's forward (``related.normalized_linear_attention`` with ``method="auto"``)
#: runs as one sweep of Chunk's kernels that carries the normaliser (:func:`normalized_in_sweep`)
#: instead of the operator and the passes around it. On: at the kernel paper's layer (b2 × 16
#: heads × 128, bf16, H200) the portable kernel's sweep took 0.43 ms against the passes' 0.52 at
#: N = 4096 and tied at 16384 (0.83 against 0.82), with a third less peak memory
#: (``data/h200/kernel_paper_layer.csv``); the Hopper kernel's sweep where it takes the call
#: (``chunk.tables.HOPPER_NORM``, notes/other_papers.md)
IN_SWEEP = True


def in_sweep(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, method: str, options: dict,
             ) -> bool:
    """Whether the layer's forward takes :func:`normalized_in_sweep` (:data:`IN_SWEEP`): the
    passes' kernels at hand (:func:`on_kernels`), ``method="auto"`` with no options, one dtype,
    r and d at most 128, the last dimensions contiguous; never bf16 under Triton's interpreter,
    whose bf16 dot products are wrong (:func:`refuse_interpreted_bf16`)."""
    return IN_SWEEP and method == "auto" and not options and on_kernels(q, k, v) and \
        q.dtype == k.dtype == v.dtype and q.shape[-1] <= 128 and v.shape[-1] <= 128 and \
        all(t.stride(-1) == 1 for t in (q, k, v)) and not interpreted_bf16(q.dtype)


@torch.library.custom_op("leetrepro::normalized_in_sweep", mutates_args=())
def normalized_in_sweep(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, c: float,
                        eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(o, den)`` as :func:`normalized_output` gives them, from one sweep of Chunk's kernels
    (``chunk_scan``'s ``norm``: the Hopper kernel where :func:`chunk.hopper_norm_unfit` lets it,
    else the portable one): the scores take + c, the sums of k and v ride beside the
    state, each row is divided in the epilogue and stored once in v's dtype (o in v's layout),
    the denominators (float32 ``(batch, heads, N)``) beside it. q, k ``(batch, heads, N, r)``,
    v ``(batch, heads, N, d)``, any strides with a contiguous last dimension;
    O(N·(L·(r + d) + r·d)) a lane, no pass of its own. A custom op: a compiled graph holds it."""
    from .chunk import chunk_scan
    den = torch.empty(q.shape[:3], dtype=torch.float32, device=q.device)
    o = chunk_scan(q, k, v, None, norm=(c, eps, den))
    return o, den


@normalized_in_sweep.register_fake
def _(q, k, v, c, eps):
    return torch.empty_like(v), v.new_empty(q.shape[:3], dtype=torch.float32)


#: whether the layer's backward (``related.normalized_linear_attention``) computes dq, dk and dv
#: with their running-sum terms inside three sweeps of Chunk (:func:`normalized_grads_in_sweeps`,
#: the scores' rank-one offsets) instead of the operator's backward and the last pass's scans:
#: True where the Hopper kernel takes all three sweeps (:func:`grads_in_sweeps`), ``"always"``
#: wherever the passes' kernels run (the portable kernel's sweeps elsewhere), False never
GRAD_IN_SWEEPS = True


def grads_in_sweeps(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether the layer's backward takes :func:`normalized_grads_in_sweeps`
    (:data:`GRAD_IN_SWEEPS`): the passes' kernels at hand, one dtype, last dimensions
    contiguous, and (unless ``"always"``) the Hopper kernel taking each of the three sweeps
    (:func:`leetrepro.methods.chunk.hopper_norm_unfit`: bf16, r = d = 128)."""
    if not GRAD_IN_SWEEPS or not on_kernels(q, k, v) or not q.dtype == k.dtype == v.dtype or \
            not all(t.stride(-1) == 1 for t in (q, k, v)) or interpreted_bf16(q.dtype):
        return False
    if GRAD_IN_SWEEPS == "always":
        return True
    if torch.compiler.is_compiling():  # (no pointers to read: the shapes and dtype decide; a
        # sweep the Hopper kernel then refuses runs on the portable kernel, as exact)
        return q.dtype == torch.bfloat16 and q.shape[-1] == v.shape[-1] == 128
    from .chunk import hopper_norm_unfit
    return not any(hopper_norm_unfit(*ops) for ops in ((v, v, k), (v, v, q), (k, q, v)))


@torch.library.custom_op("leetrepro::normalized_grads_in_sweeps", mutates_args=())
def normalized_grads_in_sweeps(dnum: torch.Tensor, dden: torch.Tensor, q: torch.Tensor,
                               k: torch.Tensor, v: torch.Tensor, c: float,
                               need: list[bool]) -> tuple[torch.Tensor, torch.Tensor,
                                                          torch.Tensor]:
    """The layer's dq, dk, dv (empty where ``need`` says not), each one sweep of Chunk with a
    rank-one term on its scores (``chunk_scan``'s ``offsets``), from dnum = dO / den (v's dtype)
    and dden = −(dO·o) / den (float32 ``(batch, heads, N)``, :func:`normalized_prologue`):

    * dq_i = Σ_{j≤i} (dnum_i·v_j + dden_i) k_j: op(dnum, v, k), the rows' offsets dden;
    * dk_j = Σ_{i≥j} (v_j·dnum_i + dden_i) q_i: op(v, dnum, q) in reverse, the columns' dden;
    * dv_j = Σ_{i≥j} (k_j·q_i + c) dnum_i: op(k, q, dnum) in reverse, the constant c.

    What the passes add after the operator's backward (dden·cumsum(k), revcumsum(dden·q),
    c·revcumsum(dnum)) is then inside the sweeps: each gradient written once, in its input's
    dtype (dq in k's layout, dk in q's, or k's beside dv, dv in dnum's). dk and dv both wanted
    come from one sweep, dk as dv's dual output (``chunk_scan``'s ``("dual", c, dden)``), as
    the operator's backward makes dC beside dV. O(N·(L·(r + d) + r·d)) a lane and sweep."""
    from .chunk import chunk_scan
    empty = q.new_empty(0)
    dq = chunk_scan(dnum, v, k, None, offsets=("rows", 0.0, dden)) if need[0] else empty
    if need[1] and need[2]:  # (dv's sweep with dk as its dual output: one sweep for both)
        dv, dk = chunk_scan(k, q, dnum, None, reverse=True, dual=v, offsets=("dual", c, dden))
        return dq, dk, dv
    dk = chunk_scan(v, dnum, q, None, reverse=True, offsets=("cols", 0.0, dden)) \
        if need[1] else empty
    dv = chunk_scan(k, q, dnum, None, reverse=True, offsets=("rows", c, None)) \
        if need[2] else empty
    return dq, dk, dv


@normalized_grads_in_sweeps.register_fake
def _(dnum, dden, q, k, v, c, need):
    empty = q.new_empty(0)
    return (torch.empty_like(k) if need[0] else empty,
            torch.empty_like(k if need[2] else q) if need[1] else empty,
            torch.empty_like(dnum) if need[2] else empty)


@torch.library.custom_op("leetrepro::normalized_output", mutates_args=())
def normalized_output(num: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                      c: float, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(o, den)``: o ``(batch, heads, N, d)`` contiguous in v's dtype, den float32
    ``(batch, heads, N)`` (module docstring)."""
    num, q, k, v = (rows_contiguous(t) for t in (num, q, k, v))
    batch, heads, n, r, d = _shape(q, v)
    chunks = cdiv(n, BLOCK_N)
    size, opts = (n, r, d, heads), _options(r, d)
    o = torch.empty(batch, heads, n, d, dtype=v.dtype, device=v.device)
    den = torch.empty(batch, heads, n, dtype=torch.float32, device=v.device)
    # (k's sums, then v's: one scan for both)
    sums = _sums(batch * heads, chunks, opts["BLOCK_R"] + opts["BLOCK_D"], v)
    grid = (batch * heads, chunks)
    launch(kernels.normalizer_totals, grid,
           dict(K=strided(k), V=strided(v), SUMS=sums, SIZE=size, **opts),
           num_warps=_warps("totals", r, d))
    launch(kernels.normalizer_forward, grid,
           dict(NUM=strided(num), Q=strided(q), K=strided(k), V=strided(v), O=strided(o), DEN=den,
                SUMS=_before(sums), SIZE=size, c=float(c), eps=float(eps), HAS_C=c != 0,
                RUN=_run(v.dtype), **opts),
           num_warps=_warps("forward", r, d))
    return o, den


@normalized_output.register_fake
def _(num, q, k, v, c, eps):
    batch, heads, n, r, d = _shape(q, v)
    return v.new_empty(batch, heads, n, d), v.new_empty(batch, heads, n, dtype=torch.float32)


@torch.library.custom_op("leetrepro::normalized_prologue", mutates_args=())
def normalized_prologue(do: torch.Tensor, o: torch.Tensor, den: torch.Tensor, q: torch.Tensor,
                        k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(dnum, dden, sums)``: dnum ``(batch, heads, N, d)`` contiguous in o's dtype (the
    operator's dO), dden float32 ``(batch, heads, N)``, and the sums float32 ``(batch·heads,
    chunks, 2·BLOCK_R + BLOCK_D)``: k's over the chunks before each, dden·q's and (dO / den)'s
    over the chunks after each, side by side (:func:`normalized_epilogue` reads them)."""
    do, o, q, k = (rows_contiguous(t) for t in (do, o, q, k))
    batch, heads, n, r, d = _shape(q, o)
    chunks = cdiv(n, BACKWARD_BLOCK_N)
    opts = _options(r, d, BACKWARD_BLOCK_N)
    dnum = torch.empty(batch, heads, n, d, dtype=o.dtype, device=o.device)
    dden = torch.empty(batch, heads, n, dtype=torch.float32, device=o.device)
    sums = _sums(batch * heads, chunks, 2 * opts["BLOCK_R"] + opts["BLOCK_D"], o)
    launch(kernels.normalizer_prologue, (batch * heads, chunks),
           dict(DO=strided(do), O=strided(o), DEN=den.contiguous(), Q=strided(q), K=strided(k),
                DNUM=strided(dnum), DDEN=dden, SUMS=sums, SIZE=(n, r, d, heads),
                WITH_SUMS=True, **opts),
           num_warps=_warps("prologue", r, d))
    # (k's part forward, the others reversed: one scan)
    return dnum, dden, _scan(sums, opts["BLOCK_R"])


@torch.library.custom_op("leetrepro::normalized_prologue_rows", mutates_args=())
def normalized_prologue_rows(do: torch.Tensor, o: torch.Tensor,
                             den: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`normalized_prologue`'s ``(dnum, dden)`` alone, without the chunks' sums that only
    the last pass reads (the backward in sweeps, :func:`normalized_grads_in_sweeps`, has none):
    dO and o read, dnum and dden written. One pass."""
    do, o = (rows_contiguous(t) for t in (do, o))
    batch, heads, n, d = o.shape
    opts = _options(d, d, BACKWARD_BLOCK_N)
    dnum = torch.empty(batch, heads, n, d, dtype=o.dtype, device=o.device)
    dden = torch.empty(batch, heads, n, dtype=torch.float32, device=o.device)
    launch(kernels.normalizer_prologue, (batch * heads, cdiv(n, BACKWARD_BLOCK_N)),
           dict(DO=strided(do), O=strided(o), DEN=den.contiguous(), Q=strided(o), K=strided(o),
                DNUM=strided(dnum), DDEN=dden, SUMS=dden, SIZE=(n, d, d, heads),
                WITH_SUMS=False, **opts),
           num_warps=_warps("prologue", d, d))
    return dnum, dden


@normalized_prologue_rows.register_fake
def _(do, o, den):
    return o.new_empty(o.shape), o.new_empty(o.shape[:3], dtype=torch.float32)


@normalized_prologue.register_fake
def _(do, o, den, q, k):
    batch, heads, n, r, d = _shape(q, o)
    opts = _options(r, d, BACKWARD_BLOCK_N)
    return (o.new_empty(batch, heads, n, d), o.new_empty(batch, heads, n, dtype=torch.float32),
            o.new_empty(batch * heads, cdiv(n, BACKWARD_BLOCK_N),
                        2 * opts["BLOCK_R"] + opts["BLOCK_D"], dtype=torch.float32))


@torch.library.custom_op("leetrepro::normalized_epilogue", mutates_args=("dq", "dk", "dv"))
def normalized_epilogue(dq: torch.Tensor | None, dk: torch.Tensor | None,
                        dv: torch.Tensor | None, q: torch.Tensor, k: torch.Tensor,
                        do: torch.Tensor, den: torch.Tensor, dden: torch.Tensor,
                        sums: torch.Tensor, q_norms: torch.Tensor | None,
                        k_norms: torch.Tensor | None, c: float, row_eps: float) -> None:
    """The denominator's terms added in place to the operator's dq, dk, dv (each None where not
    wanted; dv untouched where c = 0: it has no such term), in their own dtypes and layouts (the
    operator's gradients come in their inputs' layouts: no second buffer, and a time-major
    view's gradient stays time-major). Where ``q_norms`` and ``k_norms`` are given
    (:func:`row_normalized`'s, clamped at ``row_eps``), q and k are the layer's normalised rows,
    and dq, dk become the gradients of the rows before it."""
    q, k, do = (rows_contiguous(t) for t in (q, k, do))
    batch, heads, n, r, d = _shape(q, do)
    want_v = dv is not None and c != 0
    grads = [rows_contiguous(t) if t is not None else q for t in (dq, dk, dv)]
    want = sum(bit.value for bit, on in ((kernels.WANT_DQ, dq is not None),
                                         (kernels.WANT_DK, dk is not None),
                                         (kernels.WANT_DV, want_v),
                                         (kernels.ROWS_NORMALIZED, q_norms is not None)) if on)
    launch(kernels.normalizer_epilogue, (batch * heads, cdiv(n, BACKWARD_BLOCK_N)),
           dict(GRADS=tuple(map(strided, grads)), Q=strided(q), K=strided(k), DO=strided(do),
                DEN=den.contiguous(), DDEN=dden, SUMS=sums,
                NORMS=(_norms(q_norms, den), _norms(k_norms, den), float(row_eps)),
                SIZE=(n, r, d, heads), c=float(c), WANT=want, RUN=_run(do.dtype),
                **_options(r, d, BACKWARD_BLOCK_N)),
           num_warps=_warps("epilogue", r, d))
    for g, t in zip(grads, (dq, dk, dv)):
        if t is not None and g.data_ptr() != t.data_ptr():  # (a gradient with strided rows)
            t.copy_(g)


def _norms(norms: torch.Tensor | None, den: torch.Tensor) -> torch.Tensor:
    """Rows' norms as the epilogue reads them (float32, one a row, contiguous), or den where
    there are none (never read then)."""
    return den if norms is None else norms.contiguous()


@normalized_epilogue.register_fake
def _(dq, dk, dv, q, k, do, den, dden, sums, q_norms, k_norms, c, row_eps):
    return None


def _row_views(*tensors: torch.Tensor) -> list:
    """The tensors (each ``(..., r)``, one shape) as 4-D ``(a, b, rows, r)`` views that the row
    passes address alike, row for row: every row flattened into one lane where each tensor
    flattens as a view, else the 4-D tensors themselves (any strides, contiguous rows), else
    contiguous copies (flattened)."""
    flat = []
    for t in tensors:
        try:
            f = t.view(-1, t.shape[-1])
        except RuntimeError:
            break
        if f.stride(-1) != 1:
            break
        flat.append(f[None, None])
    else:
        return flat
    if tensors[0].dim() == 4 and all(t.stride(-1) == 1 for t in tensors):
        return list(tensors)
    return [t.contiguous().view(-1, t.shape[-1])[None, None] for t in tensors]


def _row_pass(kernel, tensors: dict, out: str, s: torch.Tensor, eps: float) -> None:
    """One launch of a row pass over ``tensors`` (by the kernel's names, one shape, viewed alike by
    :func:`_row_views`); ``s``: the rows' norms, float32 contiguous. The output ``tensors[out]``
    is written back where its view had to be a copy."""
    views = dict(zip(tensors, _row_views(*tensors.values())))
    a, b, n, r = views[out].shape
    launch(kernel, (a * b, cdiv(n, BLOCK_N)),
           dict({k: strided(v) for k, v in views.items()}, S=s, SIZE=(n, r, b), eps=float(eps),
                BLOCK_N=BLOCK_N, BLOCK_R=next_pow2(r)), num_warps=_warps("rows", r, r))
    if views[out].data_ptr() != tensors[out].data_ptr():
        tensors[out].copy_(views[out].view(tensors[out].shape))


def on_row_norm_kernels(x: torch.Tensor) -> bool:
    """Whether :func:`row_normalized` runs on its kernels for x (:func:`on_row_kernels`;
    fp16/bf16/fp32, rows of at most 256)."""
    return on_row_kernels(x, kernels) and x.dtype in DTYPES and x.dim() >= 1 and \
        0 < x.shape[-1] <= 256 and x.numel() > 0


@torch.library.custom_op("leetrepro::row_normalized", mutates_args=())
def row_normalized(x: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x / s, s)`` with ``s = max(‖x‖₂, eps)`` over x's last dimension: the rows in x's dtype
    and layout (``torch.empty_like``), the norms float32 ``x.shape[:-1]``, contiguous. One pass,
    O(numel)."""
    y, s = torch.empty_like(x), x.new_empty(x.shape[:-1], dtype=torch.float32)
    _row_pass(kernels.row_normalize_forward, dict(X=x, Y=y), "Y", s, eps)
    return y, s


@row_normalized.register_fake
def _(x, eps):
    return torch.empty_like(x), x.new_empty(x.shape[:-1], dtype=torch.float32)


@torch.library.custom_op("leetrepro::row_normalized_backward", mutates_args=())
def row_normalized_backward(dy: torch.Tensor, y: torch.Tensor, s: torch.Tensor,
                            eps: float) -> torch.Tensor:
    """x's gradient from :func:`row_normalized`'s ``(y, s)`` and y's gradient dy: ``(dy −
    y·(y·dy)) / s`` per row (``dy / s`` where the norm was clamped to eps), in y's dtype and
    layout. One pass."""
    dx = torch.empty_like(y)
    _row_pass(kernels.row_normalize_backward, dict(DY=dy, Y=y, DX=dx), "DX", s, eps)
    return dx


@row_normalized_backward.register_fake
def _(dy, y, s, eps):
    return torch.empty_like(y)
