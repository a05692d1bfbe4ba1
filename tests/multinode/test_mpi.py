"""launcher="mpi" on the 2-node bed with Debian's openmpi: ``wb.Cluster(n=4,
launcher="mpi", hosts=["wbmn1", "wbmn2"])``, nothing else (no hostfile, no -x, no config)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.multinode.bed import Bed
from tests.multinode.checks import HOSTS, nothing_left, ok, trained_like_single_device, two_by_two

pytestmark = pytest.mark.engines


@pytest.fixture(scope="module")
def run(bed: Bed) -> dict[str, Any]:
    return bed.drive({"scenario": "train", "launcher": "mpi", "hosts": HOSTS, "n": 4})


def test_ranks_local_ranks_and_master_addr(bed: Bed, run: dict[str, Any]) -> None:
    two_by_two(bed, run)


def test_interrupt_reaches_a_remote_rank(run: dict[str, Any]) -> None:
    assert ok(run)["interrupt"]["ename"] == "KeyboardInterrupt"


def test_ddp_across_nodes_equals_single_device(run: dict[str, Any]) -> None:
    trained_like_single_device(run)


def test_stop_leaves_nothing_on_any_node(bed: Bed, run: dict[str, Any]) -> None:
    nothing_left(bed, run)


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
