"""Investigation tools: measurements that explain a number rather than record one for a table.

* :mod:`~leetrepro.probes.ab`: a switch of the package on and off in one process, the same
  calls' bits compared and their host, eager and graph times interleaved (a change's A/B);
* :mod:`~leetrepro.probes.launches`: the kernels and ATen operators one eager call launches on
  a GPU, read on any machine with that GPU's tables (a test holds the counts);
* :mod:`~leetrepro.probes.ncu`: Nsight Compute over named cells (DRAM bytes, issue slots,
  stalls), the profile behind a "what limits this cell" entry of NOTES.md;
* :mod:`~leetrepro.probes.regs`: the kernels compiled for sm_90 without a GPU, their registers
  and spills (CI asserts them);
* :mod:`~leetrepro.probes.segments`: how many segments N is cut into at batch 1, swept;
* :mod:`~leetrepro.probes.sizes`: the kernels' functions, their parameters and lines against the
  ceilings a test holds (read from the source).

They stand on the measuring library (:mod:`leetrepro.bench`: one timing primitive, one provenance
record) and nothing imports them: the package, the Makefile's tables and the notebooks run
without them.
"""
