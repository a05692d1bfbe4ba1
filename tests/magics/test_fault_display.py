"""A fault on the ranks is shown as its name and message, without formatting the kernel's
own frames: that formatting was most of a dead rank's report on the first fault in a fresh
kernel (issue 31, ``benchmarks/first_fault_profile.py``)."""

from __future__ import annotations

from typing import Any

import pytest

from workbench.errors import CollectiveTimeout, EngineDied, HostLost, RankError

RED, RESET = "\x1b[0;31m", "\x1b[0m"


def _shown(shell: Any, monkeypatch: pytest.MonkeyPatch, error: BaseException) -> list[str]:
    """The traceback lines IPython sends for ``error`` raised two calls deep in a cell."""
    shown: list[list[str]] = []
    monkeypatch.setattr(shell, "_showtraceback", lambda etype, value, stb: shown.append(stb))

    def inner() -> None:
        raise error

    def outer() -> None:
        inner()

    shell.user_ns["_wb_raise"] = outer
    shell.run_cell("_wb_raise()")
    assert len(shown) == 1
    return shown[0]


@pytest.mark.parametrize(
    "error",
    [
        EngineDied("engine died: rank 1 (engine 1 on h, pid 7; last seen idle)", ranks=[1]),
        HostLost.of("node-b", [2, 3]),
        CollectiveTimeout("ranks [0] still running after 5 s:\nrank 0 waits in barrier"),
    ],
    ids=type,
)
def test_a_fault_on_the_ranks_is_its_message_alone(
    ipython_shell: Any, monkeypatch: pytest.MonkeyPatch, error: BaseException
) -> None:
    lines = _shown(ipython_shell, monkeypatch, error)
    assert lines == [f"{RED}{type(error).__name__}{RESET}: {error}"]


def test_a_rank_error_still_shows_the_remote_tracebacks(
    ipython_shell: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    error = RankError("failed on ranks [1]", failures={1: "Traceback ...\nValueError: x"})
    assert _shown(ipython_shell, monkeypatch, error) == [
        "[rank 1]",
        "Traceback ...",
        "ValueError: x",
    ]


def test_other_errors_keep_the_full_traceback(
    ipython_shell: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = "\n".join(_shown(ipython_shell, monkeypatch, ValueError("plain")))
    assert "inner()" in text and "ValueError" in text
