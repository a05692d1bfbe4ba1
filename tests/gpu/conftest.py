"""The GPU checks (``make gpu-check``): every test here is marked ``gpu`` and ``engines``,
and skipped with the reason when this machine has no CUDA device torch can use.

Whether CUDA is there is asked once, of nvidia-smi's count and then of torch, at collection;
a test records its numbers with the ``numbers`` fixture, and with ``WB_GPU_RESULTS`` set the
session writes every check's outcome and numbers there (benchmarks/gpu_results.py).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
_RESULTS: dict[str, dict[str, Any]] = {}  # test name -> its row in the result file


@cache
def cuda_missing() -> str | None:
    """Why the GPU checks cannot run here, or None when they can."""
    import torch

    if shutil.which("nvidia-smi") is None:
        return "no CUDA device: no NVIDIA driver here (nvidia-smi not found)"
    if torch.version.cuda is None:
        return f"no CUDA device for torch: torch {torch.__version__} is a CPU build"
    if not torch.cuda.is_available():
        return f"no CUDA device: torch {torch.__version__} sees none"
    return None


def gpu_count() -> int:
    import torch

    return 0 if cuda_missing() else torch.cuda.device_count()


def _here(item: pytest.Item) -> bool:
    return HERE in Path(str(item.path)).resolve().parents


@pytest.hookimpl(tryfirst=True)  # before -m selects by the markers added here
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if not _here(item):
            continue
        item.add_marker(pytest.mark.gpu)
        item.add_marker(pytest.mark.engines)
        reason = cuda_missing()
        if reason is not None:
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture
def numbers(request: pytest.FixtureRequest) -> Iterator[dict[str, Any]]:
    """What the test measured, for the result file (kept whether the test passes or not)."""
    measured: dict[str, Any] = {}
    yield measured
    _RESULTS.setdefault(request.node.name, {})["numbers"] = dict(measured)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    if item.get_closest_marker("gpu") is None:  # tests/gpu and the suite's other GPU tests
        return
    report = outcome.get_result()
    row = _RESULTS.setdefault(item.name, {})
    row["name"] = item.name
    if report.skipped:
        row["outcome"] = "skipped"
        longrepr = report.longrepr
        reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
        row["reason"] = reason.removeprefix("Skipped: ")
    elif report.failed:
        row["outcome"] = "failed" if report.when == "call" else "error"
        row["reason"] = report.longreprtext.strip().splitlines()[-1][:300]
    elif report.when == "call":
        row.setdefault("outcome", "passed")
        row["seconds"] = round(report.duration, 2)


def pytest_sessionfinish(session: pytest.Session) -> None:
    out = os.environ.get("WB_GPU_RESULTS")
    if not out or not _RESULTS:
        return
    from benchmarks.gpu_results import environment, write_results

    rows = [{"numbers": {}, **row} for row in _RESULTS.values() if "outcome" in row]
    json_path, md_path = write_results(out, environment(), rows)
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(f"gpu-check results: {json_path} and {md_path}")
