"""launcher="mpi" on the 2-node bed with Debian's openmpi: ``wb.Cluster(n=4,
launcher="mpi", hosts=["wbmn1", "wbmn2"])``, nothing else (no hostfile, no -x, no config)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.multinode.bed import Bed
from tests.multinode.checks import HOSTS
from tests.multinode.contract import LauncherContract

pytestmark = pytest.mark.engines


@pytest.fixture(scope="module")
def run(bed: Bed) -> dict[str, Any]:
    return bed.drive({"scenario": "train", "launcher": "mpi", "hosts": HOSTS, "n": 4})


class TestMPI(LauncherContract):
    """The contract every launcher keeps (tests/multinode/contract.py)."""


def test_mpiexec_failure_surfaces_at_once_with_its_own_output(bed: Bed) -> None:
    report = bed.drive(
        {
            "scenario": "basic",
            "launcher": "mpi",
            "hosts": HOSTS,
            "n": 2,
            "options": {"mpi_args": ["--no-such-mpiexec-option"]},
        }
    )
    assert report["error"] is not None
    assert "engines exited during start-up" in report["error"]
    assert "no-such-mpiexec-option" in report["error"]  # mpiexec's own words
    assert "start_timeout" not in report["error"]
    assert report["left"] == []


def test_one_ranks_death_is_reported_as_the_end_of_the_mpi_job_not_lost_hosts(bed: Bed) -> None:
    report = bed.drive({"scenario": "mpi_rank_death", "launcher": "mpi", "hosts": HOSTS, "n": 4})
    assert report.get("error") is None, report.get("traceback")
    for key in ("cell_error", "recover_error"):
        said = report[key]
        assert said is not None and not said.startswith("HostLost"), said
        assert "mpiexec then ended the whole MPI job" in said and "%wb restart --full" in said
    assert report["left"] == []
