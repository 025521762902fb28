"""What the Triton and CUDA launchers share: input staging and the fp32 precision switch.

fp32 precision of the Triton kernels' dot products (``fp32_precision`` option, or the
``LEETREPRO_FP32_PRECISION`` environment variable for the default):

* ``"tf32"`` (default): tensor-core tf32, ~1e-3 relative error, the accuracy every public kernel of
  this operator has (original LeetDecoding, flash-linear-attention); held to 5e-3 in the tests.
* ``"tf32x3"``: three tf32 products (split operands), ~1e-6, meets the fp32 contract (1e-5).
* ``"ieee"``: plain fp32 FMA, the slowest.

fp16/bf16 inputs use fp16/bf16 tensor-core products with fp32 accumulation and an fp32 state.
"""
from __future__ import annotations

import os

import torch

from .._device import gpu_tag, sm_count  # noqa: F401  (the launchers' SM count)
from .._paths import PACKAGE
from ..registry import FP32_PRECISIONS


#: the kernel package's folder (Triton modules and CUDA sources)
KERNELS = os.path.join(PACKAGE, "kernels")

#: the default of ``fp32_precision``: the environment, read once when the package loads
FP32_DEFAULT = os.environ.get("LEETREPRO_FP32_PRECISION", "tf32")


def default_fp32_precision() -> str:
    p = FP32_DEFAULT
    if p not in FP32_PRECISIONS:
        raise ValueError(f"LEETREPRO_FP32_PRECISION={p!r}; use one of {FP32_PRECISIONS}")
    return p


def dot_precision(dtype: torch.dtype, fp32_precision: str | None) -> str:
    """The ``input_precision`` of the kernels' ``tl.dot`` on fp32 operands for this input dtype."""
    p = default_fp32_precision() if fp32_precision is None else fp32_precision
    if p not in FP32_PRECISIONS:
        raise ValueError(f"fp32_precision={p!r}; use one of {FP32_PRECISIONS}")
    # half-precision inputs: the fp32 state products stay on tensor cores in tf32
    return p if dtype == torch.float32 else "tf32"


def staged(B, C, V, gamma):
    """Contiguous inputs and the per-head decay as every kernel reads it: float64 ``(H,)`` λ on the
    inputs' device, or None for the 0-1 mask. One encoding for all kernels; each derives what its
    arithmetic needs in the kernel: log λ in fp32 (Triton kernels, which raise λ to powers), or λ
    rounded to fp32 with the remainder λ/that − 1 (kernels that multiply a state by λ once per
    token: λ near 1 rounded to fp32 is off by up to 3e-8, which compounds to 1e-4 over 4096
    tokens unless the remainder is folded back)."""
    B, C, V = B.contiguous(), C.contiguous(), V.contiguous()
    if gamma is None:
        return B, C, V, None
    return B, C, V, gamma.to(device=V.device, dtype=torch.float64).contiguous()


def rows_contiguous(t: torch.Tensor | None) -> torch.Tensor | None:
    """t as the kernels address it (rows through strides, each row's entries adjacent): t itself
    unless its last dimension is strided, then a copy."""
    if t is None or t.stride(-1) == 1 or t.numel() == 0:
        return t
    return t.contiguous()


def same_rows(x: torch.Tensor, y: torch.Tensor | None):
    """x and y (None or shaped like x) in one layout the kernel addresses by strides: the last
    dimension contiguous, y's strides x's; copies only where that does not already hold."""
    x = rows_contiguous(x)
    if y is None:
        return x, y
    if y.stride() != x.stride():
        x, y = x.contiguous(), y.contiguous()
    return x, y


