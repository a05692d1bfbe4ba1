"""The result file of ``make gpu-check``: a pytest plugin (``-p tests.gpu.report``) that
keeps every GPU test's outcome (any test marked ``gpu``, in tests/gpu/ or elsewhere) with
the numbers it recorded, and at the end writes them to ``$WB_GPU_RESULTS``
(benchmarks/gpu_results.py). Loaded as a plugin, not from tests/gpu/conftest.py, because a
conftest's report hooks see only the tests below it."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

RESULTS: dict[str, dict[str, Any]] = {}  # test name -> its row in the result file


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    if item.get_closest_marker("gpu") is None:  # tests/gpu and the suite's other GPU tests
        return
    report = outcome.get_result()
    row = RESULTS.setdefault(item.name, {})
    row["name"] = item.name
    if report.skipped:
        row["outcome"] = "skipped"
        longrepr = report.longrepr
        reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
        row["reason"] = reason.removeprefix("Skipped: ")
    elif report.failed:
        row["outcome"] = "failed" if report.when == "call" else "error"
        lines = report.longreprtext.strip().splitlines() or [""]
        errors = [line[1:].strip() for line in lines if line.startswith("E ")]
        row["reason"] = (errors[0] if errors else lines[-1])[:300]  # the assertion or error
    elif report.when == "call":
        row.setdefault("outcome", "passed")
        row["seconds"] = round(report.duration, 2)


def pytest_sessionfinish(session: pytest.Session) -> None:
    out = os.environ.get("WB_GPU_RESULTS")
    if not out or not RESULTS:
        return
    from benchmarks.gpu_results import environment, write_results

    rows = [{"numbers": {}, **row} for row in RESULTS.values() if "outcome" in row]
    json_path, md_path = write_results(out, environment(), rows)
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(f"gpu-check results: {json_path} and {md_path}")
