"""A dead controller (the ipyparallel hub SIGKILLed) is noticed: every call fails fast with a
clear ClusterError, `%wb restart` rebuilds the whole cluster, and every process of the old
one (the controller's schedulers included) is gone. On a cluster of this test's own."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import psutil
import pytest

from tests.processes import BOUND_S, alive, raises_without_hanging
from workbench.cluster import Cluster

pytestmark = pytest.mark.engines


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank()


def _children() -> dict[int, str]:
    out = {}
    for proc in psutil.Process().children(recursive=True):
        try:
            out[proc.pid] = " ".join(proc.cmdline())
        except psutil.Error:
            continue
    return out


def test_dead_controller_fails_fast_and_restart_rebuilds(ipython_shell: Any, capsys: Any) -> None:
    before = set(_children())
    cluster = Cluster(n=2, backend="gloo")
    magics = ipython_shell._workbench_magics
    restarted: dict[int, str] = {}
    try:
        cluster.start_sync()
        assert magics.cluster is cluster  # the current cluster, for %wb too
        old = {p: c for p, c in _children().items() if p not in before}
        controller = cluster.pids()[0]
        # the controller and its scheduler processes: the ones a stop used to leave behind
        assert sum("ipyparallel.controller" in c for c in old.values()) >= 2, old
        os.kill(controller, signal.SIGKILL)
        deadline = time.monotonic() + BOUND_S
        while cluster.state != "broken" and time.monotonic() < deadline:
            time.sleep(0.1)
        assert cluster.state == "broken"

        for call in (
            cluster.status,
            lambda: cluster.run(os.getpid),
            lambda: cluster.execute("1"),
            cluster.recover_sync,
            lambda: ipython_shell.run_line_magic("wb", "status"),
            lambda: ipython_shell.run_cell_magic("wb", "", "1"),
            Cluster.current,
        ):
            message = str(raises_without_hanging(call))
            assert "controller" in message and "died" in message, message
            assert "%wb restart" in message and "restart_sync()" in message, message

        capsys.readouterr()
        ipython_shell.run_line_magic("wb", "restart")
        assert "restarted, 2 ranks ready" in capsys.readouterr().out
        assert cluster.state == "running"
        assert cluster.pids()[0] != controller
        assert cluster.run(_rank) == [0, 1]
        deadline = time.monotonic() + BOUND_S
        while alive(list(old)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert alive(list(old)) == [], {p: old[p] for p in alive(list(old))}
        restarted = {p: c for p, c in _children().items() if p not in before and p not in old}
    finally:
        cluster.stop_sync()
    assert alive(list(restarted)) == []
