"""Self-fencing on real engines (``workbench.engine.fencing``), on a local cluster of the
test's own with the fence started by hand and a short bound: an engine busy in a long cell
(its main thread held in Python code, or blocked in a collective) is not fenced; once the
controller stops answering (its processes SIGSTOPped: no heartbeat), every engine ends
itself. A local cluster does not fence by itself."""

from __future__ import annotations

import time

import psutil
import pytest

from tests.processes import BOUND_S, alive
from workbench.cluster import Cluster
from workbench.engine import fencing

pytestmark = pytest.mark.engines

AFTER_S = 3.0


def _busy(seconds: float) -> float:
    """Hold the main thread in Python code (the GIL taken between switches)."""
    import time

    end = time.monotonic() + seconds
    n = 0
    while time.monotonic() < end:
        n += 1
    return seconds


def _late_all_reduce(late_s: float) -> float:
    """Rank 0 enters an all-reduce at once and waits in it (in gloo, the main thread
    blocked) until rank 1 joins ``late_s`` later."""
    import time

    import torch
    import torch.distributed as dist

    if dist.get_rank() == 1:
        time.sleep(late_s)
    t = torch.ones(1)
    dist.all_reduce(t)
    return float(t.item())


def test_busy_engine_is_not_fenced_and_a_silent_controller_fences_all(
    own_cluster: Cluster,
) -> None:
    cluster = own_cluster
    pids = [r.pid for r in cluster.ranks]
    assert [f["fencing"] for f in cluster.run(fencing.running)] == [False, False]  # local
    assert cluster.run(fencing.start, AFTER_S) == [True, True]

    # busy for 4 bounds: the fence thread still hears every ping
    assert cluster.run(_busy, 4 * AFTER_S, ranks=[0], timeout=4 * AFTER_S + BOUND_S) == [
        4 * AFTER_S
    ]
    assert alive(pids) == pids
    # rank 0 blocked in a collective for 4 bounds: not fenced either
    assert cluster.run(_late_all_reduce, 4 * AFTER_S, timeout=4 * AFTER_S + BOUND_S) == [2.0, 2.0]
    assert alive(pids) == pids
    assert [f["fencing"] for f in cluster.run(fencing.running)] == [True, True]

    # the controller and its processes (the heart monitor is one): stopped, it sends no
    # heartbeat, as a controller the engines' host is cut off from
    hub = psutil.Process(cluster.pids()[0])
    controller = [hub, *hub.children(recursive=True)]
    for proc in controller:
        proc.suspend()
    try:
        stopped = time.monotonic()
        while alive(pids) and time.monotonic() - stopped < AFTER_S + BOUND_S:
            time.sleep(0.1)
        fenced_s = time.monotonic() - stopped
        print(f"engines fenced {fenced_s:.1f} s after the controller went silent")
        assert alive(pids) == [], f"engines {alive(pids)} still run {fenced_s:.1f} s after"
        assert fenced_s >= AFTER_S * 0.9  # the bound, not a kill at the first missed ping
    finally:
        for proc in controller:
            proc.resume()
