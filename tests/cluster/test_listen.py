"""Nothing a local cluster starts listens beyond loopback (checked on the real sockets)."""

from __future__ import annotations

import ipaddress

import psutil

from workbench.cluster import Cluster


def _listening(procs: list[psutil.Process]) -> list[tuple[int, str, int]]:
    out = []
    for proc in procs:
        try:
            conns = proc.net_connections(kind="inet")
        except psutil.NoSuchProcess:
            continue
        out += [(proc.pid, c.laddr.ip, c.laddr.port) for c in conns if c.status == "LISTEN"]
    return out


def test_local_cluster_listens_on_loopback_only(cluster: Cluster) -> None:
    # This process (the kernel's place) and everything it started: controller, its
    # schedulers, engines, nannies, the watchdog.
    me = psutil.Process()
    sockets = _listening([me, *me.children(recursive=True)])
    exposed = [s for s in sockets if not ipaddress.ip_address(s[1]).is_loopback]
    assert exposed == [], exposed
    # The checks saw the real sockets: rank 0's rendezvous store, the controller's.
    r0 = cluster.ranks[0]
    assert (r0.pid, "127.0.0.1", r0.master_port) in sockets
    controller = cluster.pids()[0]
    assert any(pid == controller for pid, _, _ in sockets)
