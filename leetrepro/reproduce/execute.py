"""``python -m leetrepro.reproduce.execute IN.ipynb OUT.ipynb [papermill options]``: papermill's
command line (``make`` runs every notebook through it), with the notebook's kernel reached over
local IPC sockets in a private temporary folder instead of TCP ports. :func:`run_notebook` does
the same from Python, from a notebook's source.

Why: a kernel on TCP without encryption keys logs a warning into every run ("Kernel is running
over TCP without encryption"), and its ports are open to every user of the host; IPC sockets
stay on this host, owned by this user. Everything else is papermill's own command line.
"""
from __future__ import annotations

import os
import shutil
import sys
import tempfile

ENGINE = "leetrepro-ipc"


def _engine():
    from jupyter_client import AsyncKernelManager
    from papermill.engines import NBClientEngine
    from traitlets import default

    class IPCKernelManager(AsyncKernelManager):
        """A kernel whose sockets are files under a private temporary folder."""

        @default("transport")
        def _default_transport(self):
            return "ipc"

        @default("ip")
        def _default_ip(self):
            folder = tempfile.mkdtemp(prefix="leetrepro-kernel-")
            self._ipc_folder = folder
            return os.path.join(folder, "kernel")

        async def _async_cleanup_resources(self, restart: bool = False) -> None:
            await super()._async_cleanup_resources(restart)
            if not restart:
                shutil.rmtree(getattr(self, "_ipc_folder", ""), ignore_errors=True)

    class IPCEngine(NBClientEngine):
        @classmethod
        def execute_managed_notebook(cls, nb_man, kernel_name, **kwargs):
            kwargs.setdefault("kernel_manager_class", IPCKernelManager)
            return super().execute_managed_notebook(nb_man, kernel_name, **kwargs)

    return IPCEngine


def run_notebook(name: str, out_root: str | None = None, **parameters) -> str:
    """Run ``notebooks/<name>.py`` as ``make`` runs it, with papermill ``parameters``; returns
    the executed notebook's path, ``<out_root>/figures/<tag>/<name>.ipynb`` (``tag``: the
    ``gpu`` or ``tag`` parameter, else ``name``), beside the tables and figures it wrote.
    ``out_root`` None: the checkout's ``scratch/`` (:func:`leetrepro.reproduce.tables.output_root`),
    so that nothing git tracks changes. Raises papermill's error if a cell fails."""
    from .._paths import ROOT

    source = os.path.join(ROOT, "notebooks", f"{name}.py")
    if not os.path.exists(source):  # (before papermill's import: a typo answers at once)
        have = sorted(f[:-3] for f in os.listdir(os.path.dirname(source)) if f.endswith(".py"))
        raise ValueError(f"no notebook {name!r}; the notebooks: {', '.join(have)}")
    import jupytext
    import papermill
    from papermill.engines import papermill_engines

    from .tables import output_root
    root = output_root(out_root)
    folder = os.path.join(root, "figures", str(parameters.get("gpu") or parameters.get("tag")
                                               or name))
    os.makedirs(folder, exist_ok=True)
    made = os.path.join(folder, f"{name}.source.ipynb")
    jupytext.write(jupytext.read(source), made)
    out = os.path.join(folder, f"{name}.ipynb")
    papermill_engines.register(ENGINE, _engine())
    try:
        papermill.execute_notebook(made, out, parameters=dict(parameters, out_root=root),
                                   kernel_name="python3", engine_name=ENGINE, progress_bar=False,
                                   cwd=os.path.dirname(source))
    finally:
        os.remove(made)
    return out


def main(argv=None, standalone: bool = True) -> int:
    """papermill's command line on ``argv`` (default ``sys.argv[1:]``) with the IPC engine. It
    exits with papermill's status; ``standalone=False``: returns 0, or raises papermill's error
    (in a process that runs several notebooks, the tests')."""
    from papermill.cli import papermill
    from papermill.engines import papermill_engines

    papermill_engines.register(ENGINE, _engine())
    args = list(sys.argv[1:] if argv is None else argv)
    papermill.main(args + ["--engine", ENGINE], prog_name="papermill", standalone_mode=standalone)
    return 0


if __name__ == "__main__":
    sys.exit(main())