def staged_state(state: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor | None:
    """An initial state (checked by the API) as the kernels read it: float32, contiguous."""
    if state is None:
        return None
    return state.to(device=like.device, dtype=torch.float32).contiguous()


def segment_rows(n: int, lanes: int, block_n: int, slots: int, min_rows: int = 0) -> int:
    """Rows per segment when each lane's N rows may be cut into segments chained through their
    states (Chunk, LA): N whole once the lanes alone fill the GPU's ``slots`` (programs it runs at
    once: SMs × programs per SM) twice over; below that, the fewest segments per lane whose
    programs fill the waves they need (:func:`wave_pieces`), no shorter than ``min_rows`` rows.
    Measured (``probes.segments``, NOTES.md "Chunk at batch 1: how many segments"): a partly
    empty wave costs more than a longer chain."""
    if lanes >= 2 * slots:
        return n
    pieces = wave_pieces(lanes, slots)
    if min_rows:
        pieces = max(1, min(pieces, n // min_rows))
    return rows_for_pieces(n, pieces, block_n)


def wave_pieces(lanes: int, slots: int, fill: float = 0.9) -> int:
    """The fewest pieces p per lane for which the lanes·p programs use at least ``fill`` of the
    program slots of the waves of ``slots`` programs they need (16 lanes on 132 slots: 8; 32: 4;
    128: 1; 192: 2)."""
    p = 1  # p = slots at the latest: then the programs fill whole waves
    while lanes * p < fill * slots * cdiv(lanes * p, slots):
        p += 1
    return p


def rows_for_pieces(n: int, pieces: int, block_n: int) -> int:
    """Rows per segment that cut N rows into about ``pieces`` segments (1: N whole), a multiple
    of the row block."""
    return n if pieces <= 1 else max(block_n, cdiv(cdiv(n, pieces), block_n) * block_n)


def cdiv(a: int, b: int) -> int:
    """⌈a / b⌉ for positive integers (grid sizes, block counts)."""
    return -(-a // b)


def next_pow2(x: int, minimum: int = 16) -> int:
    return max(minimum, 1 << max(0, (x - 1).bit_length()))


def kernel_source(name: str) -> str:
    """Path of a file of the kernel package (``leetrepro/kernels/``): the CUDA sources that torch's
    extension builder compiles on first use."""
    return os.path.join(KERNELS, name)


class NoTriton:
    """Stands in for a kernel module where Triton (or the part of it a kernel needs) does not
    import: any use raises a RuntimeError that says so, at call time, not at import."""

    class Error(Exception):
        """(never raised: what ``except`` clauses name where Triton's own errors are missing)"""

    def __init__(self, err: ImportError):
        self._err = err

    def __getattr__(self, name):
        raise RuntimeError(f"this method needs Triton ({self._err}); `pip install triton` or use "
                           f"its _torch twin")

    def __call__(self, *args, **kwargs):
        return self.__getattr__("__call__")


def on_row_kernels(x: torch.Tensor, kernels) -> bool:
    """Whether a pass around the operator runs on its Triton ``kernels`` module: a CUDA tensor x,
    or Triton's interpreter asked for by name (``LEETREPRO_ROWS_KERNEL=1`` beside
    ``TRITON_INTERPRET=1``: the CPU tests), never by default on a CPU, where PyTorch's passes
    are as fast; never where the module did not import (:class:`NoTriton`)."""
    if isinstance(kernels, NoTriton):
        return False
    return x.is_cuda or (os.environ.get("TRITON_INTERPRET") == "1"
                         and os.environ.get("LEETREPRO_ROWS_KERNEL") == "1")


def strided(t: torch.Tensor | None) -> tuple | None:
    """A tensor as the kernels take it: ``(t, batch stride, head stride, row stride)`` of a
    (batch, heads, N, ·) view (elements; its last dimension contiguous), or None."""
    return None if t is None else (t, *t.stride()[:3])


def interpreted_bf16(dtype: torch.dtype) -> bool:
    """Whether ``dtype`` is bf16 under Triton's interpreter (``TRITON_INTERPRET=1``), which
    computes bf16 ``tl.dot`` wrongly."""
    return dtype == torch.bfloat16 and os.environ.get("TRITON_INTERPRET") == "1"


def refuse_interpreted_bf16(dtype: torch.dtype, abbr: str) -> None:
    """Triton's interpreter (``TRITON_INTERPRET=1``, how the kernels run on a CPU) computes bf16
    ``tl.dot`` wrongly: refuse rather than return wrong numbers."""
    if interpreted_bf16(dtype):
        raise ValueError(f"{abbr} cannot run bfloat16 under TRITON_INTERPRET=1: Triton's "
                         f"interpreter computes bf16 dot products wrongly. Use float16/float32 "
                         f"there, a GPU for bf16, or a PyTorch method")


#: compiled kernels by launch key (see :func:`launch`)
_COMPILED: dict = {}
#: per kernel: its parameters' names in order, whether Triton's compiled-kernel object still takes
#: them positionally in that order (checked on its first compilation; see :func:`launch`), the names' set
_ORDER: dict = {}


def launch(kernel, grid: tuple, arguments: dict, key=None, **options) -> None:
    """``kernel[grid](**arguments, **options)``: every parameter of the kernel, constexprs included,
    passed by name (a TypeError names any missing or unknown one: on a key's first launch, and on
    any launch whose count of arguments is wrong), with Triton's per-call argument
    binding (host time on every call) skipped after the first call of a key: the compiled kernel is
    kept and launched with the arguments in the kernel's own parameter order.

    That replay rests on Triton's ``CompiledKernel[grid](*args)`` taking every parameter in
    declaration order. The first compilation of each kernel checks it (the compiled source's
    signature must list the kernel's parameter names in that order); where a Triton release no
    longer offers it, every launch takes the binding path, with one warning per kernel, never a
    wrong call.

    ``key``: the caller's hashable stand-in for everything Triton specialises on (each tensor's
    dtype and 16-byte alignment, each integer's value where Triton specialises it: equal to 1 or
    divisible by 16, the constexprs, the options, the device): its cached launch plan. Without
    one, the key is built argument by argument. On the Triton release whose runner was read
    (:data:`DIRECT_TRITON`) the replay calls the compiled kernel's launcher as that runner does
    (:func:`_direct`), skipping its per-call lookups (host time, NOTES.md)."""
    order = _ORDER.get(kernel)
    if order is None:
        order = _ORDER[kernel] = [tuple(kernel.arg_names), None, frozenset(kernel.arg_names)]
    # the names checked on every launch without a key and on a key's first; a replay, whose
    # arguments come from the code that made its key, by their count
    given = key is not None
    if not given or len(arguments) != len(order[0]):
        _check_names(kernel, arguments, order)
    if not given:
        values = arguments.values()
        key = (_specialised(values), tuple(options.items()),
               next(a.device for a in values if isinstance(a, torch.Tensor)))
    key = (kernel, len(grid), key)
    entry = _COMPILED.get(key) if order[1] else None
    if entry is None:  # (the interpreter returns no compiled kernel: it always comes here)
        if given:
            _check_names(kernel, arguments, order)
        compiled = kernel[grid](**arguments, **options)
        if order[1] is None and compiled is not None:
            order[1] = _positional(compiled, order[0])
        if order[1]:
            if len(_COMPILED) >= 4096:
                _COMPILED.clear()
            _COMPILED[key] = (compiled, _direct(compiled))
        return
    compiled, direct = entry
    grid = tuple(grid) + (1,) * (3 - len(grid))
    args = [arguments[n] for n in order[0]]
    if direct is not None and _no_hooks(direct[3]):
        stream = torch._C._cuda_getCurrentRawStream(torch.cuda.current_device())
        if direct[4] is not None and C_LAUNCH:
            direct[4](grid, stream, args)
            return
        # Triton's runner, less what it does per call that does not depend on the call (with no
        # launch hook registered, it passes them and their metadata for nothing to call)
        direct[0](*grid, stream, direct[1], direct[2], None, None, None, *args)
        return
    compiled[grid](*args)


#: arguments whose value is what Triton specialises on, told apart by their type alone
_SCALARS = frozenset((int, bool, float, str, type(None)))


def _specialised(values) -> tuple:
    """What Triton specialises on in each of ``values``: a tensor's dtype and 16-byte alignment,
    the value of anything else, element by element in a tuple (a tensor with its strides). The
    types are checked before ``isinstance(·, torch.Tensor)``, which goes through the tensor's
    metaclass: a keyless launch takes about 30 values, and that check on each was half its
    key's host time."""
    out = []
    for a in values:
        kind = type(a)
        if kind in _SCALARS:
            out.append(a)
        elif kind is tuple:
            out.append(_specialised(a))
        elif isinstance(a, torch.Tensor):
            out.append((a.dtype, a.data_ptr() % 16 == 0))
        elif isinstance(a, tuple):  # (a named tuple: its fields)
            out.append(_specialised(a))
        else:
            out.append(a)
    return tuple(out)


def _check_names(kernel, arguments: dict, order) -> None:
    """A TypeError naming the parameters of ``kernel`` missing from ``arguments`` and the names
    it does not have. (A replayed launch checks only their count: its key's first launch checked
    the names, and its arguments come from the same code.)"""
    if arguments.keys() != order[2]:
        missing = [n for n in order[0] if n not in arguments]
        unknown = [n for n in arguments if n not in order[0]]
        raise TypeError(f"{getattr(kernel, '__name__', kernel)}: arguments missing {missing}, "
                        f"unknown {unknown}")


#: the Triton releases whose compiled kernels :func:`_direct` launches as their runner does
DIRECT_TRITON = ("3.6.",)


def _direct(compiled):
    """``(launcher, function, packed metadata, runtime knobs)`` of a compiled kernel, to be called
    as Triton's own runner calls them (``CompiledKernel.__getitem__``: grid, stream, function,
    packed metadata, launch metadata, the two launch hooks, then the arguments), without the
    closure, device and driver lookups it makes per call; None on a Triton release whose runner
    has not been read (:data:`DIRECT_TRITON`) or where those attributes moved: then every launch
    takes the runner."""
    import triton
    if not triton.__version__.startswith(DIRECT_TRITON):
        return None
    try:
        from triton import knobs
        compiled._init_handles()
        return (compiled.run, compiled.function, compiled.packed_metadata, knobs.runtime,
                CLaunch.of(compiled))
    except (AttributeError, ImportError):
        return None


#: whether a replayed launch calls the compiled launcher's C entry itself (:class:`CLaunch`);
#: False: through Triton's Python wrapper, as its runner does (an A/B switch)
C_LAUNCH = True


class CLaunch:
    """A compiled kernel's launch through its C launcher, as Triton's Python launcher
    (``CudaLauncher.__call__`` and the wrapper that expands TMA descriptors,
    ``wrap_handle_tensordesc``, on the release :data:`DIRECT_TRITON` names) makes it, less its
    per-call work that depends on nothing the call changes: the scratch buffers it allocates
    (none for a kernel that asks for none: the only kernels taken here), and each TMA
    descriptor's encoding (``make_tensordesc_arg``: the driver's ``cuTensorMapEncodeTiled`` and
    its Python around it, about 5 µs a descriptor, five or six a Hopper launch). An encoding
    depends only on the tensor's address, shape, strides and padding and the kernel's metadata
    for that parameter, so each parameter keeps its encodings by those (a training loop's
    allocator hands the same addresses back step after step). ``of`` returns None wherever the
    launcher is not built as read: then Triton's own path."""

    __slots__ = ("c_launch", "head", "cuts", "metas", "maps")

    #: encodings kept a descriptor parameter (a kernel's plans × the addresses a loop reuses)
    KEEP = 64

    def __init__(self, c_launch, head: tuple, positions: tuple, metas: tuple):
        self.c_launch = c_launch
        self.head = head          # function, cooperative, PDL, the two scratch buffers,
        # packed metadata, launch metadata and the two hooks (None: no hook to call)
        self.cuts = positions     # the descriptor parameters' places among the arguments
        self.metas = metas        # and Triton's metadata of each (swizzle, block, dtype)
        self.maps = tuple({} for _ in positions)

    @classmethod
    def of(cls, compiled) -> "CLaunch | None":
        import triton
        if not triton.__version__.startswith(DIRECT_TRITON):
            return None  # (another release's launcher takes other arguments: Triton's path)
        try:
            return cls._of(compiled)
        except (AttributeError, TypeError, ValueError):  # (a launcher not built as read)
            return None

    @classmethod
    def _of(cls, compiled) -> "CLaunch | None":
        run = compiled.run
        if run.global_scratch_size or run.profile_scratch_size or run.num_ctas != 1:
            return None  # (scratch allocated per call, clusters: Triton's path)
        launcher, positions, metas = run.launch, (), ()
        code = getattr(launcher, "__code__", None)
        if code is not None:  # Triton's wrapper around the C entry: its closure's cells
            cells = dict(zip(code.co_freevars, (c.cell_contents for c in launcher.__closure__)))
            if not {"launcher", "tensordesc_indices", "tensordesc_meta"} <= cells.keys():
                return None
            positions = tuple(sorted(cells["tensordesc_indices"]))
            metas = tuple(cells["tensordesc_meta"])
            if len(metas) != len(positions) or any(m is None for m in metas):
                return None
            launcher = cells["launcher"]
        return cls(launcher, (compiled.function, run.launch_cooperative_grid, run.launch_pdl,
                              None, None, compiled.packed_metadata, None, None, None),
                   positions, metas)

    def __call__(self, grid: tuple, stream: int, args: list) -> None:
        if self.cuts:
            args = self.expanded(args)
        self.c_launch(*grid, stream, *self.head, *args)

    def expanded(self, args: list) -> list:
        """``args`` with each descriptor replaced by its encoding, shape and strides, as
        ``make_tensordesc_arg`` makes them."""
        out, start = [], 0
        for place, meta, kept in zip(self.cuts, self.metas, self.maps):
            out += args[start:place]
            desc = args[place]
            key = (desc.base.data_ptr(), tuple(desc.shape), tuple(desc.strides), desc.padding)
            made = kept.get(key)
            if made is None:
                if len(kept) >= self.KEEP:
                    kept.clear()
                made = kept[key] = _encoded(desc, meta)
            out += made
            start = place + 1
        out += args[start:]
        return out


def _encoded(desc, meta) -> list:
    """Triton's own expansion of one TMA descriptor argument (``make_tensordesc_arg``)."""
    from triton.backends.nvidia.driver import make_tensordesc_arg
    return make_tensordesc_arg(desc, meta)


def _no_hooks(runtime) -> bool:
    """Whether Triton has no launch hook to call (none set, or empty chains of hooks)."""
    for hook in (runtime.launch_enter_hook, runtime.launch_exit_hook):
        if hook is not None and getattr(hook, "calls", True):
            return False
    return True


def _positional(compiled, names: tuple) -> bool:
    """Whether ``compiled[grid](*args)`` takes the kernel's parameters in ``names``' order (the
    compiled source's signature says so), warning once where it does not."""
    try:
        ok = tuple(compiled.src.signature) == names and callable(compiled[(1, 1, 1)])
    except Exception:  # an API that moved: the binding path, which always works
        ok = False
    if not ok:
        import warnings
        warnings.warn("this Triton's compiled kernels do not take their parameters positionally as "
                      "leetrepro's fast launch expects: every launch binds its arguments (slower "
                      "host path, same results)", RuntimeWarning, stacklevel=3)
    return ok

