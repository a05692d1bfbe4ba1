"""Engines on named hosts (``grow(n, hosts=...)``, spares): checked before anything starts."""

from __future__ import annotations

import pytest

from workbench.cluster import Cluster
from workbench.cluster.hosts import host_placement
from workbench.cluster.hosts.host_placement import check_hosts, placed
from workbench.errors import ClusterError, ConfigError


def test_hosts_are_names_for_a_launcher_that_places_engines() -> None:
    assert check_hosts("hosts", "node-a, node-b", "ssh") == ("node-a", "node-b")
    assert check_hosts("hosts", ["node-c"], "slurm") == ("node-c",)
    with pytest.raises(ConfigError, match=r"hosts=\[\] .*no host given"):
        check_hosts("hosts", [], "ssh")
    with pytest.raises(ConfigError, match=r"hosts=\['a b'\].*'a b' is not a host name"):
        check_hosts("hosts", ["a b"], "ssh")
    with pytest.raises(ConfigError, match=r"launcher='local' does not place.*'ssh' or 'slurm'"):
        check_hosts("hosts", ["node-a"], "local")


def test_a_local_cluster_refuses_grow_on_hosts_before_starting_anything() -> None:
    cluster = Cluster(n=2, backend="gloo")  # never started: the check comes first
    with pytest.raises(ConfigError, match=r"hosts=\['node-b'\].*launcher='local'"):
        cluster.grow_sync(1, hosts=["node-b"])
    assert cluster.state == "stopped"


def test_engines_go_round_robin_on_hosts_that_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(host_placement, "probe_host", lambda host: host != "gone")
    assert placed(["node-a", "node-b"], 3) == {"node-a": 2, "node-b": 1}
    assert placed(["node-b"], 2) == {"node-b": 2}
    with pytest.raises(ClusterError, match=r"\['gone'\] do not answer"):
        placed(["node-a", "gone"], 2)
