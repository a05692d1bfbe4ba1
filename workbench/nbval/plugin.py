"""The pytest plugin (entry point ``pytest11``): ``--nbval-workbench`` applies the shipped
sanitizer, merged with the user's own ``--nbval-sanitize-with`` file.

nbval accepts one sanitizer file and reads it lazily (when each notebook is set up), so
``pytest_configure`` (after nbval's own, which resolves its deprecated option names)
writes the merged rules to a temporary file and points ``nbval_sanitize_with`` at it; the
file is removed when pytest ends. Loaded in every pytest run of this environment: it
imports only the standard library and pytest until the option is given.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

__all__ = ["pytest_addoption", "pytest_configure"]

OPTION = "--nbval-workbench"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.getgroup("nbval").addoption(
        OPTION,
        action="store_true",
        default=False,
        help="apply the workbench's nbval sanitizer (timings, pids, ports, hosts, temporary "
        "paths, progress bars, other libraries' warnings), merged with --nbval-sanitize-with",
    )


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    if not config.getoption("nbval_workbench", default=False):
        return
    if not hasattr(config.option, "nbval_sanitize_with"):
        raise pytest.UsageError(f"{OPTION} needs nbval: pip install nbval")
    from workbench.nbval import merged_rules, read_user_file

    own = config.option.nbval_sanitize_with
    try:
        text = merged_rules(read_user_file(own) if own else None)
    except (OSError, ValueError) as exc:
        raise pytest.UsageError(f"{OPTION}: --nbval-sanitize-with {own}: {exc}") from None
    fd, path = tempfile.mkstemp(prefix="workbench-nbval-", suffix=".cfg")
    with os.fdopen(fd, "w") as out:
        out.write(text)
    # pytest's own way to hand a plugin an option (tests/test_ownership.py lists this write)
    config.option.nbval_sanitize_with = path
    config.add_cleanup(lambda: Path(path).unlink(missing_ok=True))
