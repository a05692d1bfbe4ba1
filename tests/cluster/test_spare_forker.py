"""A local cluster's replacement engine is forked from a spare forker that already imported
torch (cluster/spare_forker.py), a new spare waits after each recovery, and the cluster's
stop leaves none of them running."""

from __future__ import annotations

import os
import signal
import time
from types import SimpleNamespace

import psutil
import pytest

from tests.processes import BOUND_S, alive
from workbench.cluster import Cluster, warm_start
from workbench.engine import zygote
from workbench.errors import EngineDied

pytestmark = [pytest.mark.engines, pytest.mark.slow]

DIES = (
    "import os, signal, time\nif rank == 1:\n    time.sleep(0.3)\n"
    "    os.kill(os.getpid(), signal.SIGKILL)\ndist.barrier()"
)
TOGETHER = "t = torch.ones(1)\ndist.all_reduce(t)\nfloat(t[0])"


def _text(result: object) -> str:
    return result.execute_result["data"]["text/plain"]  # type: ignore[attr-defined]


def _wait_gone(pids: list[int]) -> list[int]:
    deadline = time.monotonic() + BOUND_S
    while alive(pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return alive(pids)


def test_a_replacement_is_forked_from_the_spare_and_the_stop_ends_every_spare() -> None:
    cluster = Cluster(n=2, backend="gloo")
    cluster.start_sync()
    spares: list[int] = []
    try:
        spare = cluster.engines.spare
        assert spare is not None and spare.alive()
        assert zygote.__file__ in psutil.Process(spare.process.pid).cmdline()
        spares.append(spare.process.pid)
        with pytest.raises(EngineDied):
            cluster.execute(DIES, timeout=60)
        report = cluster.recover_sync()
        assert list(report.replaced) == [1]
        # the new rank 1 is the spare's child: forked, not a new process importing torch
        assert psutil.Process(cluster.ranks[1].pid).ppid() == spare.process.pid
        again = cluster.engines.spare  # and the next replacement has its own spare
        assert again is not None and again.alive() and again.process.pid != spare.process.pid
        spares.append(again.process.pid)
        assert [_text(r) for r in cluster.execute(TOGETHER, timeout=60)] == ["2.0", "2.0"]
    finally:
        pids = cluster.pids()
        cluster.stop_sync()
    assert _wait_gone([*pids, *spares]) == []
    assert warm_start.warm("engines") is None


def test_a_spare_killed_while_it_waits_is_replaced_by_a_fresh_start() -> None:
    cluster = Cluster(n=2, backend="gloo")
    cluster.start_sync()
    try:
        spare = cluster.engines.spare
        assert spare is not None
        os.kill(spare.process.pid, signal.SIGKILL)
        spare.process.wait(BOUND_S)
        with pytest.raises(EngineDied):
            cluster.execute(DIES, timeout=60)
        report = cluster.recover_sync()  # the launcher starts a forker of its own
        assert list(report.replaced) == [1]
        assert [_text(r) for r in cluster.execute(TOGETHER, timeout=60)] == ["2.0", "2.0"]
    finally:
        pids = cluster.pids()
        cluster.stop_sync()
    assert _wait_gone(pids) == []


def test_a_spare_that_cannot_start_is_only_a_missed_speed_up(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """No process can be started (e.g. out of pids): the cluster keeps going without one."""
    from workbench.cluster import spare_forker

    def refuse(role: str) -> None:
        raise OSError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(warm_start, "spawn", refuse)
    monkeypatch.setattr(warm_start, "warm", lambda role: None)
    engines = SimpleNamespace(config=SimpleNamespace(launcher="local"), owns=True, spare=None)
    with caplog.at_level("WARNING", logger="workbench.cluster"):
        spare_forker.keep_ready(engines)  # type: ignore[arg-type]
    assert engines.spare is None
    assert "no spare forker" in caplog.text
