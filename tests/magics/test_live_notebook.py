"""A notebook whose ``%%wb`` cell streams: recorded by nbclient (as notebooks/build.py records
the walkthroughs) it saves today's final output only, and strict nbval passes on it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

pytestmark = [pytest.mark.engines, pytest.mark.slow]

CELLS = [
    "%load_ext workbench",
    "%wb start -n 2",
    "%%wb\nimport time\nfor i in range(4):\n    print('tick', i, flush=True)\n"
    "    time.sleep(0.4)",  # ~1.6 s: streams many times
    "%wb stop",
]


def test_a_streamed_cell_saves_and_checks_as_its_final_output(tmp_path: Path) -> None:
    from nbclient import NotebookClient

    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    nb.cells = [nbformat.v4.new_code_cell(src) for src in CELLS]
    NotebookClient(nb, timeout=600, resources={"metadata": {"path": str(tmp_path)}}).execute()
    ticks = "".join(f"tick {i}\n" for i in range(4))
    assert [dict(o) for o in nb.cells[2].outputs] == [
        {"output_type": "stream", "name": "stdout", "text": f"[rank 0]\n{ticks}[rank 1]\n{ticks}"}
    ]
    path = tmp_path / "streamed.ipynb"
    nbformat.write(nb, path)
    env = {**os.environ, "IPP_NONINTERACTIVE": "1", "PYTHONWARNINGS": "ignore"}
    checked = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--nbval",
         "--nbval-current-env", "--nbval-workbench", "-s", str(path)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert checked.returncode == 0, checked.stdout[-3000:]
    # It did stream under nbval too: nbval prints (-s) the live updates it ignores.
    assert "update_display_data" in checked.stdout
