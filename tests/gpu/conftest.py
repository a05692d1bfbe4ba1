"""The GPU checks (``make gpu-check``): every test here is marked ``gpu`` and ``engines``,
and skipped with the reason when this machine has no CUDA device torch can use.

Whether CUDA is there is asked once, of nvidia-smi's count and then of torch, at collection;
a test records its numbers with the ``numbers`` fixture; ``tests/gpu/report.py`` (loaded with
``-p tests.gpu.report``, as tools/gpu_check.sh does) writes the result file.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from tests.gpu.report import RESULTS

HERE = Path(__file__).resolve().parent


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
    RESULTS.setdefault(request.node.name, {})["numbers"] = dict(measured)
