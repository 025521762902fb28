"""The GPU kernels: Triton (``*.py``, the Hopper one in Gluon) and CUDA C++ (``*.cu``, ``*.cpp``).
They import nothing of the package but their shared tile code (``_tiles``); the launchers that
call them live one floor up, in the methods. The repository's top-level ``kernels/README.md``
indexes them."""
