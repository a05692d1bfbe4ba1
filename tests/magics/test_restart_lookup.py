"""``%wb restart`` looks for the stepper's session only where a stepper can exist: with the
stepper's module never imported it imports nothing (that import cost 1.5-5 s of the first
recovery in a fresh kernel, issue 31)."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest

from workbench.errors import ConfigError
from workbench.magics import cluster_cmds

STEPPER = "workbench.ui.stepper"


def test_no_stepper_module_means_no_session_and_no_import(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, STEPPER, None)  # an import of it now raises
    assert cluster_cmds._session_on(object()) is None  # type: ignore[arg-type]


def _stepper_module(current: object) -> SimpleNamespace:
    def now() -> object:
        if isinstance(current, Exception):
            raise current
        return current

    return SimpleNamespace(Stepper=SimpleNamespace(current=now))


def test_the_current_steppers_session_on_this_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    cluster, other = object(), object()
    stepper = SimpleNamespace(cluster=cluster, session="the session")
    monkeypatch.setitem(sys.modules, STEPPER, _stepper_module(stepper))
    assert cluster_cmds._session_on(cluster) == "the session"  # type: ignore[arg-type]
    assert cluster_cmds._session_on(other) is None  # type: ignore[arg-type]
    monkeypatch.setitem(sys.modules, STEPPER, _stepper_module(ConfigError("no stepper yet")))
    assert cluster_cmds._session_on(cluster) is None  # type: ignore[arg-type]
