"""A local cluster's replacement engine is forked from a standby that the engines' forker
forked after its engines (cluster/launch/standby.py and its engine side): no second torch import,
a new standby waits after each recovery, and the cluster's stop leaves none of them running."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import psutil
import pytest

from tests.processes import BOUND_S, alive
from workbench.cluster import Cluster
from workbench.cluster.launch import standby
from workbench.engine.standby import STANDBY_FLAG
from workbench.errors import EngineDied

pytestmark = [pytest.mark.engines, pytest.mark.slow]

DIES = (
    "import os, signal, time\nif rank == 1:\n    time.sleep(0.3)\n"
    "    os.kill(os.getpid(), signal.SIGKILL)\ndist.barrier()"
)
TOGETHER = "t = torch.ones(1)\ndist.all_reduce(t)\nfloat(t[0])"
# CPU seconds a fork has spent: a process that imported torch itself spent over a second.
FORKED_CPU_S = 0.5


def _text(result: object) -> str:
    return result.execute_result["data"]["text/plain"]  # type: ignore[attr-defined]


def _wait_gone(pids: list[int]) -> list[int]:
    deadline = time.monotonic() + BOUND_S
    while alive(pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return alive(pids)


def _standby(cluster: Cluster, not_pid: int | None = None) -> int:
    """The pid of the standby waiting for ``cluster`` (another than ``not_pid``)."""
    ahead = cluster.engines.standby
    assert ahead is not None
    deadline = time.monotonic() + BOUND_S
    while time.monotonic() < deadline:
        pid = standby.waiting_pid(ahead.directory)
        if pid is not None and pid != not_pid:
            return pid
        time.sleep(0.02)
    raise AssertionError("no standby waits")


def _replace_rank_1(cluster: Cluster) -> None:
    with pytest.raises(EngineDied):
        cluster.execute(DIES, timeout=60)
    report = cluster.recover_sync()
    assert list(report.replaced) == [1]
    assert [_text(r) for r in cluster.execute(TOGETHER, timeout=60)] == ["2.0", "2.0"]


def test_a_replacement_is_forked_from_the_forkers_fork_and_the_stop_ends_every_standby() -> None:
    cluster = Cluster(n=2, backend="gloo")
    cluster.start_sync()
    standbys: list[int] = []
    directory = cluster.engines.standby.directory if cluster.engines.standby else ""
    # inside the run directory, which the watchdog removes if the kernel dies unstopped
    assert os.path.dirname(directory) == cluster.engines.run_dir
    try:
        first = _standby(cluster)
        standbys.append(first)
        forker = psutil.Process(psutil.Process(cluster.ranks[0].pid).ppid())
        proc = psutil.Process(first)
        # a fork of the engines' forker (its command line), not a process of its own that
        # imported torch again (a second of CPU at least)
        assert proc.cmdline() == forker.cmdline() and STANDBY_FLAG in proc.cmdline()
        times = proc.cpu_times()
        assert times.user + times.system < FORKED_CPU_S
        _replace_rank_1(cluster)
        assert psutil.Process(cluster.ranks[1].pid).ppid() == first  # the standby forked it
        standbys.append(_standby(cluster, not_pid=first))  # and the next one waits
    finally:
        pids = cluster.pids()
        cluster.stop_sync()
    assert _wait_gone([*pids, *standbys]) == []
    assert not os.path.exists(directory)


def test_without_a_waiting_standby_a_fresh_forker_starts_and_forks_the_next_standby() -> None:
    cluster = Cluster(n=2, backend="gloo")
    cluster.start_sync()
    standbys: list[int] = []
    try:
        first = _standby(cluster)
        os.kill(first, signal.SIGKILL)
        assert _wait_gone([first]) == []
        _replace_rank_1(cluster)  # the launcher starts a forker of its own
        assert psutil.Process(cluster.ranks[1].pid).ppid() != first
        standbys.append(_standby(cluster, not_pid=first))
    finally:
        pids = cluster.pids()
        cluster.stop_sync()
    assert _wait_gone([*pids, *standbys]) == []


def test_a_standby_forked_before_the_environment_changed_is_not_taken(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its imports may have read what changed (a thread count): a fresh forker instead."""
    cluster = Cluster(n=2, backend="gloo")
    cluster.start_sync()
    try:
        first = _standby(cluster)
        monkeypatch.setenv("OMP_NUM_THREADS", "3")
        _replace_rank_1(cluster)
        assert psutil.Process(cluster.ranks[1].pid).ppid() != first
        assert _wait_gone([first]) == []  # ended, not left waiting
    finally:
        pids = cluster.pids()
        cluster.stop_sync()
    assert _wait_gone(pids) == []


def test_no_standby_directory_is_only_a_missed_speed_up(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    def refuse(path: str, mode: int = 0o666) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "mkfifo", refuse)
    with caplog.at_level("WARNING", logger="workbench.cluster"):
        assert standby.prepare("local", True, str(tmp_path)) is None
    assert "no standby forked" in caplog.text
    assert list(tmp_path.iterdir()) == []  # nothing left of it
    assert standby.prepare("ssh", True) is None  # replacements start on their host
