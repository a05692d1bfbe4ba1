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


def _pins() -> list[tuple[str, str, str]]:
    """(name, version, marker) of every pin in constraints.txt."""
    pins = []
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        spec, _, marker = line.partition(";")
        name, _, version = spec.strip().partition("==")
        pins.append((name.lower().replace("_", "-"), version.strip(), marker.strip()))
    return pins


def _applies(marker: str, python: str) -> bool:
    from packaging.markers import Marker

    env = {"python_full_version": python, "python_version": ".".join(python.split(".")[:2])}
    return not marker or Marker(marker).evaluate(env)


def test_each_python_gets_exactly_one_pin_per_package() -> None:
    """Debian 12's 3.11.2 and the later Pythons each see one pin of every package."""
    for python in ("3.11.0", "3.11.2", "3.11.7", "3.12.1", "3.13.0"):
        seen: dict[str, int] = {}
        for name, _, marker in _pins():
            if _applies(marker, python):
                seen[name] = seen.get(name, 0) + 1
        assert {n: k for n, k in seen.items() if k != 1} == {}, python


def test_pins_installed_here_admit_every_python_they_apply_to() -> None:
    """A pin whose Requires-Python excludes a Python it applies to (soupsieve 4 needs
    3.11.5) leaves pip there with no candidate: it backtracks for many minutes instead of
    failing. Checked for every pinned distribution installed in this environment."""
    import importlib.metadata as md

    from packaging.specifiers import SpecifierSet

    installed = {d.metadata["Name"].lower().replace("_", "-"): d for d in md.distributions()}
    wrong = []
    for name, version, marker in _pins():
        dist = installed.get(name)
        if dist is None or dist.version != version:
            continue  # this environment did not take this pin (another Python's, an extra)
        requires = dist.metadata.get("Requires-Python") or ""
        for python in ("3.11.0", "3.11.2", "3.11.7", "3.12.1", "3.13.0"):
            if _applies(marker, python) and not SpecifierSet(requires).contains(python):
                wrong.append(f"{name}=={version} (Requires-Python {requires}) for {python}")
    assert wrong == [], wrong
