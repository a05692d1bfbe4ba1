"""A pid is meaningful only on its own host: engines on other hosts are never inspected,
signalled or reaped from here (unit tests, no engines)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import psutil
import pytest

from workbench.cluster import Cluster
from workbench.cluster.processes import FROZEN, GONE, local_state, signal_local
from workbench.cluster.ranks import EngineInfo, assign_ranks
from workbench.cluster.world import World

HERE = socket.gethostname()


def test_remote_pid_is_not_looked_at_or_signalled() -> None:
    me = os.getpid()  # a pid that exists here: a remote engine may well have the same one
    assert local_state("node-b", me) is None
    assert signal_local("node-b", me, signal.SIGSTOP) is False
    assert psutil.Process(me).status() not in FROZEN


@pytest.mark.engines
def test_local_states_running_stopped_gone() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert local_state(HERE, child.pid) not in (None, GONE, *FROZEN)
        assert signal_local(HERE, child.pid, signal.SIGSTOP)
        for _ in range(600):  # a stop takes effect asynchronously: up to 30 s
            if local_state(HERE, child.pid) in FROZEN:
                break
            time.sleep(0.05)
        assert local_state(HERE, child.pid) in FROZEN
    finally:
        child.kill()
        child.wait(10)
    assert local_state(HERE, child.pid) == GONE


def test_cluster_pids_leave_out_engines_on_other_hosts() -> None:
    cluster = Cluster(n=2, launcher="ssh", hosts=["node-a", "node-b"])
    cluster.engines._ipp = object()  # type: ignore[assignment]  # no launchers to list
    cluster._set_world(
        World(
            tuple(
                assign_ranks(
                    [
                        EngineInfo(engine_id=0, host=HERE, pid=os.getpid()),
                        EngineInfo(
                            engine_id=1, host="node-b", pid=1
                        ),  # pid 1 there is not init here
                    ]
                )
            )
        )
    )
    assert cluster.pids() == [os.getpid()]
