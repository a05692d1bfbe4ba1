"""Spare hosts under Slurm and Slurm's node state as a lost-host signal
(``cluster/hosts/slurm_nodes.py``, ``cluster/hosts/spare_hosts.py``), with no engines and no
Slurm: what ``scontrol`` / ``sinfo`` printed on the multi-node bed (``slurm_bed_capture.txt``), a
stand-in cluster and stand-in probes."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests.cluster.rank_tables import ranks_on
from tests.cluster.test_spare_hosts import _Cluster
from workbench.cluster import Cluster
from workbench.cluster.hosts import slurm_nodes, spare_hosts
from workbench.cluster.hosts.host_loss import host_lost
from workbench.cluster.hosts.slurm_nodes import (
    host_answers,
    parse_node_state,
    takes_no_jobs,
    usable_nodes,
)
from workbench.cluster.hosts.spare_hosts import move_to_spares, start_args
from workbench.cluster.launch.launchers import LauncherOptions
from workbench.config import ANY_SPARE
from workbench.errors import ConfigError, HostLost

CAPTURE = Path(__file__).with_name("slurm_bed_capture.txt")


def _captured() -> dict[str, tuple[int, str]]:
    rows = [line.split("\t") for line in CAPTURE.read_text().splitlines()]
    return {r[0]: (int(r[1]), r[2]) for r in rows if not r[0].startswith("#")}


# ----------------------------------------------------------------- settings
def test_slurm_takes_named_spares_and_any() -> None:
    named = Cluster(n=4, launcher="slurm", hosts="wbmn1,wbmn2", spare_hosts="wbmn3")
    assert named.config.spare_hosts == ("wbmn3",)
    anywhere = Cluster(n=4, launcher="slurm", hosts=["wbmn1", "wbmn2"], spare_hosts="any")
    assert anywhere.config.spare_hosts == (ANY_SPARE,)
    assert Cluster(n=4, launcher="slurm", spare_hosts="any").config.spare_hosts == ("any",)


@pytest.mark.parametrize(
    ("launcher", "spare", "words"),
    [
        ("ssh", "any", r"spare_hosts=\('any',\) is not valid: 'any' .* needs launcher='slurm'"),
        ("slurm", "any,c", r"spare_hosts=\('any', 'c'\) .* takes no other host; .* 'any' alone"),
        ("mpi", "c", r"launcher='mpi' cannot start .*; use spare_hosts with launcher='ssh' or"),
        ("slurm", "a", r"'a' is also in hosts"),
    ],
)
def test_a_bad_spare_spec_is_one_error_before_anything_starts(
    launcher: str, spare: str, words: str
) -> None:
    with pytest.raises(ConfigError, match=words):
        Cluster(n=4, launcher=launcher, hosts=["a", "b"], spare_hosts=spare)


def test_the_magic_refuses_spare_hosts_any_without_slurm(ipython_shell: Any) -> None:
    from IPython.core.error import UsageError

    line = "start --launcher ssh --hosts a,b --spare-hosts any"
    with pytest.raises(UsageError, match=r"spare_hosts=\('any',\) .* needs launcher='slurm'"):
        ipython_shell.run_line_magic("wb", line)


# ----------------------------------------------------------------- node state
def test_scontrols_states_as_the_bed_printed_them() -> None:
    seen = {k: parse_node_state(text) for k, (rc, text) in _captured().items() if rc == 0}
    assert seen["idle"] == {"IDLE"}
    assert seen["down_not_added"] == {"DOWN"}
    assert seen["down_not_responding"] == {"DOWN", "NOT_RESPONDING"}
    assert seen["idle_drain"] == {"IDLE", "DRAIN"}
    assert seen["down_removed"] == {"DOWN"}
    shows = ("idle", "down_not_added", "down_not_responding", "idle_drain", "down_removed")
    assert [k for k in shows if not takes_no_jobs(seen[k])] == ["idle"]
    assert seen["sinfo"] is None  # no State= in it: Slurm said nothing
    assert parse_node_state(_captured()["not_found"][1]) is None
    assert parse_node_state("NodeName=x State=IDLE* Reason=x") == {"IDLE", "NOT_RESPONDING"}


def test_a_node_taken_down_reads_in_service_until_slurmd_timeout() -> None:
    """What the bed showed every 3 s after wbmn2 went down whole: MIXED (stale) for ~25 s,
    then not responding, then DOWN; so the sshd probe is the fast signal, Slurm the extra."""
    words = _captured()["states_after_take_down"][1].split()
    states = [parse_node_state(w) for w in words]
    assert states[0] == {"MIXED"} and not takes_no_jobs(states[0])
    assert states[-1] == {"DOWN", "NOT_RESPONDING"}
    first_bad = next(i for i, s in enumerate(states) if takes_no_jobs(s))
    assert first_bad > 3 and all(takes_no_jobs(s) for s in states[first_bad:])


def test_free_nodes_are_idle_or_mixed_and_responding() -> None:
    sinfo = _captured()["sinfo"][1].replace(";", "\n")
    assert usable_nodes(sinfo, ()) == ["wbmn1", "wbmn3"]  # wbmn2 down*
    assert usable_nodes(sinfo, {"wbmn1"}) == ["wbmn3"]
    assert usable_nodes("a mix*\nb drain\nc mix\nc mix\n", ()) == ["c"]


def test_silent_sshd_is_lost_without_asking_slurm() -> None:
    def state(host: str) -> frozenset[str]:
        raise AssertionError("Slurm asked although the probe had decided")

    assert host_answers("n", probe=lambda h: False, state=state) is False


@pytest.mark.parametrize(
    ("label", "answers"),
    [("idle", True), ("down_not_responding", False), ("idle_drain", False), ("not_found", True)],
)
def test_an_answering_host_is_lost_when_slurm_has_it_out_of_service(
    label: str, answers: bool
) -> None:
    rc, text = _captured()[label]
    state = parse_node_state(text) if rc == 0 else None  # as node_state reads it
    assert host_answers("n", probe=lambda h: True, state=lambda h: state) is answers


def test_slurm_down_with_sshd_up_makes_host_lost_name_the_host() -> None:
    ranks = ranks_on([("node-a", 2), ("node-b", 2)])
    down = parse_node_state(_captured()["down_not_responding"][1])

    def probe(host: str) -> bool:
        return host_answers(host, probe=lambda h: True, state=lambda h: down)

    client = SimpleNamespace(ids=[0, 1])  # the controller: ranks 2, 3 gone
    found = host_lost(ranks, [2, 3], client, probe=probe, wait_s=0)
    assert isinstance(found, HostLost) and found.host == "node-b" and found.ranks == [2, 3]
    assert "Slurm has its node out of service" in str(found)


# ----------------------------------------------------------------- spares
def test_a_slurm_spare_must_answer_and_be_in_service(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(spare_hosts, "probe_host", lambda host: host != "a")
    states = {"c": {"IDLE", "DRAIN"}, "d": {"IDLE"}, "b": {"MIXED"}}
    monkeypatch.setattr(slurm_nodes, "node_state", lambda host: frozenset(states[host]))
    cluster = _Cluster(ranks_on([("a", 2), ("b", 2)]), ("c", "d"), launcher="slurm")
    assert move_to_spares(cluster, cluster.ranks, [0, 1]) == {"a": "d"}  # c is drained
    assert cluster.launch_hosts == {0: "d", 1: "d", 2: "b", 3: "b"}
    assert start_args(cluster, "d", 2) == {"engines": {"d": 2}}  # a job pinned to d


def test_any_lets_slurm_pick_a_node_the_cluster_does_not_run_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(spare_hosts, "probe_host", lambda host: host != "b")
    monkeypatch.setattr(slurm_nodes, "node_state", lambda host: frozenset({"MIXED"}))
    asked: list[tuple[str, set[str]]] = []

    def free(partition: str, exclude: set[str]) -> list[str]:
        asked.append((partition, set(exclude)))
        return ["c"]

    monkeypatch.setattr(slurm_nodes, "free_nodes", free)
    cluster = _Cluster(ranks_on([("a", 2), ("b", 2)]), (ANY_SPARE,), launcher="slurm")
    assert move_to_spares(cluster, cluster.ranks, [2, 3]) == {"b": ANY_SPARE}
    assert asked == [("wb", {"a", "b"})]
    assert cluster.lost_hosts == {"b"}
    assert start_args(cluster, ANY_SPARE, 2) == {
        "engines": {},  # no --nodelist: Slurm places the jobs
        "sbatch_args": ["--partition=wb", "--exclude=a,b"],
    }


@pytest.mark.parametrize(
    "theirs",
    [["--exclude=z,n[1-3,7]"], ["--exclude", "z,n[1-3,7]"], ["-x", "z,n[1-3,7]"], ["-xz,n[1-3,7]"]],
)
def test_any_merges_the_users_own_exclude_into_its_one(
    monkeypatch: pytest.MonkeyPatch, theirs: list[str]
) -> None:
    """sbatch keeps only the last ``--exclude``: the user's nodes must stay excluded beside
    the cluster's own, in every spelling sbatch takes, and Slurm is not asked for them."""
    monkeypatch.setattr(spare_hosts, "probe_host", lambda host: host != "b")
    monkeypatch.setattr(slurm_nodes, "node_state", lambda host: frozenset({"MIXED"}))
    asked: list[set[str]] = []
    monkeypatch.setattr(
        slurm_nodes, "free_nodes", lambda partition, exclude: asked.append(set(exclude)) or ["c"]
    )
    cluster = _Cluster(ranks_on([("a", 2), ("b", 2)]), (ANY_SPARE,), launcher="slurm")
    cluster.launcher_options = LauncherOptions(
        partition="wb", sbatch_args=("--mem=1G", *theirs, "--qos=low")
    )
    assert move_to_spares(cluster, cluster.ranks, [2, 3]) == {"b": ANY_SPARE}
    assert asked == [{"a", "b", "z", "n[1-3,7]"}]
    assert start_args(cluster, ANY_SPARE, 2)["sbatch_args"] == [
        "--partition=wb",
        "--mem=1G",
        "--qos=low",
        "--exclude=a,b,z,n[1-3,7]",
    ]


