"""A hung collective (its report and recovery) and the notebook's interrupt, on a cluster of
this module's own: recovery tears the process group down, which the shared one must not see."""

from __future__ import annotations

import _thread
import signal
import threading
from collections.abc import Iterator
from typing import Any

import psutil
import pytest

from tests.processes import raises_without_hanging
from workbench.cluster import Cluster
from workbench.errors import CollectiveTimeout

pytestmark = pytest.mark.engines

TIMEOUT = 2.0


@pytest.fixture(scope="module")
def own_cluster() -> Iterator[Cluster]:
    cluster = Cluster(n=2, backend="gloo")
    cluster.start_sync()
    try:
        yield cluster
    finally:
        cluster.stop_sync()


ALONE = """
import torch
if rank == 0:
    dist.all_reduce(torch.ones(8))
"""
TOGETHER = """
t = torch.ones(8)
dist.all_reduce(t)
float(t[0])
"""


def test_rank_that_never_joins_gets_a_hang_report_and_recovery(own_cluster: Cluster) -> None:
    with pytest.raises(CollectiveTimeout) as info:
        own_cluster.execute(ALONE, timeout=TIMEOUT)
    report = info.value.report
    assert report["pending"] == [0] and report["finished"] == [1]
    assert report["never_entered"] == [1]
    waiting = report["waiting"][0]
    assert waiting["op"] == "all_reduce" and waiting["bytes"] == 8 * 4
    assert waiting["source"] == "user" and waiting["group_size"] == 2
    text = str(info.value)
    assert "rank 0: waits in all_reduce (32 bytes" in text
    assert "rank 1: finished the cell, never entered all_reduce" in text
    assert own_cluster.state == "degraded" and own_cluster.stuck_ranks == [0]
    assert "ranks [0] are still blocked" in text and "%wb restart" in text

    # The next cell is refused at once, naming the rank to free and how (it used to queue
    # behind the blocked one for a minute and then fail with ipyparallel's TaskAborted).
    message = str(raises_without_hanging(lambda: own_cluster.execute(TOGETHER)))
    assert "ranks [0] are still blocked" in message and "waiting in all_reduce" in message
    assert "%wb restart" in message and "recover_sync()" in message
    # a cell on the free rank still runs
    assert own_cluster.execute("rank", ranks=[1])[0].execute_result["data"]["text/plain"] == "1"

    pids = [r.pid for r in own_cluster.ranks]
    recovery = own_cluster.recover_sync()
    assert recovery.freed == [0] and recovery.replaced == {}  # no engine lost
    assert [r.pid for r in own_cluster.ranks] == pids
    assert own_cluster.state == "running"
    results = own_cluster.execute(TOGETHER, timeout=30)
    assert [r.execute_result["data"]["text/plain"] for r in results] == ["2.0", "2.0"]


def test_timed_out_cell_in_python_code_leaves_the_cluster_usable(own_cluster: Cluster) -> None:
    with pytest.raises(CollectiveTimeout) as info:
        own_cluster.execute("import time\ntime.sleep(600)", timeout=TIMEOUT)
    assert "ranks [0, 1] were interrupted and are free" in str(info.value)
    assert own_cluster.state == "running" and own_cluster.stuck_ranks == []
    # the next cell runs now, not after the sleeping one (bounded by a generous timeout)
    results = own_cluster.execute(TOGETHER, timeout=60)
    assert [r.execute_result["data"]["text/plain"] for r in results] == ["2.0", "2.0"]


def test_interrupt_stops_a_running_cell_and_leaves_the_cluster_usable(
    own_cluster: Cluster,
) -> None:
    # interrupt_main does nothing unless Python handles SIGINT, and an earlier test (a
    # browser driver, a subprocess helper) may have left it ignored: install the default.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Timer(1.0, _thread.interrupt_main)  # what the notebook's stop does
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            # without the interrupt this cell would run for ten minutes
            own_cluster.execute("import time\nfor _ in range(6000):\n    time.sleep(0.1)")
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, previous)
    assert own_cluster.state == "running" and own_cluster.stuck_ranks == []
    results = own_cluster.execute(TOGETHER, timeout=30)
    assert all(r.ok for r in results)


def test_a_rank_blocked_after_a_ddp_run_is_freed_not_replaced(own_cluster: Cluster) -> None:
    """DDP keeps its gloo group and connections alive after the group is destroyed, so the
    healthy rank's teardown alone left rank 0 blocked until the group's timeout, and
    recovery replaced its engine (notebook 06 showed it); cutting the connections frees it."""
    from workbench.parallel import RunSpec
    from workbench.session.training import TrainingSession

    session = TrainingSession(own_cluster, RunSpec(model="mlp-tiny", strategy="dp"), timeout=60)
    session.run(2)
    session.close()
    with pytest.raises(CollectiveTimeout):
        own_cluster.execute(ALONE, timeout=TIMEOUT)
    assert own_cluster.stuck_ranks == [0]
    pids = [r.pid for r in own_cluster.ranks]
    recovery = own_cluster.recover_sync()
    assert recovery.freed == [0] and recovery.replaced == {} and recovery.killed == []
    assert [r.pid for r in own_cluster.ranks] == pids
    results = own_cluster.execute(TOGETHER, timeout=30)
    assert [r.execute_result["data"]["text/plain"] for r in results] == ["2.0", "2.0"]


def _cell_connections(cluster: Cluster) -> dict[int, set[tuple[Any, Any]]]:
    """Per rank: the engine's established connections on its cell socket (the kernel's)."""
    out = {}
    for r in cluster.ranks:
        port = cluster.dispatch.cells.pool.port(r.engine_id)
        out[r.rank] = {
            (tuple(c.laddr), tuple(c.raddr))
            for c in psutil.Process(r.pid).net_connections(kind="tcp")
            if c.status == psutil.CONN_ESTABLISHED and c.laddr.port == port
        }
    return out


def test_recovery_keeps_the_kernels_cell_connections(own_cluster: Cluster) -> None:
    """Freeing a stuck rank cuts the group's connections at the socket; the kernel's
    connection to each engine's cell socket is not the group's and stays as it was (it
    was cut too, and zmq reconnected from a new port)."""
    own_cluster.execute("1")  # the cell connections are made
    before = _cell_connections(own_cluster)
    assert all(len(conns) == 1 for conns in before.values()), before
    with pytest.raises(CollectiveTimeout):
        own_cluster.execute(ALONE, timeout=TIMEOUT)
    recovery = own_cluster.recover_sync()
    assert recovery.freed == [0] and recovery.replaced == {}
    assert _cell_connections(own_cluster) == before
    results = own_cluster.execute(TOGETHER, timeout=30)
    assert [r.execute_result["data"]["text/plain"] for r in results] == ["2.0", "2.0"]
