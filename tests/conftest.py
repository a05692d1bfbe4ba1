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
