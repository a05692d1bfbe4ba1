"""``recover(cluster)``: back to a working process group after a dead or stuck engine.

0. Unresponsive engines (a process still there on this host, but stopped or missing the
   controller's heartbeats) are killed first: that closes their sockets, so a survivor
   blocked in a collective with them fails at once and is freed in step 1 instead of being
   replaced too. Engines on other hosts are never signalled from here.
1. Stuck ranks (left busy by a timeout, an interrupt or a peer's death) are interrupted
   (frees Python code) and the healthy ranks leave the process group: the group is torn
   down and its TCP connections are cut at the socket (``engine/group_sockets.py``), so a
   rank blocked in a collective with them fails at once, even where the group is still
   held (on torch 2.13 a DDP model keeps its gloo group and connections alive after
   ``destroy_process_group``). Each stuck rank that comes back leaves the group the same
   way at once, which frees a rank blocked on *it* (a chain). A rank still busy after
   ``FREE_GRACE_S`` has its engine killed and replaced like a dead one.
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

from workbench import validate
from workbench.cluster.elastic import decide_loss, shrunk_ranks
from workbench.cluster.processes import FROZEN, GONE, local_state
from workbench.cluster.ranks import relocalize
from workbench.cluster.rendezvous import check_reachable
from workbench.cluster.signals import signal_rank
from workbench.cluster.ssh_launcher import attach_nannies
from workbench.cluster.start_sequence import open_store, watch_engines
from workbench.engine import process_group
from workbench.errors import ClusterError

if TYPE_CHECKING:
    from workbench.cluster.cluster import Cluster

__all__ = ["FREE_GRACE_S", "RecoveryReport", "lost_ranks", "new_engines", "recover", "regroup"]

# How long a stuck rank may take to come back once its peers' sockets are closed. Freeing
# itself is immediate (the collective fails at once); what takes time is the reply's trip
# through the engine, the controller and the client, which on a loaded machine took more
# than 2 s. A rank that is still busy after this is killed and replaced, so a short grace
# makes the outcome depend on the machine's load; the wait ends as soon as every rank is back.
FREE_GRACE_S = 10.0


@dataclass(slots=True)
class RecoveryReport:
    """What ``recover`` did: engines replaced (rank -> (old, new) engine id), ranks freed
    from a collective without losing their engine, ranks whose engine had to be killed
    because it stayed stuck, ranks whose engine did not respond (killed, then replaced)."""

    replaced: dict[int, tuple[int, int]] = field(default_factory=dict)
    freed: list[int] = field(default_factory=list)
    killed: list[int] = field(default_factory=list)
    unresponsive: list[int] = field(default_factory=list)
    dropped: list[int] = field(default_factory=list)  # a shrink: old ranks left out
    renumbered: dict[int, int] = field(default_factory=dict)  # a shrink: old -> new rank
    added: list[int] = field(default_factory=list)  # a grow: the new ranks
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
        if self.dropped:
            parts.append(
                f"ranks {self.dropped} dropped; the {len(self.renumbered)} left renumbered "
                + ", ".join(f"{a}->{b}" for a, b in sorted(self.renumbered.items()))
            )
        if self.added:
            parts.append(f"ranks {self.added} added")
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


def lost_ranks(cluster: Cluster) -> list[int]:
    """Ranks whose engine is gone or does not respond (what a recovery replaces or drops)."""
    ids = set(cluster.client_unchecked().ids)
    gone = (r.rank for r in cluster.ranks if _gone(cluster, r.rank, ids))
    return sorted({*_unresponsive(cluster, ids), *gone})


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
    client = cluster.client_unchecked()
    await asyncio.gather(*(signal_rank(client, cluster.ranks[r], signal.SIGINT) for r in ranks))


def _leave_group(cluster: Cluster, rank: int) -> Any:
    """Tear the group down on ``rank`` and cut its connections (``teardown_rank(sever=True)``):
    a rank blocked in a collective with it fails at once, whoever still holds the group."""
    client = cluster.client_unchecked()
    return client[cluster.ranks[rank].engine_id].apply_async(process_group.teardown_rank, True)


async def _free_stuck(cluster: Cluster, dead: list[int], report: RecoveryReport) -> list[int]:
    """Free stuck ranks; returns the ranks whose engines had to be killed."""
    client = cluster.client_unchecked()
    # a survivor of a death that has failed out of its collective since is no longer stuck
    # (the death returned without waiting for it): it is healthy, as _ensure_free finds too
    given_up = cluster._given_up
    stuck = {
        r: f
        for r, f in cluster._stuck.items()
        if r not in dead and (r in given_up or not f.ready())
    }
    if not stuck:
        return []
    healthy = [r.rank for r in cluster.ranks if r.rank not in dead and r.rank not in stuck]
    await _interrupt(cluster, sorted(stuck))  # frees ranks busy in Python code
    leaving = {r: _leave_group(cluster, r) for r in healthy}
    deadline = time.monotonic() + FREE_GRACE_S
    while True:
        # A stuck rank that comes back leaves the group at once too: another stuck rank may
        # be blocked on *it* (a chain), and its own failure does not close its connections.
        for r in sorted(stuck):
            if stuck[r].ready() and r not in leaving:
                leaving[r] = _leave_group(cluster, r)
        if all(f.ready() for f in stuck.values()) or time.monotonic() >= deadline:
            break
        await asyncio.sleep(0.02)
    killed = [r for r, f in sorted(stuck.items()) if not f.ready()]
    report.freed = [r for r in sorted(stuck) if r not in killed]
    try:  # every rank that stays has left the old group before the new one is made
        await _gather(list(leaving.values()), timeout=15)
    except Exception as exc:  # setup_rank tears down again before it joins
        cluster_log(f"leaving the old group failed: {exc!r}")
    # killed on the engine's own host: by pid here, else through its nanny (signals.py)
    await asyncio.gather(*(signal_rank(client, cluster.ranks[r], signal.SIGKILL) for r in killed))
    # wait until the controller has noticed (the kernel's engine watch or the nanny
    # reports it)
    ids = {cluster.ranks[r].engine_id for r in killed}
    deadline = time.monotonic() + 15
    while ids & set(client.ids) and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    return killed


def cluster_log(message: str) -> None:
    import logging

    logging.getLogger("workbench.cluster").debug(message)


async def _start_replacements(cluster: Cluster, dead: list[int]) -> None:
    """Start one engine per dead rank: on the dead engine's own host where the launcher
    can place engines (ssh, slurm), else wherever the launcher puts them."""
    ipp_cluster = cluster.ipp_cluster
    if ipp_cluster is None:
        raise ClusterError(
            f"ranks {dead} died on an external ipyparallel cluster (profile/cluster_id), "
            "which the workbench did not start and cannot add engines to; start "
            "replacement engines yourself, then cluster.restart_sync()"
        )
    launcher = cluster.config.launcher
    if launcher == "mpi":
        # one mpiexec holds every engine: nothing can be added to it, and mpiexec ends the
        # whole job when one rank dies
        raise ClusterError(
            f"ranks {dead} died, and launcher='mpi' started every engine as one mpiexec "
            "job, which cannot take a replacement engine; restart the whole job with "
            "`%wb restart --full` (cluster.restart_sync()) and load the last checkpoint"
        )
    if launcher not in ("ssh", "slurm"):
        await ipp_cluster.start_engines(len(dead))
        return
    # ssh: on the host entry that started it; slurm: a 1-engine job on its node
    per_host: dict[str, int] = {}
    for rank in dead:
        host = cluster.launch_hosts.get(cluster.ranks[rank].engine_id)
        if not host:
            raise ClusterError(
                f"rank {rank}: the {launcher} host that started its engine is unknown"
            )
        per_host[host] = per_host.get(host, 0) + 1
    await asyncio.gather(
        *(ipp_cluster.start_engines(k, engines={host: k}) for host, k in per_host.items())
    )


async def new_engines(cluster: Cluster, count: int, start: Any) -> list[tuple[int, dict[str, Any]]]:
    """Await ``start`` (which starts ``count`` engines), wait until they register and return
    each one's id and facts (pid, host, address, launch host)."""
    client = cluster.client_unchecked()
    before = set(client.ids)
    await start
    cluster._write_pidfile()  # the watchdog covers the new engines from their launch
    deadline = time.monotonic() + cluster.config.start_timeout
    while len(set(client.ids) - before) < count:
        if time.monotonic() > deadline:
            raise ClusterError(
                f"{count} new engine(s) did not register within "
                f"start_timeout={cluster.config.start_timeout}s"
            )
        await asyncio.sleep(0.02)
    new_ids = sorted(set(client.ids) - before)[:count]
    infos = await _gather(
        [client[eid].apply_async(process_group.engine_info) for eid in new_ids],
        timeout=cluster.config.start_timeout,
    )
    facts = await _gather(
        [client[eid].apply_async(*cluster.address_call()) for eid in new_ids],
        timeout=cluster.config.start_timeout,
    )
    new = [(eid, {**info, **fact}) for eid, info, fact in zip(new_ids, infos, facts, strict=True)]
    if cluster.ipp_cluster is not None:
        attach_nannies(cluster.ipp_cluster, dict(new))
    watch_engines(cluster, new)
    return new


