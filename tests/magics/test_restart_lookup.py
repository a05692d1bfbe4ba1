"""``%wb restart`` / ``%wb grow`` find the stepper's session through the registry in
``session/current.py``: with no stepper made it imports nothing (importing the stepper's
module cost 1.5-5 s of the first recovery in a fresh kernel, issue 31)."""

from __future__ import annotations

import gc
import sys

import pytest

from workbench.magics import cluster_cmds
from workbench.session import current

STEPPER = "workbench.ui.stepper"


class _Session:  # the registry keeps a weak reference; only ``cluster`` is read
    def __init__(self, cluster: object) -> None:
        self.cluster = cluster


@pytest.fixture(autouse=True)
def _empty_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(current, "_current", [])


def test_no_stepper_means_no_session_and_no_import(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, STEPPER, None)  # an import of it now raises
    assert cluster_cmds._session_on(object()) is None  # type: ignore[arg-type]


def test_the_current_steppers_session_on_this_cluster() -> None:
    cluster, other = object(), object()
    first, second = _Session(cluster), _Session(other)
    current.make_current(first)  # type: ignore[arg-type]
    assert cluster_cmds._session_on(cluster) is first  # type: ignore[arg-type]
    assert cluster_cmds._session_on(other) is None  # type: ignore[arg-type]
    current.make_current(second)  # type: ignore[arg-type]  # a newer stepper's
    assert cluster_cmds._session_on(cluster) is None  # type: ignore[arg-type]
    assert cluster_cmds._session_on(other) is second  # type: ignore[arg-type]
    del second
    gc.collect()
    assert current.current_session() is None  # the registry does not keep it alive
