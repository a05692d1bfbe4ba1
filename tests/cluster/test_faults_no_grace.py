"""The fault paths do not sit out a fixed grace for ranks known to wait in a collective.

Each test stretches the grace it must not wait (``_DEATH_GRACE_S`` after a death,
``_INTERRUPT_GRACE_S`` after a timeout's interrupt) to far beyond the bound it checks: on
code that still waited it out, the error would come only after that grace. The bounds are
generous (they hold with both cores busy); speed itself is measured in
``benchmarks/fault_paths_bench.py``."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from workbench.cluster import Cluster
from workbench.cluster.dispatch import rank_dispatch as dispatch
from workbench.errors import CollectiveTimeout, EngineDied

pytestmark = [pytest.mark.engines, pytest.mark.slow]

STRETCHED_S = 300.0  # a grace nobody may wait for
BOUND_S = 30.0  # far above a loaded machine's seconds, below the grace and gloo's own 60 s
# rank 0 waits in a barrier for rank 1, which sleeps in Python code
BARRIER = "import time\nif rank == 1:\n    time.sleep(600)\ndist.barrier()"
TOGETHER = "t = torch.ones(1)\ndist.all_reduce(t)\nfloat(t[0])"


def _text(result: object) -> str:
    return result.execute_result["data"]["text/plain"]  # type: ignore[attr-defined]


def test_a_death_returns_without_waiting_for_a_survivor_in_a_collective(
    own_cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dispatch, "_DEATH_GRACE_S", STRETCHED_S)
    victim = own_cluster.ranks[1]
    own_cluster.execute("1", timeout=60)
    # rank 0 must be in the barrier (its status file says so) when rank 1 dies
    timer = threading.Timer(2.0, os.kill, (victim.pid, signal.SIGKILL))
    start = time.monotonic()
    timer.start()
    try:
        with pytest.raises(EngineDied, match=r"engine died: rank 1 \(engine") as info:
            own_cluster.execute(BARRIER, timeout=STRETCHED_S)
    finally:
        timer.cancel()
    assert time.monotonic() - start < BOUND_S
    assert info.value.ranks == [1]
    assert own_cluster.state == "degraded"
    # the survivor fails out of its barrier; recovery replaces only the dead engine
    survivor = own_cluster.ranks[0].pid
    recovery = own_cluster.recover_sync()
    assert list(recovery.replaced) == [1]
    assert own_cluster.ranks[0].pid == survivor
    assert [_text(r) for r in own_cluster.execute(TOGETHER, timeout=60)] == ["2.0", "2.0"]


def test_a_timeout_reports_without_waiting_out_the_interrupt_for_a_blocked_rank(
    own_cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dispatch, "INTERRUPT_GRACE_S", STRETCHED_S)
    start = time.monotonic()
    with pytest.raises(CollectiveTimeout) as info:
        own_cluster.execute(BARRIER, timeout=3.0)
    assert time.monotonic() - start < BOUND_S
    # the same report as with the full grace: rank 0 waits, rank 1 was interrupted
    report = info.value.report
    assert report["pending"] == [0, 1] and report["finished"] == []
    assert report["waiting"][0]["op"] == "barrier" and report["never_entered"] == [1]
    text = str(info.value)
    assert "ranks [1] were interrupted and are free for the next cell" in text
    assert "ranks [0] are still blocked" in text
    assert own_cluster.stuck_ranks == [0]
    recovery = own_cluster.recover_sync()
    assert recovery.freed == [0] and recovery.replaced == {}
    assert [_text(r) for r in own_cluster.execute(TOGETHER, timeout=60)] == ["2.0", "2.0"]
