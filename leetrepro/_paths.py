"""Where the package finds the measured data that lives beside its code (``data/``, of which an
installed wheel carries the tables ``method="auto"`` and the launchers read).

Resolved from this file's own location, never from ``sys.path``: a checkout uses its own
``data/`` even when another copy of the package is installed on the machine. Installed, it lives
inside the package (``leetrepro/data``); in a source checkout, beside it (the repository root).
The kernels are a subpackage (``leetrepro/kernels``) in both.
"""
from __future__ import annotations

import os

PACKAGE = os.path.dirname(os.path.abspath(__file__))
#: the repository root of a source checkout (in an installed wheel: the site-packages folder)
ROOT = os.path.dirname(PACKAGE)


def resource(name: str) -> str:
    """The folder ``name`` (``"data"``) of this copy of the package: inside the package when
    installed, else at the repository root."""
    inside = os.path.join(PACKAGE, name)
    return inside if os.path.isdir(inside) else os.path.join(ROOT, name)


def data(*parts: str) -> str:
    """A path under this copy's ``data/`` folder."""
    return os.path.join(resource("data"), *parts)
