"""``recover(cluster)``: back to a working process group after a dead or stuck engine.

0. Unresponsive engines (a process still there on this host, but stopped or missing the
   controller's heartbeats) are killed first: that closes their sockets, so a survivor
   blocked in a collective with them fails at once and is freed in step 1 instead of being
   replaced too. Engines on other hosts are never signalled from here.
1. Stuck ranks (left busy by a timeout, an interrupt or a peer's death) are interrupted
   (frees Python code) and the process group is torn down on the healthy ranks: when that
   destroys their group objects, the sockets close and a blocked collective fails at once.
   (A group still referenced on a healthy rank, e.g. by a training run's device mesh, may
   keep its sockets open.) A rank still busy after ``FREE_GRACE_S`` has its engine killed
   and replaced like a dead one.
2. Dead engines are replaced by new ones started through the same ipyparallel cluster;
   each new engine takes the dead rank's number. Surviving engines keep their rank and
   their namespace (but their training run, bound to the old process group, is closed).
3. The process group is re-created on a fresh port on every rank.

A training session then rebuilds its run and loads its last checkpoint
(``TrainingSession.recover``).
"""

from __future__ import annotations

import asyncio
import signal
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import psutil

from workbench.cluster import engine as engine_fns
from workbench.cluster.processes import FROZEN, GONE, local_state, signal_local
from workbench.errors import ClusterError

if TYPE_CHECKING:
    from workbench.cluster.cluster import Cluster

__all__ = ["FREE_GRACE_S", "RecoveryReport", "recover"]

FREE_GRACE_S = 2.0


@dataclass(slots=True)
class RecoveryReport:
    """What ``recover`` did: engines replaced (rank -> (old, new) engine id), ranks freed
    from a collective without losing their engine, ranks whose engine had to be killed
    because it stayed stuck, ranks whose engine did not respond (killed, then replaced)."""

    replaced: dict[int, tuple[int, int]] = field(default_factory=dict)
    freed: list[int] = field(default_factory=list)
    killed: list[int] = field(default_factory=list)
    unresponsive: list[int] = field(default_factory=list)
    seconds: float = 0.0

    def __str__(self) -> str:
        parts = [
            f"rank {rank}: engine {old} replaced by engine {new}"
            for rank, (old, new) in sorted(self.replaced.items())
        ]
        if self.unresponsive:
            parts.append(
                f"ranks {self.unresponsive} did not respond and had their engines replaced"
            )
        if self.killed:
            parts.append(f"ranks {self.killed} were stuck and had their engines replaced")
        # ``freed`` is left out on purpose: a freed rank keeps its engine exactly like a rank
        # that was never stuck, and whether a survivor was caught inside a collective when
        # its peer died is a race; the report says what changed, the same on every run.
        if not parts:
            parts.append("no engine needed replacing")
        return "; ".join(parts) + "; process group re-created on a fresh port"


def _unresponsive(cluster: Cluster, ids: set[int]) -> list[int]:
    """Local ranks whose process is still there but stopped, or gone from the controller."""
    out = []
    for r in cluster.ranks:
        state = local_state(r.host, r.pid)
        if state is not None and state != GONE and (r.engine_id not in ids or state in FROZEN):
            out.append(r.rank)
    return out


def _gone(cluster: Cluster, r_rank: int, ids: set[int]) -> bool:
    """The engine left the controller, or (on this host) its process exited."""
    r = cluster.ranks[r_rank]
    return r.engine_id not in ids or local_state(r.host, r.pid) == GONE


async def _kill_local(cluster: Cluster, ranks: list[int]) -> None:
    """SIGKILL the (local) engines of ``ranks`` and wait until their processes are gone."""
    procs = []
    for rank in ranks:
        try:
            proc = psutil.Process(cluster.ranks[rank].pid)
            proc.kill()  # works on a stopped process too
            procs.append(proc)
        except psutil.Error:
            continue
    await asyncio.to_thread(psutil.wait_procs, procs, 15)


async def _gather(futures: list[Any], timeout: float) -> list[Any]:
    return await asyncio.wait_for(
        asyncio.gather(*(asyncio.wrap_future(f) for f in futures)), timeout=timeout
    )


async def _interrupt(cluster: Cluster, ranks: list[int]) -> None:
    for rank in ranks:
        r = cluster.ranks[rank]
        try:
            if cluster.ipp_cluster is None:
                raise ClusterError("external cluster")
            await cluster.ipp_cluster.signal_engine(signal.SIGINT, r.engine_id)
        except Exception:
            signal_local(r.host, r.pid, signal.SIGINT)


