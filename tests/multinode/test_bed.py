"""The bed behaves like separate machines where it matters to the workbench: own hostname,
own pids, own /tmp, own /etc/hosts, reachable only inside the bed."""

from __future__ import annotations

import pytest

from tests.multinode.bed import PID_BASE, PID_STEP, Bed

pytestmark = pytest.mark.engines


def test_nodes_are_separate_machines(bed: Bed) -> None:
    n1, n2 = bed.nodes
    marker = f"/tmp/wbmn-marker-{n1.name}"
    out = bed.run_user(
        ["ssh", n1.name, f"hostname; echo $$; touch {marker}; ls {marker}"], timeout=30
    ).stdout.split()
    assert out[0] == n1.name
    assert int(out[1]) >= PID_BASE + n1.index * PID_STEP  # the node's own pid space
    assert out[2] == marker
    other = bed.run_user(["ssh", n2.name, f"ls {marker}"], timeout=30, check=False)
    assert other.returncode != 0  # each node has its own /tmp
    login = bed.run_user(["ls", marker], timeout=30, check=False)
    assert login.returncode != 0
    routes = bed.node_exec(n1, ["ip", "route"]).stdout
    assert "default" not in routes  # nothing can leave the machine from a node


def test_hosts_style_debian_maps_the_hostname_to_127_0_1_1(bed: Bed) -> None:
    node = bed.nodes[0]
    resolve = f"getent hosts {node.name}"
    try:
        bed.set_hosts_style("debian")
        assert bed.run_user(["ssh", node.name, resolve], timeout=30).stdout.split()[0] == (
            "127.0.1.1"
        )
    finally:
        bed.set_hosts_style("cluster")
    assert bed.run_user(["ssh", node.name, resolve], timeout=30).stdout.split()[0] == node.ip
