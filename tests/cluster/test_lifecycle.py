"""A cluster of its own: start, stop, and nothing left running afterwards."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import psutil
import pytest

from tests.processes import alive
from workbench.cluster import Cluster

pytestmark = pytest.mark.engines


def _profile_logs() -> set[Path]:
    from IPython.paths import get_ipython_dir

    profile = Path(get_ipython_dir()) / "profile_default"
    return set((profile / "log").glob("*")) | set((profile / "security").glob("*"))


def test_start_stop_leaves_no_processes_and_no_files() -> None:
    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    logs = _profile_logs()
    with Cluster(n=2, backend="gloo") as cluster:
        assert cluster.state == "running"
        assert cluster.timings["total_s"] > 0
        started = [p.pid for p in me.children(recursive=True) if p.pid not in before]
        engine_pids = [r.pid for r in cluster.ranks]
        assert set(engine_pids) <= set(started)
        assert len(started) >= 3  # controller + 2 engines (+ schedulers, nannies)
    assert cluster.state == "stopped"
    assert alive(started) == []
    assert _profile_logs() - logs == set()  # engines<id>.json, connection files


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "via-controller"])
def test_a_stop_from_another_thread_ends_a_waiting_cell_with_the_clusters_error(
    own_cluster: Cluster, direct: bool, tmp_path: Path
) -> None:
    from workbench.errors import ClusterError

    own_cluster.execute("1")  # the cell sockets are open
    started = tmp_path / "started"
    cell = f"import pathlib, time\npathlib.Path({str(started)!r}).touch()\ntime.sleep(300)"
    raised: list[BaseException] = []

    def waiting() -> None:
        try:
            own_cluster.execute(cell, ranks=[0], timeout=600, direct=direct)
        except BaseException as exc:
            raised.append(exc)

    waiter = threading.Thread(target=waiting, daemon=True)  # a failure must not hang exit
    waiter.start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not started.exists():
        time.sleep(0.05)
    assert started.exists()
    own_cluster.stop_sync()
    waiter.join(60)
    assert not waiter.is_alive()
    [error] = raised
    assert type(error) is ClusterError, repr(error)
    assert "the cluster was stopped while ranks [0] were running this work" in str(error)
