"""The gpu-check result writer, on synthetic checks (the numbers are this test's inputs)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from benchmarks.gpu_results import NO_DEVICE, environment, render_markdown, write_results

ENV = {
    "device": "NVIDIA H200",
    "device_count": 1,
    "driver": "580.159.04",
    "torch": "2.13.0+cu130",
    "torch_cuda": "13.0",
    "nccl": "2.28.3",
    "python": "3.12.3",
    "host": "gpu-host",
}
CHECKS = [
    {"name": "test_a", "outcome": "passed", "numbers": {"ratio": 1.23456, "bytes": 4096}},
    {"name": "test_b", "outcome": "skipped", "reason": "needs 2 GPUs | has 1"},
    {"name": "test_c", "outcome": "failed", "reason": "AssertionError: x", "numbers": {"n": 2}},
]


def test_json_holds_the_environment_and_every_check(tmp_path: Path) -> None:
    json_path, md_path = write_results(tmp_path / "gpu", ENV, CHECKS, when="2026-12-01T00:00:00Z")
    assert (json_path.name, md_path.name) == ("gpu-check.json", "gpu-check.md")
    data = json.loads(json_path.read_text())
    assert data["environment"] == {**ENV, "when": "2026-12-01T00:00:00Z"}
    assert data["checks"] == CHECKS
    assert sorted(p.name for p in (tmp_path / "gpu").iterdir()) == [
        "gpu-check.json",
        "gpu-check.md",
    ]  # no temporary file left behind


def test_markdown_is_one_row_per_check_with_numbers_or_reason() -> None:
    text = render_markdown({**ENV, "when": "t"}, CHECKS)
    assert "- device: NVIDIA H200 (count 1)" in text
    assert "- driver: 580.159.04, CUDA (torch build): 13.0, NCCL: 2.28.3" in text
    assert "- 1 passed, 1 failed, 1 skipped" in text
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    assert rows == [
        "| `test_a` | passed | ratio=1.235; bytes=4096 |",
        "| `test_b` | skipped | needs 2 GPUs \\| has 1 |",  # a | in a reason keeps the table
        "| `test_c` | failed | n=2; AssertionError: x |",
    ]


def test_an_unknown_outcome_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="outcome='maybe'; valid: passed, failed"):
        write_results(tmp_path, ENV, [{"name": "x", "outcome": "maybe"}])
    assert list(tmp_path.iterdir()) == []


def test_a_rewrite_replaces_the_previous_file_whole(tmp_path: Path) -> None:
    write_results(tmp_path, ENV, CHECKS)
    json_path, _ = write_results(tmp_path, ENV, CHECKS[:1])
    assert [c["name"] for c in json.loads(json_path.read_text())["checks"]] == ["test_a"]


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this host has a GPU")
def test_a_host_without_a_gpu_reports_no_cuda_device() -> None:
    # No nvidia-smi (and here the CPU build of torch): what a dry run writes.
    env = environment()
    assert env["device"] == NO_DEVICE and env["device_count"] == 0
    assert env["driver"] is None and env["nccl"] is None


SYNTHETIC = """
import pytest

@pytest.mark.gpu
def test_fails():
    assert 1 == 2, "one is not two"

@pytest.mark.gpu
def test_passes():
    pass

@pytest.mark.gpu
@pytest.mark.skip(reason="needs two GPUs")
def test_skips():
    pass

def test_not_a_gpu_test():
    pass
"""


@pytest.mark.engines  # a pytest run of its own, in a subprocess
def test_the_plugin_records_each_gpu_tests_outcome(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    (tmp_path / "test_synthetic.py").write_text(SYNTHETIC)
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "WB_GPU_RESULTS": str(tmp_path / "out"), "PYTHONPATH": str(root)}
    plugins = ["-p", "no:cacheprovider", "-p", "tests.gpu.report"]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", *plugins, "--rootdir", str(tmp_path), str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 1, done.stdout + done.stderr  # one test fails
    checks = json.loads((tmp_path / "out" / "gpu-check.json").read_text())["checks"]
    assert [(c["name"], c["outcome"], c.get("reason")) for c in checks] == [
        ("test_fails", "failed", "AssertionError: one is not two"),
        ("test_passes", "passed", None),
        ("test_skips", "skipped", "needs two GPUs"),
    ]
