"""A frozen engine (SIGSTOP) in the middle of a collective is reported as unresponsive, not
dead, naming its rank; recovery replaces only it and frees the rank that waited for it.
On a cluster of this test's own."""

from __future__ import annotations

import contextlib
import os
import signal
import threading

import psutil
import pytest

from tests.processes import alive
from workbench.cluster import Cluster
from workbench.errors import EngineUnresponsive

pytestmark = pytest.mark.engines

LOOP = """
t = torch.ones(4)
while True:
    dist.all_reduce(t)
"""
TOGETHER = """
t = torch.ones(8)
dist.all_reduce(t)
float(t[0])
"""


def test_stopped_engine_is_unresponsive_and_only_it_is_replaced(own_cluster: Cluster) -> None:
    survivor, frozen = (r.pid for r in own_cluster.ranks)
    timer = threading.Timer(2.0, os.kill, (frozen, signal.SIGSTOP))
    timer.start()
    try:
        # The bound only keeps a broken build from hanging; detection itself is not timed.
        with pytest.raises(EngineUnresponsive) as info:
            own_cluster.execute(LOOP, timeout=120)
        message = str(info.value)
        assert info.value.ranks == [1]
        assert message.startswith("engine unresponsive: rank 1 (")
        assert f"pid {frozen}" in message and "stopped" in message
        assert "died" not in message
        assert own_cluster.status()[1]["state"] == "unresponsive"

        report = own_cluster.recover_sync()
        assert report.unresponsive == [1]
        assert set(report.replaced) == {1}  # only the frozen engine
        assert report.killed == []
        assert "did not respond" in str(report)
        assert own_cluster.ranks[0].pid == survivor
        assert own_cluster.ranks[1].pid != frozen
        assert alive([frozen]) == []
        results = own_cluster.execute(TOGETHER, timeout=60)
        assert [r.execute_result["data"]["text/plain"] for r in results] == ["2.0", "2.0"]
    finally:
        timer.cancel()
        with contextlib.suppress(psutil.Error):  # never leave a stopped process behind
            psutil.Process(frozen).kill()
