"""launcher="slurm" on the 2-node bed (munged + slurmctld on the login node, slurmd on each
node): ``wb.Cluster(n=4, launcher="slurm", hosts=["wbmn1", "wbmn2"])`` and nothing else.
Each engine is its own 1-task job pinned to its node, so one engine's death frees its CPU
and recovery replaces only it, with a new job on the same node."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.multinode.bed import Bed
from tests.multinode.checks import (
    HOSTS,
    failed_load_leaves_nothing,
    ok,
    replaced_only_the_dead_engine,
)
from tests.multinode.contract import LauncherContract

pytestmark = pytest.mark.engines


@pytest.fixture(scope="module")
def run(bed: Bed) -> dict[str, Any]:
    if not bed.slurm:
        pytest.skip("slurm-wlm and munge are not installed (apt-get install slurm-wlm munge)")
    return bed.drive({"scenario": "full", "launcher": "slurm", "hosts": HOSTS, "n": 4})


class TestSlurm(LauncherContract):
    """The contract every launcher keeps (tests/multinode/contract.py)."""


def test_killed_remote_engine_is_replaced_by_a_job_on_its_node(run: dict[str, Any]) -> None:
    replaced_only_the_dead_engine(run)
    fault = ok(run)["fault"]
    jobs = [line.split() for line in fault["jobs_after"].splitlines()]
    running = [(job, node) for job, state, node in jobs if state == "R"]
    # one job per engine: the dead engine's job ended, its replacement runs on its node
    assert len(running) == 4, jobs
    assert sorted(node for _, node in running) == sorted(HOSTS * 2), jobs


def test_the_engines_jobs_end_with_the_stop(bed: Bed, run: dict[str, Any]) -> None:
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


def test_a_failed_load_during_recovery_leaves_nothing_running(bed: Bed) -> None:
    if not bed.slurm:
        pytest.skip("slurm-wlm and munge are not installed")
    failed_load_leaves_nothing(bed, "slurm")
