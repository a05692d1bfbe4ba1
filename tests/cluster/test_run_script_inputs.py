"""``Cluster.run_script`` / ``%wb run`` refuse bad input before any work is sent (no engines:
the cluster here never starts, so a later check would say "not running" instead)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from IPython.core.error import UsageError

from workbench.cluster import Cluster
from workbench.errors import ConfigError

SCRIPT = Path(__file__).resolve().parent / "scripts" / "exit_code.py"


@pytest.mark.parametrize(
    ("path", "args", "timeout", "message"),
    [
        ("no_such_script.py", (), None, "path='no_such_script.py' is not valid: no such file; "),
        (SCRIPT.parent, (), None, "is not valid: a folder, not a file; give a Python script"),
        (3, (), None, "path=3 is not valid: not a path; give a Python script, e.g. 'train.py'"),
        ("", (), None, "path='' is not valid: not a path"),
        (SCRIPT, "--codes 0,0", None, "args='--codes 0,0' is not valid: not a list of arguments"),
        (SCRIPT, ["--x", None], None, "args=['--x', None] is not valid: None is not a str"),
        (SCRIPT, [True], None, "args=[True] is not valid: True is not a str or a number"),
        (SCRIPT, (), -1, "timeout=-1 is not valid: out of range; use a number of seconds > 0"),
        (SCRIPT, (), float("nan"), "timeout=nan is not valid: not a finite number"),
    ],
)
def test_run_script_refuses_bad_input(path: Any, args: Any, timeout: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        Cluster(n=2).run_script(path, args, timeout=timeout)


def test_a_relative_path_names_the_folder_it_was_looked_for_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=re.escape(f"(relative to {tmp_path})")):
        Cluster(n=2).run_script("train.py")


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("run", "the following arguments are required: script"),
        ("run nope.py --epochs 2", "script='nope.py' is not valid: no such file"),
        (f"run --timeout -1 {SCRIPT}", "--timeout -1.0 is not valid: out of range"),
        (f"run --ranks x {SCRIPT}", "start one first with `%wb start"),
    ],
)
def test_wb_run_refuses_bad_input(ipython_shell: Any, line: str, message: str) -> None:
    no_cluster = mock.patch("workbench.cluster.cluster._current", [])  # none is running
    with no_cluster, pytest.raises(UsageError, match=re.escape(message)):
        ipython_shell.run_line_magic("wb", line)
