"""When the bed's venv is made: only for a run that will use the bed, never in the unit tier
(its process guard failed whichever test was running when the venv's pip started), and the
package reinstalled when its code changed. No processes: these run in ``make test-fast``."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.multinode import bed
from tests.multinode.conftest import bed_wanted


def _item(nodeid: str, *, engines: bool) -> object:
    marker = pytest.mark.engines.mark if engines else None
    return SimpleNamespace(nodeid=nodeid, get_closest_marker=lambda name: marker)


BED_TEST = _item("tests/multinode/test_ssh.py::test_x", engines=True)
BED_UNIT = _item("tests/multinode/test_options.py::test_y", engines=False)
OTHER = _item("tests/cluster/test_cluster.py::test_z", engines=True)


def test_the_unit_tier_never_makes_the_bed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WB_TEST_TIER", "unit")
    assert not bed_wanted([BED_TEST, BED_UNIT, OTHER])  # type: ignore[list-item]


def test_only_a_selected_bed_test_makes_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WB_TEST_TIER", raising=False)
    assert bed_wanted([OTHER, BED_TEST])  # type: ignore[list-item]
    # the launcher-option unit tests live beside the bed but need no bed
    assert not bed_wanted([OTHER, BED_UNIT])  # type: ignore[list-item]


def test_the_package_digest_follows_the_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = tmp_path / "workbench"
    (package / "__pycache__").mkdir(parents=True)
    (package / "a.py").write_text("x = 1\n")
    monkeypatch.setattr(bed, "CHECKOUT", tmp_path)
    first = bed.package_digest()
    (package / "__pycache__" / "a.cpython-311.pyc").write_bytes(b"\0")
    assert bed.package_digest() == first  # byte code is not the code
    (package / "a.py").write_text("x = 2\n")
    assert bed.package_digest() != first