async def _replace(cluster: Cluster, dead: list[int], report: RecoveryReport) -> None:
    """Start ``len(dead)`` engines and give them the dead ranks (same host first)."""
    if not dead:
        return
    new = await new_engines(cluster, len(dead), _start_replacements(cluster, dead))
    # each dead rank takes a new engine started by the same launch host when there is one
    free = list(new)
    for rank in sorted(dead):
        old = cluster.ranks[rank]
        want = cluster.launch_hosts.get(old.engine_id)
        pick = next((x for x in free if x[1].get("launch_host") == want), free[0])
        free.remove(pick)
        eid, info = pick
        cluster.launch_hosts[eid] = info.get("launch_host", "")
        report.replaced[rank] = (old.engine_id, eid)
        cluster.ranks[rank] = replace(
            old, engine_id=eid, pid=info["pid"], host=info["host"], pid_space=info["pid_space"]
        )
        if rank == 0 and info["host"] != old.host and old.master_addr != "127.0.0.1":
            cluster.ranks = [replace(r, master_addr=info["address"]) for r in cluster.ranks]
    # a replacement on another host changes who is local to whom (LOCAL_RANK, devices)
    cluster.ranks = relocalize(cluster.ranks)


async def recover(
    cluster: Cluster, *, shrink: bool = False, drop: tuple[int, ...] = ()
) -> RecoveryReport:
    """See the module docstring. Works from ``running`` too (re-creates the group).

    ``shrink=True``: dead ranks are dropped instead of replaced, the survivors renumbered
    0..n-1 (``cluster/elastic.py``); ``drop`` names survivors to leave out too (their
    engines are killed: a TP/PP partner of a lost rank cannot train alone). Without it, a
    lost host (every engine gone, the host silent) raises ``HostLost``."""
    validate.boolean("shrink", shrink)
    drop = tuple(validate.rank_list(drop, cluster.world_size)) if drop else ()
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
    if not shrink:
        decide_loss(cluster.ranks, dead)  # a lost host has nowhere to put a replacement
    if shrink:
        killed = await _free_stuck(cluster, dead, report)
        await _drop(cluster, sorted({*dead, *killed}), sorted(set(drop) - set(dead)), report)
    else:
        # The dead ranks' replacements start while stuck ranks are freed: a new engine's
        # start (its forker imports torch) is most of a recovery, freeing is reply trips.
        killed, _ = await asyncio.gather(
            _free_stuck(cluster, dead, report), _replace(cluster, dead, report)
        )
        await _replace(cluster, killed, report)  # ranks that stayed stuck (rare)
    report.killed = killed
    await regroup(cluster)
    report.seconds = time.perf_counter() - started
    cluster.timings["recover_s"] = report.seconds
    return report


