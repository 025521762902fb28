"""Which device this is: its name, the short tag that names its folders (``data/h100``), and its
number of streaming multiprocessors. Queried once per device and cached."""
from __future__ import annotations

import functools
import platform
from typing import Callable, TypeVar

import torch

T = TypeVar("T")


def device_name(device) -> str:
    """``"NVIDIA H100 80GB HBM3"``, or ``"CPU (x86_64)"``."""
    device = torch.device(device)
    if device.type == "cuda":
        return _cuda_name(_index(device))
    return f"CPU ({platform.processor() or platform.machine()})"


def gpu_tag(device="cuda") -> str:
    """Short folder name for a device: "NVIDIA H100 80GB HBM3" -> "h100", a CPU -> "cpu"."""
    device = torch.device(device)
    if device.type != "cuda":
        return "cpu"
    return _tag(_index(device))


def sm_count(device) -> int:
    """Streaming multiprocessors of a CUDA device (4 elsewhere: the interpreter's stand-in)."""
    device = torch.device(device)
    if device.type != "cuda":
        return 4
    return _sm_count(_index(device))


#: shared memory one program may use on an sm_90 GPU (H100, H200): 227 KiB, opted into beyond
#: the default 48 KiB. The launch tables (Chunk, LA) are sized to fit it.
SM90_SHARED_BYTES = 227 * 1024


def persistent(make: Callable[[], T], device) -> T:
    """``make()``, for tensors a module keeps across calls (a cache), allocated where no CUDA
    graph's private memory pool takes them.

    ``torch.compile(mode="reduce-overhead")`` (cudagraph trees) runs each graph once on a stream
    of its own whose allocations go to the graph's pool, and refuses to record while any tensor
    of that pool outlives the run without being one of the graph's outputs. So where the current
    stream is not the device's default one, ``make`` runs on the default stream (after the
    current stream's work, which it may read), and the current stream then waits for it. During
    a capture (``torch.cuda.graph``) nothing may run outside the captured stream: ``make()`` runs
    as it is there (callers keep nothing made during a capture, :func:`leetrepro.methods.chunk.\
zeroed_counters`)."""
    device = torch.device(device)
    if device.type != "cuda" or torch.cuda.is_current_stream_capturing():
        return make()
    current = torch.cuda.current_stream(device)
    default = torch.cuda.default_stream(device)
    if current == default:
        return make()
    default.wait_stream(current)
    with torch.cuda.stream(default):
        value = make()
    current.wait_stream(default)
    for t in value if isinstance(value, tuple) else (value,):
        if isinstance(t, torch.Tensor) and t.is_cuda:
            t.record_stream(current)  # (freed later: not reused before the current stream is done)
    return value


def _index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


@functools.lru_cache(maxsize=None)
def _cuda_name(index: int) -> str:
    return torch.cuda.get_device_name(index)


@functools.lru_cache(maxsize=None)
def _tag(index: int) -> str:
    words = [w for w in _cuda_name(index).replace("NVIDIA", "").split()
             if w.lower() not in ("geforce", "tesla")]
    return (words[0] if words else "gpu").lower()


@functools.lru_cache(maxsize=None)
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count
