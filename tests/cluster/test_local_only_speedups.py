"""The start/stop speed-ups that only a local cluster may use, and that the multi-node
launchers must not get: engines forked beside the controller from one process that imports
torch once (engine/zygote.py; they wait for its connection file themselves, and have no
nanny), the 100 ms heartbeat, engines ending with ``os._exit``
and processes ended by local pid at stop."""

from __future__ import annotations

import asyncio
from concurrent.futures import Future
from typing import Any

import pytest

from workbench.cluster import Cluster, RankAssignment
from workbench.cluster.launch.fork import ForkEngineSetLauncher
from workbench.cluster.lifecycle import fast_stop, shutdown
from workbench.cluster.lifecycle.start_sequence import controller_args, make_ipp_cluster
from workbench.cluster.world import World
from workbench.engine import boot, process_group, zygote


def _engine_cmd(cluster: Cluster) -> Any:
    ipp_cluster = make_ipp_cluster(cluster.engines)
    return ipp_cluster, ipp_cluster.config.LocalEngineSetLauncher.get("engine_cmd")


def test_local_cluster_forks_its_engines_without_waiting_for_the_controller() -> None:
    ipp_cluster = make_ipp_cluster(Cluster(n=2).engines)
    assert ipp_cluster.engine_launcher_class is ForkEngineSetLauncher
    launcher = ForkEngineSetLauncher(config=ipp_cluster.config, n=2)
    assert launcher.engine_cmd[-1] == zygote.__file__
    args = launcher.find_args()
    assert args[3] == "2" and "--IPEngine.enable_nanny=False" in args
    assert ipp_cluster.send_engines_connection_env is False
    assert "--HeartMonitor.period=100" in ipp_cluster.controller_args
    assert ipp_cluster.controller_ip == "127.0.0.1"  # still loopback only


@pytest.mark.parametrize(
    # the mpi settings ask mpiexec which MPI it is (a subprocess): not for the unit tier
    "launcher",
    ["ssh", pytest.param("mpi", marks=pytest.mark.engines), "slurm"],
)
def test_multi_node_launchers_keep_ipyparallels_start_and_a_500ms_heartbeat(
    launcher: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster = Cluster(n=2, launcher=launcher, hosts=["node-a", "node-b"])
    cluster.engines._controller_address = "10.0.0.1"  # what start() would find from the hosts
    ipp_cluster, cmd = _engine_cmd(cluster)
    assert cmd is None
    assert ipp_cluster.send_engines_connection_env is True
    assert controller_args(launcher) == ["--HeartMonitor.period=500"]
    assert ipp_cluster.controller_args == ["--HeartMonitor.period=500"]


class _Done(Future[None]):
    """A finished request, as ipyparallel's AsyncResult (``get``)."""

    def __init__(self) -> None:
        super().__init__()
        self.set_result(None)

    def get(self, timeout: float | None = None) -> None:
        return self.result(timeout)


class _View:
    def __init__(self, calls: list[Any], targets: list[int]) -> None:
        self.calls, self.targets = calls, targets

    def apply_async(self, fn: Any, *args: Any) -> _Done:
        self.calls.append(fn)
        return _Done()


class _Client:
    def __init__(self) -> None:
        self.ids = [0, 1]
        self.calls: list[Any] = []
        self.closed = False

    def __getitem__(self, targets: list[int]) -> _View:
        return _View(self.calls, targets)

    def shutdown(self, **kwargs: Any) -> None:
        self.calls.append("shutdown")

    def close(self) -> None:
        self.closed = True


def _rank(rank: int) -> RankAssignment:
    # another host's engine: its pid means nothing here
    return RankAssignment(
        rank=rank, world_size=2, local_rank=0, local_world_size=1, node_rank=rank,
        num_nodes=2, engine_id=rank, host=f"node-{rank}", pid=4_000_000 + rank,
        master_addr="10.0.0.2", master_port=29500, backend="gloo", device="cpu", threads=1,
        pid_space="another-host",
    )  # fmt: skip


def _stop(launcher: str, monkeypatch: pytest.MonkeyPatch) -> tuple[_Client, list[Any]]:
    hosts = [] if launcher == "local" else ["node-a", "node-b"]
    cluster = Cluster(n=2, launcher=launcher, hosts=hosts)
    client = _Client()
    cluster.engines._client = client  # type: ignore[assignment]
    cluster._set_world(World(tuple([_rank(0), _rank(1)])))
    ended: list[Any] = []
    monkeypatch.setattr(fast_stop, "end", lambda procs, grace=0.5: ended.append(procs) or [])
    monkeypatch.setattr(cluster.engines, "process_tree", lambda ranks: [])
    monkeypatch.setattr(cluster.engines, "controller_lost", lambda: False)
    asyncio.run(shutdown.shutdown(cluster.engines, cluster.ranks, quiet=False))
    assert client.closed
    return client, ended


def test_local_stop_asks_engines_to_exit_at_once_and_ends_the_controller_by_pid(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    client, ended = _stop("local", monkeypatch)
    assert client.calls == [boot.exit_now]
    assert ended  # the controller's tree (empty here: none was started)


@pytest.mark.parametrize(
    # the mpi settings ask mpiexec which MPI it is (a subprocess): not for the unit tier
    "launcher",
    ["ssh", pytest.param("mpi", marks=pytest.mark.engines), "slurm"],
)
def test_multi_node_stop_is_polite_and_signals_no_pid(
    launcher: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    client, ended = _stop(launcher, monkeypatch)
    assert client.calls == [process_group.teardown_rank, "shutdown"]
    assert ended == []


def test_a_seeded_random_does_not_repeat_the_cluster_id() -> None:
    # A notebook's random.seed(0) set ipyparallel's id suffix alike in every kernel: two
    # kernels starting in the same second shared an id, and one's stop (which also ends
    # what carries IPP_CLUSTER_ID) ended the other's controller.
    import random

    ids, states, before = [], [], random.getstate()
    try:
        for _ in range(2):
            random.seed(0)
            ids.append(make_ipp_cluster(Cluster(n=2).engines).cluster_id)
            states.append(random.getstate())
    finally:  # this worker's other tests keep their stream
        random.setstate(before)
    assert ids[0] != ids[1]
    assert states[0] == states[1]  # the user's random stream is left as it was
    second, suffix = ids[0].split("-")
    assert second.isdigit() and len(suffix) == 8
