"""The committed walkthrough notebooks are their sources in notebooks/src/, cell for cell."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _builder():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("notebook_build", ROOT / "notebooks/build.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


BUILD = _builder()


def test_every_notebook_has_a_source() -> None:
    notebooks = {p.stem for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")}
    sources = {p.stem for p in BUILD.sources()}
    assert notebooks == sources


@pytest.mark.parametrize("source", BUILD.sources(), ids=lambda p: p.stem)
def test_notebook_matches_its_source(source: Path) -> None:
    assert BUILD.differences(source) == []


def test_a_changed_source_is_reported(tmp_path: Path) -> None:
    source = BUILD.sources()[0]
    changed = tmp_path / source.name
    changed.write_text(source.read_text().replace("%load_ext workbench", "%load_ext other", 1))
    original = BUILD.notebook_path
    try:
        BUILD.notebook_path = lambda s: original(source)
        assert BUILD.differences(changed) != []
    finally:
        BUILD.notebook_path = original
