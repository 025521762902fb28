"""GPU kernel sources: Triton kernels (``*.py``) and CUDA (``*.cu``). Installed as
``leetrepro.kernels``; the registered methods in ``leetrepro.methods`` wrap them."""
