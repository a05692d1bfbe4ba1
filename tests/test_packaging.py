"""environment.yml stays in sync with pyproject.toml; the constraints pin torch."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~\[ ;]", requirement.strip(), maxsplit=1)[0].lower()


def test_environment_yml_lists_every_runtime_dependency() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    runtime = {_name(r): r.replace(" ", "") for r in project["dependencies"]}
    lines = (ROOT / "environment.yml").read_text().splitlines()
    pip_reqs = [ln.strip()[2:].strip() for ln in lines if ln.strip().startswith("- ")]
    listed = {_name(r): r.replace(" ", "") for r in pip_reqs if not r.startswith(("-e", "pip"))}
    missing = {n: spec for n, spec in runtime.items() if listed.get(n) != spec}
    assert missing == {}, f"environment.yml differs from pyproject.toml for {missing}"


def test_metadata_keeps_torch_loose_and_constraints_pin_it() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    torch_req = next(r for r in project["dependencies"] if _name(r) == "torch")
    assert "==" not in torch_req
    pins = (ROOT / "constraints.txt").read_text().splitlines()
    assert "torch==2.13.0" in pins
