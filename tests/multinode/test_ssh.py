"""launcher="ssh" on the 2-node bed, as a user runs it: ``wb.Cluster(n=4, launcher="ssh",
hosts=["wbmn1", "wbmn2"])`` with no launcher options at all.

One driver run (start, ranks, an all-reduce, an interrupt, DDP against the single-device
run, a killed remote engine, recovery, stop) feeds most tests: a cluster start is the
expensive part. Every run also proves that nothing is left on any node after stop.
"""

from __future__ import annotations

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
    return bed.drive({"scenario": "full", "launcher": "ssh", "hosts": HOSTS, "n": 4})


class TestSSH(LauncherContract):
    """The contract every launcher keeps (tests/multinode/contract.py)."""


def test_killed_remote_engine_is_replaced_on_its_host(run: dict[str, Any]) -> None:
    replaced_only_the_dead_engine(run)


def test_pdb_on_a_rank_of_another_host_is_answered_from_the_kernel(run: dict[str, Any]) -> None:
    """Issue 45 through the cluster's own channels: the remote engine connects to the
    kernel's debug socket on the controller's address."""
    debug = ok(run)["debug"]
    assert debug["host"] != run["ranks"][0]["host"]
    prompt = f"[rank {debug['rank']}] (Pdb) "
    assert debug["breakpoint"][1::2][:2] == [prompt, prompt], debug
    assert "41" in debug["breakpoint"][2].splitlines(), debug
    assert debug["stdout"] == "42\n", debug
    assert debug["failed"] == ["ValueError"] * 4, debug
    assert "15" in debug["post_mortem"][2].splitlines(), debug
    assert debug["left"] == f"left the debugger on rank {debug['rank']}", debug


def test_debian_hosts_file_still_gives_a_reachable_master_addr(bed: Bed) -> None:
    """Stock Debian maps each hostname to 127.0.1.1: the address must come from the route."""
    try:
        bed.set_hosts_style("debian")
        report = bed.drive({"scenario": "basic", "launcher": "ssh", "hosts": HOSTS, "n": 4})
    finally:
        bed.set_hosts_style("cluster")
    ok(report)
    ips = {n.ip for n in bed.nodes}
    assert {e["MASTER_ADDR"] for e in report["env"]} <= ips
    assert report["all_reduce"] == [10.0] * 4
    assert report["left"] == []


def test_unreachable_master_addr_and_missing_python_fail_at_once(bed: Bed) -> None:
    """A loopback interface (network_interface='lo') is refused before anything starts, with
    the address and the fix; so is a wrong remote_python (with ssh's own words)."""
    lo = bed.drive(
        {
            "scenario": "basic",
            "launcher": "ssh",
            "hosts": HOSTS,
            "n": 2,
            "options": {"network_interface": "lo"},
        }
    )
    assert lo["error"] is not None and "127.0.0.1" in lo["error"]
    assert "network_interface" in lo["error"] and "loopback" in lo["error"]
    assert "DistStoreError" not in lo["error"]
    assert lo["left"] == []
    bad = bed.drive(
        {
            "scenario": "basic",
            "launcher": "ssh",
            "hosts": HOSTS,
            "n": 2,
            "options": {"remote_python": "/opt/no-such/python"},
        }
    )
    assert bad["error"] is not None and "/opt/no-such/python" in bad["error"]
    assert "does not exist on wbmn1" in bad["error"]
    assert "start_timeout" not in bad["error"]  # at once, not after the timeout
    assert bad["left"] == []


def test_a_failed_load_during_recovery_leaves_nothing_running(bed: Bed) -> None:
    failed_load_leaves_nothing(bed, "ssh")
