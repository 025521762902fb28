"""The tools that measure the operator, apart from the operator itself (nothing in the core
imports this package): the paper's Listing 1 (:func:`benchmark_method`) over one timing primitive
(:func:`~leetrepro.bench.harness.time_calls`) and one provenance record
(:func:`~leetrepro.bench.harness.provenance`), and the ``make`` targets' scripts:

==============================  ==========================================================
``python -m leetrepro.bench.gpu_check``   the correctness matrix on a GPU (``make gpu-check``)
``python -m leetrepro.bench.kernels``     kernel latency at the paper's shapes (``make bench-kernels``)
``python -m leetrepro.bench.floor``       distance to the memory floor, with peers (``make floor``)
``python -m leetrepro.bench.tune``        the dispatch table of ``method="auto"`` (``make tune``)
``python -m leetrepro.bench.train``       forward + backward against the floor (``make bench-train``)
``python -m leetrepro.bench.sweep``       the launch tables ``make tune`` writes (one method's configs)
``python -m leetrepro.bench.serve``       packed prompts and the decode step (``make bench-serve``)
``python -m leetrepro.bench.sp``          sequence parallelism over a host's GPUs (``make bench-sp``)
``python -m leetrepro.bench.layouts``     the layouts models hand the operator (``make layouts``)
``python -m leetrepro.bench.related``     the other papers: ECA, the kernel paper, the blog (``make eca``)
``leetrepro.bench.llm``                   Tables 7-8 inside the paper's two models
==============================  ==========================================================

The investigation tools (Nsight Compute cells, register reports, segment sweeps) stand apart, in
:mod:`leetrepro.probes`.
"""
from .harness import benchmark_method, gpu_tag, provenance, time_calls

__all__ = ["benchmark_method", "gpu_tag", "provenance", "time_calls"]