async def _free_stuck(cluster: Cluster, dead: list[int], report: RecoveryReport) -> list[int]:
    """Free stuck ranks; returns the ranks whose engines had to be killed."""
    client = cluster.client_unchecked()
    stuck = {r: f for r, f in cluster._stuck.items() if r not in dead}
    if not stuck:
        return []
    healthy = [r for r in cluster.ranks if r.rank not in dead and r.rank not in stuck]
    await _interrupt(cluster, sorted(stuck))  # frees ranks busy in Python code
    if healthy:
        try:
            await _gather(
                [client[r.engine_id].apply_async(engine_fns.teardown_rank) for r in healthy],
                timeout=15,
            )
        except Exception as exc:  # then the stuck ranks are killed below
            cluster_log(f"teardown on healthy ranks failed: {exc!r}")
    deadline = time.monotonic() + FREE_GRACE_S
    while time.monotonic() < deadline and not all(f.ready() for f in stuck.values()):
        await asyncio.sleep(0.02)
    killed = [r for r, f in sorted(stuck.items()) if not f.ready()]
    report.freed = [r for r in sorted(stuck) if r not in killed]
    for rank in killed:
        r = cluster.ranks[rank]
        if not signal_local(r.host, r.pid, signal.SIGKILL) and local_state(r.host, r.pid) is None:
            raise ClusterError(
                f"rank {rank} (engine {r.engine_id} on {r.host}, pid {r.pid} there) stays "
                "stuck and runs on another host, whose processes are not signalled from "
                "here; stop that engine on its host, then run `%wb restart` again"
            )
    # wait until the controller has noticed (the nanny reports it)
    ids = {cluster.ranks[r].engine_id for r in killed}
    deadline = time.monotonic() + 15
    while ids & set(client.ids) and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    return killed


def cluster_log(message: str) -> None:
    import logging

    logging.getLogger("workbench.cluster").debug(message)


async def _replace(cluster: Cluster, dead: list[int], report: RecoveryReport) -> None:
    """Start ``len(dead)`` engines and give them the dead ranks."""
    if not dead:
        return
    ipp_cluster = cluster.ipp_cluster
    if ipp_cluster is None:
        raise ClusterError(
            f"ranks {dead} died on an external ipyparallel cluster (profile/cluster_id), "
            "which the workbench did not start and cannot add engines to; start "
            "replacement engines yourself, then cluster.restart_sync()"
        )
    client = cluster.client_unchecked()
    before = set(client.ids)
    await ipp_cluster.start_engines(len(dead))
    cluster._write_pidfile()  # the watchdog covers the new engines from their launch
    deadline = time.monotonic() + cluster.config.start_timeout
    while len(set(client.ids) - before) < len(dead):
        if time.monotonic() > deadline:
            raise ClusterError(
                f"replacement engines for ranks {dead} did not register within "
                f"start_timeout={cluster.config.start_timeout}s"
            )
        await asyncio.sleep(0.02)
    new_ids = sorted(set(client.ids) - before)[: len(dead)]
    infos = await _gather(
        [client[eid].apply_async(engine_fns.engine_info) for eid in new_ids],
        timeout=cluster.config.start_timeout,
    )
    for rank, eid, info in zip(sorted(dead), new_ids, infos, strict=True):
        old = cluster.ranks[rank]
        report.replaced[rank] = (old.engine_id, eid)
        cluster.ranks[rank] = replace(old, engine_id=eid, pid=info["pid"], host=info["host"])
        if rank == 0 and info["host"] != old.host and old.master_addr != "127.0.0.1":
            cluster.ranks = [replace(r, master_addr=info["address"]) for r in cluster.ranks]


async def recover(cluster: Cluster) -> RecoveryReport:
    """See the module docstring. Works from ``running`` too (re-creates the group)."""
    cluster.check_controller()  # a dead controller needs a full restart, not a recovery
    if cluster.state not in ("running", "degraded") or not cluster.ranks:
        raise ClusterError("the cluster is not running; start it with `%wb start`")
    started = time.perf_counter()
    report = RecoveryReport()
    client = cluster.client_unchecked()
    ids = set(client.ids)
    report.unresponsive = _unresponsive(cluster, ids)
    await _kill_local(cluster, report.unresponsive)
    dead = sorted(
        {*report.unresponsive, *(r.rank for r in cluster.ranks if _gone(cluster, r.rank, ids))}
    )
    killed = await _free_stuck(cluster, dead, report)
    report.killed = killed
    await _replace(cluster, sorted({*dead, *killed}), report)

    port = await cluster._open_store(cluster.ranks[0])
    cluster.ranks = [replace(r, master_port=int(port)) for r in cluster.ranks]
    futures = [
        client[r.engine_id].apply_async(
            engine_fns.setup_rank, r.as_dict(), cluster.config.init_timeout, 0, cluster.run_dir
        )
        for r in cluster.ranks
    ]
    try:
        await _gather(futures, timeout=cluster.config.init_timeout + 10)
    except Exception as exc:
        raise ClusterError(f"re-creating the process group failed: {exc}") from exc
    cluster._stuck = {}
    cluster._given_up = set()
    cluster.state = "running"
    cluster._write_pidfile()
    report.seconds = time.perf_counter() - started
    cluster.timings["recover_s"] = report.seconds
    cluster.group_closed = False  # a fresh group on every rank
    return report
