"""``recover(engines, world)``: back to a working process group after a dead or stuck engine.

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

A training session then rebuilds its run and loads its checkpoint (``TrainingSession.recover``).
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import psutil

from workbench import validate
from workbench.cluster.hosts.host_loss import mpi_job_ended, sever_stuck
from workbench.cluster.hosts.rendezvous import check_reachable
from workbench.cluster.hosts.spare_hosts import move_to_spares, start_args
from workbench.cluster.lifecycle.engines import EngineSet
from workbench.cluster.lifecycle.registration import gather, new_engines
from workbench.cluster.lifecycle.signals import signal_rank
from workbench.cluster.lifecycle.start_sequence import open_store, setup_requests, wait_joined
from workbench.cluster.processes import FROZEN, GONE, local_state
from workbench.cluster.ranks import RankAssignment, relocalize
from workbench.cluster.state import LIVE, StateLink
from workbench.cluster.world import Commit, World
from workbench.engine import process_group
from workbench.errors import ClusterError

__all__ = ["FREE_GRACE_S", "RecoveryReport", "lost_ranks", "recover", "regroup"]

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


def _unresponsive(engines: EngineSet, ranks: Sequence[RankAssignment], ids: set[int]) -> list[int]:
    """Local ranks whose process is still there but stopped, or gone from the controller."""
    out = []
    for r in ranks:
        state = local_state(r.host, r.pid)
        if state is not None and state != GONE and (r.engine_id not in ids or state in FROZEN):
            out.append(r.rank)
    return out


def lost_ranks(engines: EngineSet, ranks: Sequence[RankAssignment]) -> list[int]:
    """Ranks whose engine is gone or does not respond (what a recovery replaces or drops)."""
    ids = set(engines.client_unchecked().ids)
    gone = (r.rank for r in ranks if _gone(engines, ranks, r.rank, ids))
    return sorted({*_unresponsive(engines, ranks, ids), *gone})


def _gone(engines: EngineSet, ranks: Sequence[RankAssignment], r_rank: int, ids: set[int]) -> bool:
    """The engine left the controller, or (on this host) its process exited."""
    r = ranks[r_rank]
    return r.engine_id not in ids or local_state(r.host, r.pid) == GONE


async def _kill_local(ranks: Sequence[RankAssignment], which: list[int]) -> None:
    """SIGKILL the (local) engines of ranks ``which`` and wait until their processes are gone."""
    procs = []
    for rank in which:
        try:
            proc = psutil.Process(ranks[rank].pid)
            proc.kill()  # works on a stopped process too
            procs.append(proc)
        except psutil.Error:
            continue
    await asyncio.to_thread(psutil.wait_procs, procs, 15)


async def _interrupt(engines: EngineSet, ranks: Sequence[RankAssignment], which: list[int]) -> None:
    client = engines.client_unchecked()
    await asyncio.gather(*(signal_rank(client, ranks[r], signal.SIGINT) for r in which))


def _leave_group(engines: EngineSet, ranks: Sequence[RankAssignment], rank: int) -> Any:
    """Tear the group down on ``rank`` and cut its connections (``teardown_rank(sever=True)``):
    a rank blocked in a collective with it fails at once, whoever still holds the group."""
    client = engines.client_unchecked()
    return client[ranks[rank].engine_id].apply_async(process_group.teardown_rank, True)


async def _free_stuck(
    engines: EngineSet,
    ranks: Sequence[RankAssignment],
    dead: list[int],
    blocked: tuple[Mapping[int, Any], set[int]],
) -> tuple[list[int], list[int]]:
    """Free stuck ranks; returns the ranks freed and those whose engines had to be killed.
    ``blocked``: the dispatcher's stuck ranks (rank -> its unfinished request) and those
    given up."""
    client = engines.client_unchecked()
    # a survivor of a death that has failed out of its collective since is no longer stuck
    # (the death returned without waiting for it): it is healthy, as _ensure_free finds too
    held, given_up = blocked
    stuck = {r: f for r, f in held.items() if r not in dead and (r in given_up or not f.ready())}
    if not stuck:
        return [], []
    healthy = [r.rank for r in ranks if r.rank not in dead and r.rank not in stuck]
    await _interrupt(engines, ranks, sorted(stuck))  # frees ranks busy in Python code
    # a rank blocked on a silent host: its control thread cuts the group's connections
    sever_stuck(engines.client_unchecked(), [ranks[r].engine_id for r in stuck])
    leaving = {r: _leave_group(engines, ranks, r) for r in healthy}
    deadline = time.monotonic() + FREE_GRACE_S
    while True:
        # A stuck rank that comes back leaves the group at once too: another stuck rank may
        # be blocked on *it* (a chain), and its own failure does not close its connections.
        for r in sorted(stuck):
            if stuck[r].ready() and r not in leaving:
                leaving[r] = _leave_group(engines, ranks, r)
        if all(f.ready() for f in stuck.values()) or time.monotonic() >= deadline:
            break
        await asyncio.sleep(0.02)
    killed = [r for r, f in sorted(stuck.items()) if not f.ready()]
    freed = [r for r in sorted(stuck) if r not in killed]
    try:  # every rank that stays has left the old group before the new one is made
        await gather(list(leaving.values()), timeout=15)
    except Exception as exc:  # setup_rank tears down again before it joins
        cluster_log(f"leaving the old group failed: {exc!r}")
    # killed on the engine's own host: by pid here, else through its nanny (signals.py)
    await asyncio.gather(*(signal_rank(client, ranks[r], signal.SIGKILL) for r in killed))
    # wait until the controller has noticed (the kernel's engine watch or the nanny
    # reports it)
    ids = {ranks[r].engine_id for r in killed}
    deadline = time.monotonic() + 15
    while ids & set(client.ids) and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    return freed, killed


def cluster_log(message: str) -> None:
    import logging

    logging.getLogger("workbench.cluster").debug(message)


async def _start_replacements(
    engines: EngineSet, ranks: Sequence[RankAssignment], dead: list[int]
) -> None:
    """Start one engine per dead rank: on the dead engine's own host where the launcher
    can place engines (ssh, slurm), else wherever the launcher puts them."""
    ipp_cluster = engines.ipp
    if ipp_cluster is None:
        raise ClusterError(
            f"ranks {dead} died on an external ipyparallel cluster (profile/cluster_id), "
            "which the workbench did not start and cannot add engines to; start "
            "replacement engines yourself, then cluster.restart_sync()"
        )
    launcher = engines.config.launcher
    if launcher == "mpi":  # one mpiexec holds every engine: nothing can be added to it
        raise mpi_job_ended(dead)
    if launcher not in ("ssh", "slurm"):
        await ipp_cluster.start_engines(len(dead))
        return
    # ssh: on the host entry that started it; slurm: a 1-engine job on its node
    per_host: dict[str, int] = {}
    for rank in dead:
        host = engines.launch_hosts.get(ranks[rank].engine_id)
        if not host:
            raise ClusterError(
                f"rank {rank}: the {launcher} host that started its engine is unknown"
            )
        per_host[host] = per_host.get(host, 0) + 1
    starts = {h: start_args(engines, h, k) for h, k in per_host.items()}  # "any": Slurm picks
    await asyncio.gather(*(ipp_cluster.start_engines(per_host[h], **a) for h, a in starts.items()))


async def _replace(
    engines: EngineSet, world: World, dead: list[int], report: RecoveryReport, commit: Commit
) -> World:
    """Start ``len(dead)`` engines and give them the dead ranks (same host first); the
    world with them (committed)."""
    if not dead:
        return world
    start = _start_replacements(engines, world.ranks, dead)
    new = await new_engines(engines, world.ranks, len(dead), start)
    # each dead rank takes a new engine started by the same launch host when there is one
    free = list(new)
    ranks = list(world.ranks)
    for rank in sorted(dead):
        old = ranks[rank]
        want = engines.launch_hosts.get(old.engine_id)
        pick = next((x for x in free if x[1].get("launch_host") == want), free[0])
        free.remove(pick)
        eid, info = pick
        engines.started_by({eid: info.get("launch_host", "")})
        report.replaced[rank] = (old.engine_id, eid)
        ranks[rank] = replace(
            old, engine_id=eid, pid=info["pid"], host=info["host"], pid_space=info["pid_space"]
        )
        if rank == 0 and info["host"] != old.host and old.master_addr != "127.0.0.1":
            ranks = [replace(r, master_addr=info["address"]) for r in ranks]
    # a replacement on another host changes who is local to whom (LOCAL_RANK, devices)
    world = world.replaced(relocalize(ranks))
    commit(world)
    return world


async def recover(
    engines: EngineSet,
    world: World,
    blocked: tuple[Mapping[int, Any], set[int]],
    state: StateLink,
    commit: Commit,
    *,
    shrink: bool = False,
    drop: tuple[int, ...] = (),
) -> RecoveryReport:
    """See the module docstring. Works from ``running`` too (re-creates the group).
    ``blocked``: the dispatcher's stuck ranks (rank -> unfinished request) and the ranks
    of those it gave up on; the caller forgets them once this returns. ``state``: the
    cluster's (read only; the cluster is running again once this returns). Each new world
    (replacements in, ranks dropped, the new port) goes to ``commit`` as it is made.

    ``shrink=True``: dead ranks are dropped instead of replaced, the survivors renumbered
    0..n-1 (``cluster/elastic.py``); ``drop`` names survivors to leave out too (their
    engines are killed: a TP/PP partner of a lost rank cannot train alone). Without it, a
    lost host (every engine gone, the host silent) raises ``HostLost``."""
    validate.boolean("shrink", shrink)
    ranks = world.ranks
    drop = tuple(validate.rank_list(drop, len(ranks))) if drop else ()
    state.check()  # a dead controller needs a full restart, not a recovery
    if state.last() not in LIVE or not ranks:
        raise ClusterError("the cluster is not running; start it with `%wb start`")
    started = time.perf_counter()
    report = RecoveryReport()
    client = engines.client_unchecked()
    ids = set(client.ids)
    report.unresponsive = _unresponsive(engines, ranks, ids)
    await _kill_local(ranks, report.unresponsive)
    dead = sorted(
        {*report.unresponsive, *(r.rank for r in ranks if _gone(engines, ranks, r.rank, ids))}
    )
    if dead and engines.config.launcher == "mpi":  # mpiexec ended every rank: no host lost
        raise mpi_job_ended(dead)
    if not shrink:
        move_to_spares(engines, ranks, dead)  # a lost host's ranks: to a spare, or HostLost
    if shrink:
        report.freed, killed = await _free_stuck(engines, ranks, dead, blocked)
        gone, also = sorted({*dead, *killed}), sorted(set(drop) - set(dead))
        world = await _drop(engines, world, gone, also, commit)
        report.dropped, report.renumbered = _renumbering(ranks, world, [*gone, *also])
    else:
        # The dead ranks' replacements start while stuck ranks are freed: a new engine's
        # start (its forker imports torch) is most of a recovery, freeing is reply trips.
        (report.freed, killed), world = await asyncio.gather(
            _free_stuck(engines, ranks, dead, blocked),
            _replace(engines, world, dead, report, commit),
        )
        world = await _replace(engines, world, killed, report, commit)  # stayed stuck (rare)
    report.killed = killed
    await regroup(engines, world, commit)  # (a taken standby forked the next: standby.py)
    report.seconds = time.perf_counter() - started
    return report


async def _drop(
    engines: EngineSet, world: World, gone: list[int], also: list[int], commit: Commit
) -> World:
    """Leave ``gone`` (and the survivors ``also``, killed here) out; the rest renumbered
    (committed at once, and again with rank 0's address when rank 0 moved)."""
    client = engines.client_unchecked()
    await asyncio.gather(*(signal_rank(client, world.ranks[r], signal.SIGKILL) for r in also))
    old_master = world.ranks[0]
    world = world.shrunk([*gone, *also])
    commit(world)
    first = world.ranks[0]
    if first.engine_id != old_master.engine_id and first.master_addr != "127.0.0.1":
        # rank 0 (the rendezvous host) is gone: the new rank 0's host holds the store
        fact = await gather([client[first.engine_id].apply_async(*engines.address_call())], 60)
        world = world.replaced([replace(r, master_addr=fact[0]["address"]) for r in world.ranks])
        commit(world)
    return world


def _renumbering(
    before: Sequence[RankAssignment], after: World, dropped: list[int]
) -> tuple[list[int], dict[int, int]]:
    """A shrink's report: the ranks dropped, and old -> new rank of those left."""
    old = {r.engine_id: r.rank for r in before}
    return sorted(dropped), {old[r.engine_id]: r.rank for r in after.ranks}


async def regroup(engines: EngineSet, world: World, commit: Commit) -> World:
    """A new process group on a fresh port, on every rank of ``world``; the world with the
    port (committed before the ranks join)."""
    client = engines.client_unchecked()
    if world.ranks[0].num_nodes > 1:  # every rank proves it reaches MASTER_ADDR (and
        # points gloo at the interface that does) before the store opens
        await check_reachable(client, list(world.ranks))
    port = await open_store(engines, world.ranks[0])
    world = world.replaced([replace(r, master_port=int(port)) for r in world.ranks])
    commit(world)
    ranks = world.ranks
    futures = setup_requests(engines, ranks, {})  # every rank shares rank 0's clock
    try:
        await wait_joined(engines.config.init_timeout, futures)
    except Exception as exc:
        raise ClusterError(f"re-creating the process group failed: {exc}") from exc
    engines.write_pidfile(ranks)
    return world
