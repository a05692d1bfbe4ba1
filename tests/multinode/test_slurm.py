"""launcher="slurm" on the 2-node bed (munged + slurmctld on the login node, slurmd on each
node): ``wb.Cluster(n=4, launcher="slurm", hosts=["wbmn1", "wbmn2"])`` and nothing else."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.multinode.bed import Bed
from tests.multinode.checks import HOSTS
from tests.multinode.contract import LauncherContract

pytestmark = pytest.mark.engines


@pytest.fixture(scope="module")
def run(bed: Bed) -> dict[str, Any]:
    if not bed.slurm:
        pytest.skip("slurm-wlm and munge are not installed (apt-get install slurm-wlm munge)")
    return bed.drive({"scenario": "train", "launcher": "slurm", "hosts": HOSTS, "n": 4})


class TestSlurm(LauncherContract):
    """The contract every launcher keeps (tests/multinode/contract.py)."""


def test_the_engines_job_ends_with_the_stop(bed: Bed, run: dict[str, Any]) -> None:
    # the engines' job ended with the stop (Slurm lists it as completing for a few seconds)
    deadline = time.monotonic() + 30
    while queue := bed.run_user(["squeue", "-h", "-u", bed.user], timeout=30).stdout.strip():
        assert time.monotonic() < deadline, queue
        time.sleep(0.5)


def test_sbatch_refusal_surfaces_at_once_with_its_own_words(bed: Bed) -> None:
    if not bed.slurm:
        pytest.skip("slurm-wlm and munge are not installed")
    report = bed.drive(
        {
            "scenario": "basic",
            "launcher": "slurm",
            "hosts": HOSTS,
            "n": 2,
            "options": {"partition": "no-such-partition"},
        }
    )
    assert report["error"] is not None and "no-such-partition" in report["error"].lower()
    assert "start_timeout" not in report["error"]
    assert report["left"] == []
