"""The nbval plugin's handling of the user's own sanitizer file, without running nbval:
its ``pytest_configure`` hook is called with a stand-in config. Whatever the file holds,
the outcome is one ``UsageError`` naming it, or a merged file nbval reads as documented."""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from workbench.nbval import SANITIZER, read_rules
from workbench.nbval.plugin import pytest_configure


class _Config:
    def __init__(self, own: str | None) -> None:
        self.option = SimpleNamespace(nbval_workbench=True, nbval_sanitize_with=own)
        self.cleanups: list[Any] = []

    def getoption(self, name: str, default: Any = None) -> Any:
        return getattr(self.option, name, default)

    def add_cleanup(self, func: Any) -> None:
        self.cleanups.append(func)

    def merged(self) -> str:
        text = Path(self.option.nbval_sanitize_with).read_text()
        for cleanup in self.cleanups:
            cleanup()
        return text


def _configure(own: str) -> _Config:
    """The hook on ``own``, in a thread: a hook blocked on a FIFO fails the test."""
    config = _Config(own)
    outcome: dict[str, BaseException] = {}

    def run() -> None:
        try:
            pytest_configure(config)  # type: ignore[arg-type]
        except BaseException as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(20)
    if thread.is_alive():
        os.close(os.open(own, os.O_WRONLY | os.O_NONBLOCK))  # frees the blocked reader
        thread.join(20)
        pytest.fail(f"the plugin blocked reading {own}")
    if "error" in outcome:
        raise outcome["error"]
    return config


def test_an_invalid_regex_is_one_usage_error_naming_it(tmp_path: Path) -> None:
    own = tmp_path / "mine.cfg"
    own.write_text("regex: loss (\\d+\nreplace: LOSS\n")
    with pytest.raises(pytest.UsageError, match=r"mine.cfg.*'loss \(\\\\d\+'"):
        _configure(str(own))


def test_a_fifo_as_the_sanitizer_file_is_one_usage_error(tmp_path: Path) -> None:
    fifo = tmp_path / "rules.cfg"
    os.mkfifo(fifo)
    with pytest.raises(pytest.UsageError, match="not a regular file"):
        _configure(str(fifo))


def test_an_endless_device_as_the_sanitizer_file_is_one_usage_error() -> None:
    with pytest.raises(pytest.UsageError, match="/dev/zero.*not a regular file"):
        _configure("/dev/zero")


def test_a_user_rule_with_a_shipped_rules_pattern_keeps_the_users_replacement(
    tmp_path: Path,
) -> None:
    from nbval.plugin import get_sanitize_patterns

    shipped_regex, shipped_replacement = read_rules(SANITIZER.read_text())[0]
    own = tmp_path / "mine.cfg"
    own.write_text(f"regex: {shipped_regex}\nreplace: MINE\n")
    merged = _configure(str(own)).merged()
    patterns: OrderedDict[str, str] = OrderedDict()
    patterns.update(get_sanitize_patterns(merged))  # as nbval's IPyNbFile.setup reads them
    assert shipped_replacement != "MINE"
    assert patterns[shipped_regex] == "MINE"