def test_any_with_no_free_node_is_host_lost_saying_no_spare_is_left(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(spare_hosts, "probe_host", lambda host: host != "b")
    monkeypatch.setattr(slurm_nodes, "node_state", lambda host: None)
    monkeypatch.setattr(slurm_nodes, "free_nodes", lambda partition, exclude: [])
    cluster = _Cluster(ranks_on([("a", 2), ("b", 2)]), (ANY_SPARE,), launcher="slurm")
    with pytest.raises(HostLost, match=r"no spare host is left .*\['any'\]"):
        move_to_spares(cluster, cluster.ranks, [2, 3])


def test_an_answering_host_slurm_has_down_goes_to_the_spare(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every host's sshd answers; Slurm has ``a`` DOWN: its ranks go to the spare (under
    ssh the same ranks would stay to be replaced on ``a``)."""
    monkeypatch.setattr(spare_hosts, "probe_host", lambda host: True)
    down = parse_node_state(_captured()["down_not_responding"][1])
    monkeypatch.setattr(
        slurm_nodes, "node_state", lambda host: down if host == "a" else frozenset({"IDLE"})
    )
    cluster = _Cluster(ranks_on([("a", 2), ("b", 2)]), ("c",), launcher="slurm")
    assert move_to_spares(cluster, cluster.ranks, [0, 1]) == {"a": "c"}
    under_ssh = _Cluster(ranks_on([("a", 2), ("b", 2)]), ("c",))
    assert move_to_spares(under_ssh, under_ssh.ranks, [0, 1]) == {}
