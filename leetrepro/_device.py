"""Which device this is: its name, the short tag that names its folders (``data/h100``), and its
number of streaming multiprocessors. Queried once per device and cached."""
from __future__ import annotations

import functools
import platform
import threading
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

    ``torch.compile(mode="reduce-overhead")`` (cudagraph trees) warms each graph up with every
    allocation of the calling thread going to the graph's pool, and refuses to record while any
    tensor of that pool outlives the run without being one of the graph's outputs. So on a GPU
    ``make`` runs in a thread of its own (its allocations in the ordinary pool; a cache miss
    only, a fraction of a millisecond), on that thread's default stream after the caller's
    stream's work, which then waits for it. During a capture (``torch.cuda.graph``) ``make()``
    runs as it is (callers keep nothing made then)."""
    device = torch.device(device)
    if device.type != "cuda" or torch.cuda.is_current_stream_capturing():
        return make()
    # (the caller's device by number: a new thread's current device is the first GPU)
    device = torch.device("cuda", _index(device))
    current = torch.cuda.current_stream(device)
    ready = torch.cuda.Event()
    ready.record(current)
    box: dict = {}

    def work():
        try:
            with torch.cuda.device(device):
                stream = torch.cuda.current_stream(device)
                stream.wait_event(ready)
                box["value"] = make()
                done = torch.cuda.Event()
                done.record(stream)
                box["done"] = done
        except BaseException as err:  # (raised again in the caller's thread)
            box["error"] = err

    worker = threading.Thread(target=work, name="leetrepro-persistent")
    worker.start()
    worker.join()
    if "error" in box:
        raise box["error"]
    current.wait_event(box["done"])
    value = box["value"]
    for t in value if isinstance(value, tuple) else (value,):
        if isinstance(t, torch.Tensor) and t.is_cuda:
            t.record_stream(current)  # (freed later: not reused before the caller's stream is done)
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
