"""``%load_ext workbench`` stays light: the engines need torch, the kernel does not (yet)."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.engines  # a fresh interpreter: a subprocess


def test_load_ext_workbench_imports_no_torch() -> None:
    code = (
        "import sys\n"
        "from IPython.testing.globalipapp import start_ipython\n"
        "shell = start_ipython()\n"
        "shell.run_line_magic('load_ext', 'workbench')\n"
        "assert 'wb' in shell.magics_manager.magics['line']\n"
        "print([m for m in ('torch', 'plotly', 'ipywidgets') if m in sys.modules])\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip().splitlines()[-1] == "[]"
