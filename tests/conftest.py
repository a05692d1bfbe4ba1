"""Shared fixtures. Every test run uses private IPython/Jupyter state directories."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

# Set before anything imports IPython/ipyparallel: they read these at import/start time.
if "IPYTHONDIR" not in os.environ:
    _state = Path(tempfile.mkdtemp(prefix="wb-test-state-"))
    os.environ["IPYTHONDIR"] = str(_state / "ipython")
    os.environ["JUPYTER_CONFIG_DIR"] = str(_state / "jupyter" / "config")
    os.environ["JUPYTER_DATA_DIR"] = str(_state / "jupyter" / "data")
    os.environ["JUPYTER_RUNTIME_DIR"] = str(_state / "jupyter" / "runtime")
os.environ.setdefault("OMP_NUM_THREADS", "1")
# The checkpoint key (checkpoint_trust) of the test run, not the user's own.
os.environ.setdefault("WORKBENCH_STATE_DIR", tempfile.mkdtemp(prefix="wb-test-key-"))


import pytest


@pytest.fixture(scope="session")
def cluster():  # type: ignore[no-untyped-def]
    """One 2-rank gloo cluster shared by every test that needs engines; always stopped."""
    from workbench.cluster import Cluster

    c = Cluster(n=2, backend="gloo", init_timeout=60)
    c.start_sync()
    try:
        yield c
    finally:
        c.stop_sync()


@pytest.fixture(scope="session")
def ipython_shell():  # type: ignore[no-untyped-def]
    """A real IPython shell with the workbench extension loaded."""
    from IPython.testing.globalipapp import start_ipython

    shell = start_ipython()
    shell.run_line_magic("load_ext", "workbench")
    return shell
