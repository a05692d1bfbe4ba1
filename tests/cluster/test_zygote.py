"""A local cluster's engines are forked from one process that imported torch once
(engine/zygote.py, cluster/launch/fork.py): each is its own process with its own random
stream, the forking process passes signals on and outlives them, and an engine that exits
while the cluster starts fails the start at once instead of at ``start_timeout``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from typing import Any

import psutil
import pytest

from tests.processes import BOUND_S, alive
from workbench.cluster import Cluster
from workbench.cluster.launch.fork import ForkEngineSetLauncher
from workbench.engine import zygote

pytestmark = pytest.mark.engines


def _draw() -> tuple[int, float, bool]:
    import random
    import sys

    return os.getpid(), random.random(), "torch" in sys.modules


def test_engines_are_forked_children_of_one_process_with_their_own_random_streams(
    own_cluster: Cluster,
) -> None:
    # A cluster of its own: on the shared one, an earlier seeded run (every run seeds its
    # ranks from its seed, DP ranks alike) has made the ranks' streams equal on purpose.
    cluster = own_cluster
    draws = cluster.run(_draw)
    pids = [pid for pid, _, _ in draws]
    assert len(set(pids)) == len(pids) == len(cluster.ranks)
    assert [r.pid for r in cluster.ranks] == pids
    parents = {psutil.Process(pid).ppid() for pid in pids}
    assert len(parents) == 1
    forker = psutil.Process(parents.pop())
    assert zygote.__file__ in forker.cmdline()
    assert forker.pid in cluster.pids()  # known to the watchdog and to the stop
    assert len({x for _, x, _ in draws}) == len(draws)  # a fork copies the random state
    assert all(has_torch for _, _, has_torch in draws)  # imported before the fork
    for eid in (r.engine_id for r in cluster.ranks):
        row = cluster.startup.engines[eid]
        assert row["process_started"] <= row["forked"] <= row["registered"]


# A stand-in for the forking process: n children that sleep, the parent waits for them.
_FORKER = textwrap.dedent(
    """
    import os, time
    kids = []
    for _ in range(2):
        pid = os.fork()
        if pid == 0:
            time.sleep(60)
            os._exit(0)
        kids.append(pid)
    for _ in kids:
        os.wait()
    """
)


def test_an_engine_that_exits_while_the_set_runs_is_noticed() -> None:
    proc = subprocess.Popen([sys.executable, "-c", _FORKER])
    try:
        launcher = ForkEngineSetLauncher(n=2)
        launcher.process = psutil.Process(proc.pid)
        deadline = time.monotonic() + BOUND_S
        while len(launcher.process.children()) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not launcher.engine_exited()
        os.kill(launcher.process.children()[0].pid, signal.SIGKILL)
        deadline = time.monotonic() + BOUND_S
        while not launcher.engine_exited() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert launcher.engine_exited()
    finally:
        for child in psutil.Process(proc.pid).children():
            child.kill()
        proc.kill()
        proc.wait(10)


def _forked_engines(cluster: Cluster) -> tuple[psutil.Process, list[psutil.Process]]:
    engines = [psutil.Process(r.pid) for r in cluster.ranks]
    return psutil.Process(engines[0].ppid()), engines


def test_the_forking_process_passes_sigterm_on_and_exits_after_its_engines() -> None:
    c = Cluster(n=2, backend="gloo")
    c.start_sync()
    forker: Any = None
    try:
        forker, engines = _forked_engines(c)
        forker.send_signal(signal.SIGTERM)
        gone, _ = psutil.wait_procs([*engines, forker], timeout=BOUND_S)
        assert {p.pid for p in gone} == {forker.pid, *(p.pid for p in engines)}
    finally:
        c.stop_sync()
        if forker is not None:
            assert alive([forker.pid]) == []
