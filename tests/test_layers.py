"""The core layers stay free of the notebook stack (DESIGN.md: layers)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

FORBIDDEN = ("IPython", "ipywidgets", "ipyparallel", "plotly")
ROOT = Path(__file__).resolve().parents[1]


def _loaded_after_import(module: str) -> list[str]:
    code = (
        f"import sys, json; import {module}; "
        f"print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}})))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    "module", ["workbench", "workbench.trace", "workbench.parallel", "workbench.planner"]
)
def test_core_layers_do_not_import_the_notebook_stack(module: str) -> None:
    if not (ROOT / module.replace(".", "/")).exists():
        pytest.skip(f"{module} does not exist yet")
    loaded = _loaded_after_import(module)
    assert [m for m in FORBIDDEN if m in loaded] == []


def test_planner_needs_no_torch() -> None:
    if not (ROOT / "workbench/planner").exists():
        pytest.skip("planner does not exist yet")
    assert "torch" not in _loaded_after_import("workbench.planner")
