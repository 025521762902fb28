"""The notebooks as a researcher opens them: through a Jupyter server (a kernel session started
the way JupyterLab starts one, in the notebook's folder), through papermill, and re-rendered from
the committed data on a machine without a GPU; none of them changes what git tracks."""
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
import torch

from leetrepro._paths import ROOT
from leetrepro.reproduce.tables import output_root

from conftest import git_status

SCRATCH = os.path.join(ROOT, "scratch")


def test_a_notebook_writes_under_scratch_unless_told_otherwise(tmp_path):
    assert output_root(None) == SCRATCH
    assert output_root(str(tmp_path)) == str(tmp_path)
    with open(os.path.join(ROOT, ".gitignore")) as f:
        assert "/scratch/" in f.read().split()  # never in git's view


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _api(port, token, path, method="GET", body=None):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method,
                                 data=None if body is None else json.dumps(body).encode(),
                                 headers={"Authorization": f"token {token}",
                                          "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read() or b"null")


@pytest.mark.slow
def test_a_notebook_run_in_a_jupyter_kernel_session_leaves_the_tree_untouched(tmp_path):
    """A Jupyter server on the loopback opens ``notebooks/claims.py`` (jupytext makes it a
    notebook), starts its kernel session as JupyterLab does (working directory: notebooks/),
    and every code cell runs as the parameter cell has it. No GPU here: the claims are
    re-rendered from data/h100; the outputs land under scratch/, git's view is unchanged."""
    pytest.importorskip("jupyter_server")
    pytest.importorskip("jupytext")  # the server's contents manager reads the .py as a notebook
    from jupyter_client import BlockingKernelClient
    if torch.cuda.is_available():
        pytest.skip("with a GPU the notebook measures (minutes): run on a machine without one")
    before = git_status()
    port, token, runtime = _free_port(), "leetrepro-test", tmp_path / "runtime"
    env = dict(os.environ, PYTHONPATH=ROOT, MPLBACKEND="Agg", JUPYTER_RUNTIME_DIR=str(runtime))
    log = open(tmp_path / "server.log", "w")
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyter_server", "--ServerApp.ip=127.0.0.1",
         f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
         f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={ROOT}",
         "--ServerApp.open_browser=False", "--allow-root"],
        env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
    client = None
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                _api(port, token, "/api/status")
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    log.flush()
                    pytest.fail("the Jupyter server did not start:\n"
                                + (tmp_path / "server.log").read_text()[-3000:])
                time.sleep(0.5)
        # jupytext's contents manager serves the .py source as a notebook, as the UI opens it
        model = _api(port, token, "/api/contents/notebooks/claims.py?type=notebook&content=1")
        assert model["type"] == "notebook"
        cells = [c["source"] for c in model["content"]["cells"] if c["cell_type"] == "code"]
        session = _api(port, token, "/api/sessions", "POST",
                       {"path": "notebooks/claims.py", "type": "notebook",
                        "kernel": {"name": "python3"}})
        kernel = session["kernel"]["id"]
        connection = next(runtime.glob(f"kernel-{kernel}*.json"))
        client = BlockingKernelClient(connection_file=str(connection))
        client.load_connection_file()
        client.start_channels()
        client.wait_for_ready(timeout=120)
        # (JupyterLab's kernel works in the notebook's folder: a relative "." would be notebooks/)
        reply = client.execute_interactive(
            "import os; assert os.path.realpath(os.getcwd()) == "
            f"os.path.realpath({os.path.join(ROOT, 'notebooks')!r}), os.getcwd()", timeout=60)
        assert reply["content"]["status"] == "ok", reply["content"]
        for source in cells:
            reply = client.execute_interactive(source, timeout=300, output_hook=lambda m: None)
            assert reply["content"]["status"] == "ok", (source[:200], reply["content"])
        reply = client.execute_interactive("assert os.path.realpath(data_dir) == os.path.realpath("
                                           f"{os.path.join(SCRATCH, 'data', 'h100')!r}"
                                           "), data_dir", timeout=60)
        assert reply["content"]["status"] == "ok", reply["content"]
    finally:
        if client is not None:
            client.stop_channels()
        server.terminate()
        server.wait(timeout=60)
        log.close()
    assert os.path.exists(os.path.join(SCRATCH, "data", "h100", "claims.csv"))
    if before is not None:
        assert git_status() == before


def test_run_notebook_names_the_notebooks_when_asked_for_one_that_is_not_there():
    """(The README's Notebooks block runs ``run_notebook("claims", gpu="h100")`` itself.)"""
    from leetrepro.reproduce.execute import run_notebook
    with pytest.raises(ValueError, match="no notebook 'nope'.*claims"):
        run_notebook("nope")
