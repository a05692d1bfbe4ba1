"""``%wb restart --shrink`` and ``%wb grow`` on a cluster with no training run: a killed
engine's rank is dropped and the survivors renumbered, then a new engine joins as the last
rank; every rank is in one working process group each time."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import pytest

from workbench.cluster import Cluster
from workbench.errors import EngineDied

pytestmark = [pytest.mark.engines, pytest.mark.slow]


def _world() -> tuple[int, int]:
    import torch.distributed as dist

    t = __import__("torch").ones(1)
    dist.all_reduce(t)
    return dist.get_rank(), int(t.item())


def test_restart_shrink_then_grow(ipython_shell: Any, capsys: Any) -> None:
    cluster = Cluster(n=3, backend="gloo")
    cluster.start_sync()
    try:
        assert ipython_shell._workbench_magics.cluster is cluster
        survivors = [r.engine_id for r in cluster.ranks if r.rank != 1]
        os.kill(cluster.ranks[1].pid, signal.SIGKILL)
        deadline = time.monotonic() + 60  # until the controller has noticed the death
        while cluster.state != "degraded" and time.monotonic() < deadline:
            try:
                cluster.ensure_alive()  # marks the cluster degraded once it has
            except EngineDied:
                break
            time.sleep(0.1)
        assert cluster.state == "degraded"
        capsys.readouterr()
        ipython_shell.run_line_magic("wb", "restart --shrink")
        out = capsys.readouterr().out
        assert "ranks [1] dropped" in out and "0->0, 2->1" in out and "2 ranks ready" in out
        assert [r.engine_id for r in cluster.ranks] == survivors
        assert cluster.run(_world) == [(0, 2), (1, 2)]

        ipython_shell.run_line_magic("wb", "grow 1")
        out = capsys.readouterr().out
        assert "ranks [2] added" in out and "3 ranks ready" in out
        assert [r.engine_id for r in cluster.ranks][:2] == survivors
        assert cluster.run(_world) == [(0, 3), (1, 3), (2, 3)]
        assert [r.local_rank for r in cluster.ranks] == [0, 1, 2]
    finally:
        cluster.stop_sync()
