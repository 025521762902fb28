"""The computation methods, one module per family, all in one registry.

``available()`` lists them; ``register`` adds your own; ``get`` looks one up by name or abbreviation.
"""
from ..registry import Method, available, get, methods, register, unregister
from . import (block_based, causal_dot_product, chunk, eca, fleet, lightning,  # noqa: F401
               recursion, vanilla)  # (importing registers them)

__all__ = ["Method", "available", "get", "methods", "register", "unregister"]
