"""The correctness matrix on a GPU: ``pytest -m gpu`` on a host with a CUDA GPU.

The cases are :func:`leetrepro.bench.gpu_check.matrix`'s, the ones ``make gpu-check`` records to
``data/<gpu>/correctness.csv``: every registered method × dtype × mask × shape against the
float64 oracle (each output buffer poisoned with NaN first, kernels run twice for determinism),
the gradients with every subset of the inputs requiring grad, states in and out, the layouts
models hand the operator. ``LEETREPRO_GPU_MATRIX`` picks how much:

* ``quick`` (default, minutes): the small shapes (``gpu_check --quick``), and Chunk's Hopper kernel
  forced at two head shapes (64/64, 128/128) with its fewest value columns, on an sm_90 GPU;
* ``full`` (about an hour): ``make gpu-check``'s whole matrix, then the head shapes models use
  (``--heads-only``).

One test per case, named ``<method>-<dtype>-<what>-B{}-H{}-N{}-r{}-d{}``; a failure prints the
case's rows. Without a GPU (or under ``TRITON_INTERPRET=1``) the module is one skipped test.
Several processes may share the GPU (``-n 8``: the matrix is mostly compile time): a case that
needs gigabytes (``Case.large``) runs alone (an exclusive lock across the processes; the other
cases hold it shared), and every case hands its cached memory back when it ends.
"""
import contextlib
import fcntl
import os
import tempfile

import pytest
import torch

GPU = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1"
MATRIX = os.environ.get("LEETREPRO_GPU_MATRIX", "quick")
pytestmark = [pytest.mark.gpu, pytest.mark.slow]


def _cases():
    if not GPU:
        return []
    if MATRIX not in ("quick", "full"):
        raise ValueError(f"LEETREPRO_GPU_MATRIX={MATRIX!r}; use 'quick' or 'full'")
    from leetrepro.bench.gpu_check import DTYPES, matrix
    from leetrepro.methods import methods
    dtypes = [getattr(torch, d) for d in DTYPES]
    device = torch.device("cuda")
    if MATRIX == "quick":
        return matrix(methods(), dtypes, device, quick=True, hopper_heads=True)
    return (matrix(methods(), dtypes, device)
            + matrix(methods(), dtypes, device, heads_only=True))


CASES = _cases()


@pytest.fixture(scope="module")
def meta():
    from leetrepro.bench.harness import provenance
    return provenance(torch.device("cuda"))


if not GPU:
    def test_the_gpu_matrix_needs_a_gpu():
        pytest.skip("no CUDA GPU here (or TRITON_INTERPRET=1): the GPU matrix was not run")


@contextlib.contextmanager
def _alone(large: bool):
    """A large case holds the GPU alone across the processes of this host; the others share it."""
    with open(os.path.join(tempfile.gettempdir(), "leetrepro-gpu-matrix.lock"), "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX if large else fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_gpu_matrix(case, meta):
    from leetrepro.bench.gpu_check import judged_failures
    rows = []
    with _alone(case.large):
        try:
            case.run(rows=rows, meta=meta)
        finally:
            torch.cuda.empty_cache()
    assert rows, f"{case.id} recorded no rows"
    failed = judged_failures(rows)
    assert not failed, "\n".join(
        f"{r['quantity']} {r['precision']} decay={r['decay']}: rel_err {r['rel_err']:.2e} "
        f"(tol {r['tol']:.0e}) {r['status']}" for r in failed)
