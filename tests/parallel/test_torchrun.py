"""The engine-side step machine runs in a plain torchrun script, outside any notebook."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.harness import free_port

pytestmark = pytest.mark.engines


def test_torchrun_fsdp_matches_single_device() -> None:
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "2",
        "--master-port",
        str(free_port()),
        "-m",
        "workbench.parallel",
        "--strategy",
        "fsdp",
        "--model",
        "mlp-tiny",
        "--steps",
        "5",
        "--check",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    assert result.stdout.count(" loss ") == 5  # rank 0 only prints
    assert "ok=True" in result.stdout


def test_cli_rejects_bad_choice_with_the_choices() -> None:
    cmd = [sys.executable, "-m", "workbench.parallel", "--strategy", "zero9"]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "strategy='zero9' is not valid; choose one of: 'single', 'dp'" in result.stderr
