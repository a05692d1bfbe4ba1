"""A lost host told from a dead process while a call waits (``cluster/hosts/host_loss.py``), with
no engines: a stand-in controller's engine ids and a stand-in probe of the host."""

from __future__ import annotations

import socket
import threading

import pytest

from tests.cluster.rank_tables import ranks_on
from workbench.cluster.dispatch.hang import lost_engines_error
from workbench.cluster.dispatch.stuck import StuckRanks
from workbench.cluster.hosts.host_loss import host_lost
from workbench.errors import EngineDied, HostLost
from workbench.session.rank_failures import error_fields


class _Client:
    def __init__(self, ids: list[int]) -> None:
        self.ids = list(ids)


def test_a_silent_host_whose_engines_all_left_is_lost_naming_it_and_its_ranks() -> None:
    ranks = ranks_on([("node-a", 2), ("node-b", 2)])
    found = host_lost(ranks, [3], _Client([0, 1]), probe=lambda h: h != "node-b", wait_s=0)
    assert isinstance(found, HostLost)
    assert found.host == "node-b" and found.ranks == [2, 3]
    assert "'node-b'" in str(found) and "shrink=True" in str(found)


def test_a_host_that_answers_has_a_dead_process_not_a_lost_host() -> None:
    ranks = ranks_on([("node-a", 2), ("node-b", 2)])
    asked: list[str] = []

    def probe(host: str) -> bool:
        asked.append(host)
        return True

    assert host_lost(ranks, [2, 3], _Client([0, 1]), probe=probe, wait_s=0) is None
    assert asked == ["node-b"]


def test_the_rest_of_a_silent_hosts_engines_are_waited_for() -> None:
    """The controller drops a silent host's engines a heartbeat apart: the first death is
    seen while its neighbour is still registered; the loss is named once both are gone."""
    ranks = ranks_on([("node-a", 2), ("node-b", 2)])
    client = _Client([0, 1, 2])
    timer = threading.Timer(0.3, lambda: client.ids.remove(2))
    timer.start()
    try:
        found = host_lost(ranks, [3], client, probe=lambda h: False, wait_s=30)
    finally:
        timer.cancel()
    assert isinstance(found, HostLost) and found.ranks == [2, 3]


def test_a_silent_host_with_a_live_engine_is_not_called_lost() -> None:
    ranks = ranks_on([("node-a", 2), ("node-b", 2)])
    assert host_lost(ranks, [3], _Client([0, 1, 2]), probe=lambda h: False, wait_s=0) is None


def test_this_host_is_never_probed() -> None:
    ranks = ranks_on([(socket.gethostname(), 2)])

    def probe(host: str) -> bool:
        raise AssertionError(f"probed {host}")

    assert host_lost(ranks, [1], _Client([0]), probe=probe, wait_s=0) is None


def test_a_call_that_finds_a_remote_engine_dead_probes_its_host(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The dispatch's error for dead ranks: ``HostLost`` when the host is silent,
    ``EngineDied`` when it answers or without a client to ask."""
    from workbench.cluster.hosts import host_loss

    ranks = ranks_on([("node-b", 1)])
    silent: set[str] = set()
    monkeypatch.setattr(host_loss, "probe_host", lambda host: host not in silent)
    assert type(lost_engines_error(ranks, [0], None, _Client([]))) is EngineDied
    silent.add("node-b")
    assert type(lost_engines_error(ranks, [0], None)) is EngineDied
    lost = lost_engines_error(ranks, [0], None, _Client([]))
    assert isinstance(lost, HostLost) and lost.host == "node-b" and lost.ranks == [0]


def test_host_lost_keeps_its_host_when_reraised_with_more_words() -> None:
    """The session re-raises errors with where the run was: the host must survive that."""
    exc = HostLost.of("node-b", [2, 3])
    again = type(exc)(f"{exc}\nthe run was at step 4", **error_fields(exc))
    assert isinstance(again, HostLost) and again.host == "node-b" and again.ranks == [2, 3]
    with pytest.raises(HostLost, match="step 4"):
        raise again


def test_still_pending_names_the_stuck_ranks_whose_request_is_pending() -> None:
    class _Future:
        def __init__(self, done: bool) -> None:
            self.done = done

        def ready(self) -> bool:
            return self.done

    stuck = StuckRanks()
    assert stuck.still_pending() == []
    stuck.held = {0: _Future(False), 1: _Future(True), 3: _Future(False)}
    assert stuck.still_pending() == [0, 3]


@pytest.mark.engines  # runs `sh -c "exit 255"` in place of an ssh: a process
def test_an_ssh_engine_on_a_host_that_went_silent_is_gone(monkeypatch: pytest.MonkeyPatch) -> None:
    """The launcher's watch of a remote engine (an ssh that waits for its pid): an ssh that
    fails (exit 255) to a host that does not answer means the engine went with its host;
    to a host that answers it stays an error (the engine may still run there)."""
    from workbench.cluster.launch import ssh as ssh_launcher

    el = ssh_launcher.FastSSHEngineLauncher(hostname="node-b")
    el.ssh_cmd, el.ssh_args, el.pid = ["sh", "-c", "exit 255", "ssh"], [], 4242
    monkeypatch.setattr(ssh_launcher, "probe_host", lambda host: host != "node-b")
    assert el.wait_one(1.0) == 0
    monkeypatch.setattr(ssh_launcher, "probe_host", lambda host: True)
    with pytest.raises(RuntimeError, match="ssh node-b"):
        el.wait_one(1.0)


def test_under_mpi_one_ranks_death_is_the_end_of_the_job_not_lost_hosts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # mpiexec ends every rank when one dies: every engine leaves the controller, and a
    # probe may find the hosts as silent as a lost one. Neither a shrink nor a spare can
    # join a job that ended: the way on is a full restart.
    import workbench.cluster.hosts.host_loss as host_loss

    monkeypatch.setattr(host_loss, "probe_host", lambda host, port=22: False)
    ranks = ranks_on([("wbn1", 2), ("wbn2", 2)])
    error = lost_engines_error(ranks, [3], None, _Client([]), launcher="mpi")
    assert not isinstance(error, HostLost)
    assert isinstance(error, EngineDied) and error.ranks == [3]
    text = str(error)
    assert "rank 3" in text and "mpiexec" in text and "ended" in text
    assert "`%wb restart --full`" in text and "checkpoint" in text
    assert "shrink" not in text and "is lost" not in text
