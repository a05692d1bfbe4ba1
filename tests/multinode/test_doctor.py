"""The cluster doctor on the 2-node bed, against faults made there (``shaping.py``): a
throttled link, a slowed engine, a node with another version of a checked package.

Each test is one driver run (``doctor_driver.py``) of 4 ranks, 2 on each node, started
with ``launcher="ssh"``; each fault is undone afterwards and the test checks that it is.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.multinode.bed import Bed
from tests.multinode.checks import HOSTS, ok
from tests.multinode.shaping import (
    CGROUP_CPU,
    PROBE_PACKAGE,
    PROBE_PYTHON,
    cpu_quota,
    node_packages,
    qdiscs,
    throttled,
)

pytestmark = [pytest.mark.engines, pytest.mark.slow]

DOCTOR_DRIVER = Path(__file__).with_name("doctor_driver.py")
# Well below the bed's unthrottled links (0.7-1 GB/s across nodes, measured on a loaded
# 2-core machine), and slow enough that a loaded core never limits it instead.
MBIT = 300
RATE = MBIT * 1e6 / 8  # bytes/s
ALL_REDUCE_BYTES = 8 << 20


def _drive(bed: Bed, scenario: str, **cfg: Any) -> dict[str, Any]:
    report = bed.drive({"scenario": scenario, "hosts": HOSTS, **cfg}, script=DOCTOR_DRIVER)
    assert report["left"] == []  # nothing of the cluster on any node after stop
    return report


def test_a_throttled_link_is_named_measured_and_planned_for(bed: Bed) -> None:
    node = bed.nodes[1]
    with throttled(bed, node, MBIT):
        report = ok(_drive(bed, "net", size=ALL_REDUCE_BYTES, iters=8))
    assert "tbf" not in qdiscs(node)  # the shaper is gone again
    print(report["summary"], f"\nall-reduce of {ALL_REDUCE_BYTES} B over 4 ranks:", end=" ")
    print(f"planned {report['predicted_s']:.3f} s, measured {report['measured_s']:.3f} s")
    hosts = report["hosts"]
    crossing = [p for p in report["pairs"] if hosts[p["a"]] != hosts[p["b"]]]
    inside = [p for p in report["pairs"] if hosts[p["a"]] == hosts[p["b"]]]
    assert len(crossing) == 4 and len(inside) == 2
    # the slowest link is one crossing to the throttled node, at the configured rate
    slowest = report["slowest"]
    assert {hosts[slowest["a"]], hosts[slowest["b"]]} == set(HOSTS)
    assert slowest["one_way"] == pytest.approx(RATE, rel=0.3)
    assert f"({node.name})" in report["summary"].split("\n")[1]
    for p in crossing:
        assert p["one_way"] == pytest.approx(RATE, rel=0.3)
        # both ways at once: each direction has its own bucket, but one direction's ACKs
        # queue behind the other's data (the shaper's queue is 200 ms deep), so the pair
        # gets about one rate in all, never more than the two
        assert 0.7 * RATE < p["both_ways"] < 1.3 * 2 * RATE
    assert min(p["one_way"] for p in inside) > 3 * RATE  # the link is slow, not the nodes
    # the planner, given the measured hardware, predicts an all-reduce over that link
    assert report["plan_link"]["name"] == "measured inter-host"
    assert report["fits"]["inter-host"]["bandwidth"] == pytest.approx(RATE, rel=0.3)
    assert report["predicted_s"] == pytest.approx(report["measured_s"], rel=0.3)


def test_a_slowed_engine_is_named_by_the_straggler_report(bed: Bed) -> None:
    if not (CGROUP_CPU / "cpu.cfs_quota_us").exists():
        pytest.skip(f"the CPU quota needs cgroup v1's cpu controller at {CGROUP_CPU}")
    victim = 3
    with cpu_quota(bed, 0.1) as group:
        report = ok(_drive(bed, "slow", victim=victim, cgroup=str(group), steps=6))
        assert len(report["joined"]) == 1
    assert not group.exists()  # the cgroup is removed afterwards
    assert report["errors"] == []
    straggler = report["straggler"]
    print(straggler["summary"])
    assert straggler["slowest"] == victim, straggler["summary"]
    assert straggler["excess_s"] > 0
    # the others spent the victim's extra time waiting for it inside the all-reduce
    waits = {int(r): w for r, w in straggler["wait_s"].items()}
    assert all(waits.get(r, 0.0) > waits.get(victim, 0.0) for r in range(4) if r != victim)


def test_a_node_with_another_package_version_fails_the_start_naming_it(bed: Bed) -> None:
    versions = {"wbmn1": "1.0", "wbmn2": "2.0"}
    with node_packages(bed, versions):
        report = _drive(
            bed,
            "start",
            check_packages=[PROBE_PACKAGE],
            options={"remote_python": PROBE_PYTHON},
        )
    error = report.get("error") or ""
    print(error)
    assert error.startswith("ClusterError: the engines' environments differ"), error
    assert f"{PROBE_PACKAGE} differs: " in error
    assert "wbmn1 has 1.0" in error and "wbmn2 has 2.0" in error  # each node, its version
    # refused before the process group's store opened, let alone the group formed
    assert "clocks and port" not in report["stages"]
    assert "process group formed" not in report["stages"]
    for node in bed.nodes:  # the nodes' packages are gone again
        assert bed.node_exec(node, ["test", "-e", "/tmp/wbmn-doctor"], check=False).returncode
