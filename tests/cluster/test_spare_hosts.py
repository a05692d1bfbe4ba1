"""Spare hosts (``Cluster(..., spare_hosts=[...])``): checked before anything starts, and a
lost host's ranks pointed at a free spare that answers (``cluster/hosts/spare_hosts.py``), with no
engines: a stand-in cluster and a stand-in probe."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest

from tests.cluster.rank_tables import ranks_on
from workbench.cluster import Cluster
from workbench.cluster.hosts import spare_hosts
from workbench.cluster.hosts.spare_hosts import move_to_spares
from workbench.cluster.launch.launchers import LauncherOptions
from workbench.cluster.ranks import RankAssignment
from workbench.errors import ConfigError, HostLost


@dataclass
class _Cluster:
    ranks: list[RankAssignment]
    spare_hosts: tuple[str, ...]
    launch_hosts: dict[int, str] = field(default_factory=dict)
    launcher: str = "ssh"
    lost_hosts: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.config = SimpleNamespace(spare_hosts=self.spare_hosts, launcher=self.launcher)
        self.launcher_options = LauncherOptions(partition="wb")
        self.launch_hosts = {r.engine_id: r.host for r in self.ranks}

    def host_lost(self, engine_id: int, lost: str, spare_host: str) -> None:
        """As ``EngineSet.host_lost``: the launch host is lost, the spare starts it."""
        self.lost_hosts.add(self.launch_hosts.get(engine_id) or lost)
        self.launch_hosts[engine_id] = spare_host


def test_spare_hosts_are_checked_before_anything_starts() -> None:
    cluster = Cluster(n=4, launcher="ssh", hosts=["a", "b"], spare_hosts="c, d")
    assert cluster.config.spare_hosts == ("c", "d")
    with pytest.raises(ConfigError, match=r"spare_hosts=\('a',\).*'a' is also in hosts"):
        Cluster(n=4, launcher="ssh", hosts=["a", "b"], spare_hosts=["a"])
    with pytest.raises(ConfigError, match=r"'c' is named twice"):
        Cluster(n=4, launcher="ssh", hosts=["a", "b"], spare_hosts=["c", "c"])
    with pytest.raises(ConfigError, match=r"launcher='local' cannot start .* launcher='ssh' or"):
        Cluster(n=2, spare_hosts=["c"])
    with pytest.raises(ConfigError, match=r"spare_hosts=.*'c d' is not a host name"):
        Cluster(n=4, launcher="ssh", hosts=["a", "b"], spare_hosts=["c d"])


def test_a_lost_hosts_ranks_go_to_the_first_free_spare_that_answers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(spare_hosts, "probe_host", lambda host: host not in ("a", "c"))
    cluster = _Cluster(ranks_on([("a", 2), ("b", 2)]), ("c", "d"))
    assert move_to_spares(cluster, cluster.ranks, [0, 1]) == {"a": "d"}  # c does not answer
    assert cluster.launch_hosts == {0: "d", 1: "d", 2: "b", 3: "b"}


def test_a_dead_process_on_a_host_that_answers_stays_on_its_host(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(spare_hosts, "probe_host", lambda host: True)
    cluster = _Cluster(ranks_on([("a", 2), ("b", 2)]), ("c",))
    assert move_to_spares(cluster, cluster.ranks, [0, 1]) == {}
    assert cluster.launch_hosts == {0: "a", 1: "a", 2: "b", 3: "b"}


def test_no_spare_left_is_host_lost_saying_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(spare_hosts, "probe_host", lambda host: host == "b")
    cluster = _Cluster(ranks_on([("a", 2), ("b", 2)]), ("c",))
    with pytest.raises(HostLost, match=r"no spare host is left.*\['c'\]") as info:
        move_to_spares(cluster, cluster.ranks, [0, 1])
    assert info.value.host == "a" and info.value.ranks == [0, 1]
    without = _Cluster(ranks_on([("a", 2), ("b", 2)]), ())
    with pytest.raises(HostLost, match="shrink=True"):
        move_to_spares(without, without.ranks, [0, 1])
