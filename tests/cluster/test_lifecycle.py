"""A cluster of its own: start, stop, and nothing left running afterwards."""

from __future__ import annotations

import psutil
import pytest

from tests.processes import alive
from workbench.cluster import Cluster

pytestmark = pytest.mark.engines


def test_start_stop_leaves_no_processes() -> None:
    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    with Cluster(n=2, backend="gloo") as cluster:
        assert cluster.state == "running"
        assert cluster.timings["total_s"] > 0
        started = [p.pid for p in me.children(recursive=True) if p.pid not in before]
        engine_pids = [r.pid for r in cluster.ranks]
        assert set(engine_pids) <= set(started)
        assert len(started) >= 3  # controller + 2 engines (+ schedulers, nannies)
    assert cluster.state == "stopped"
    assert alive(started) == []
