"""The planner is standard library only: importing it loads no heavy or notebook stack."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.engines

FORBIDDEN = ("torch", "numpy", "IPython", "ipywidgets", "ipyparallel", "plotly")


def test_import_planner_loads_no_torch_or_notebook_modules():
    code = (
        "import sys, workbench.planner, workbench.planner.measured;"
        f"print([m for m in {FORBIDDEN!r} if m in sys.modules])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "[]"