async def _drop(cluster: Cluster, gone: list[int], also: list[int], report: RecoveryReport) -> None:
    """Leave ``gone`` (and the survivors ``also``, killed here) out; renumber the rest."""
    client = cluster.client_unchecked()
    await asyncio.gather(*(signal_rank(client, cluster.ranks[r], signal.SIGKILL) for r in also))
    old = {r.engine_id: r.rank for r in cluster.ranks}
    old_master = cluster.ranks[0]
    cluster.ranks = shrunk_ranks(cluster.ranks, [*gone, *also])
    report.dropped = sorted([*gone, *also])
    report.renumbered = {old[r.engine_id]: r.rank for r in cluster.ranks}
    first = cluster.ranks[0]
    if first.engine_id != old_master.engine_id and first.master_addr != "127.0.0.1":
        # rank 0 (the rendezvous host) is gone: the new rank 0's host holds the store
        fact = await _gather([client[first.engine_id].apply_async(*cluster.address_call())], 60)
        cluster.ranks = [replace(r, master_addr=fact[0]["address"]) for r in cluster.ranks]


async def regroup(cluster: Cluster) -> None:
    """A new process group on a fresh port, on every rank of ``cluster.ranks``."""
    client = cluster.client_unchecked()
    if cluster.ranks[0].num_nodes > 1:  # every rank proves it reaches MASTER_ADDR (and
        # points gloo at the interface that does) before the store opens
        await check_reachable(client, cluster.ranks)
    port = await open_store(cluster, cluster.ranks[0])
    cluster.ranks = [replace(r, master_port=int(port)) for r in cluster.ranks]
    futures = [
        client[r.engine_id].apply_async(
            process_group.setup_rank,
            r.as_dict(),
            cluster.config.init_timeout,
            0,
            cluster.status_dir_of(r),
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
    cluster.group_closed = False  # a fresh group on every rank
