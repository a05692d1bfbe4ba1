"""A cluster's start: controller and engines, registration, engine facts, the process group.

``Cluster.start`` runs these steps in order and marks each on ``cluster.startup`` (see
startup.py; ``%wb start --profile-startup`` prints it). What only a local cluster may do
lives in ``local_settings``: its engines start beside the controller and import torch while
they register, and its controller beats every 100 ms. The multi-node launchers (ssh, mpi,
slurm; launchers.py) keep ipyparallel's order and a 500 ms heartbeat, which a network
with its latency and a remote engine's slower start can afford to miss less often.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
import warnings
from collections.abc import Sequence
from typing import Any

import ipyparallel as ipp

from workbench.cluster.doctor import doctor_env
from workbench.cluster.hosts import fencing, rendezvous
from workbench.cluster.launch import launchers, standby, warm_start
from workbench.cluster.launch.fork import ForkEngineSetLauncher
from workbench.cluster.launch.warm import WarmControllerLauncher
from workbench.cluster.lifecycle.engines import CLIENT_SESSION, EngineSet
from workbench.cluster.lifecycle.registration import (
    OnRegister,
    Report,
    engine_info,
    engine_infos,
    wait_for_engines,
)
from workbench.cluster.lifecycle.startup import StartupProfile
from workbench.cluster.ranks import EngineInfo, RankAssignment, assign_ranks
from workbench.cluster.world import Commit, World
from workbench.engine import process_group
from workbench.errors import ClusterError

__all__ = [
    "LOCAL_HEARTBEAT",
    "REMOTE_HEARTBEAT",
    "check_environments",
    "controller_args",
    "init_process_group",
    "local_settings",
    "make_ipp_cluster",
    "new_cluster_id",
    "open_store",
    "setup_requests",
    "start",
    "start_engines",
    "wait_joined",
]

MULTI_NODE = frozenset({"mpi", "ssh", "slurm"})
# The controller's default heartbeat (3 s) dominates start-up: an engine counts as registered
# only at the first beat that finds it answering (1-2 periods after it connects). Locally,
# 100 ms makes that 0.1-0.2 s; 50 allowed misses keep the 5 s of silence (ipyparallel's
# default of 10 misses x 500 ms) before a busy engine is declared dead. The heart answers
# from a C thread, so a rank busy in Python or in a collective still beats.
LOCAL_HEARTBEAT = ["--HeartMonitor.period=100", "--HeartMonitor.max_heartmonitor_misses=50"]
# Across hosts: the period the workbench has always used there (10 misses: 5 s).
REMOTE_HEARTBEAT = [f"--HeartMonitor.period={fencing.REMOTE_PERIOD_MS}"]  # fencing.py


def controller_args(launcher: str) -> list[str]:
    return list(LOCAL_HEARTBEAT if launcher == "local" else REMOTE_HEARTBEAT)


def local_settings(start_timeout: float, standby_dir: str = "") -> dict[str, Any]:
    """``ipyparallel.Cluster`` settings for a local cluster: one process imports torch and
    forks every engine, beside the controller's start.

    By default ipyparallel hands the engines the controller's connection info, so it waits
    for the controller before it launches any engine, then launches them 0.1 s apart, and
    each engine imports torch itself. Here the engines' process starts at once, imports
    torch (and ipyparallel's engine) once while the controller starts, forks the n engines
    (``workbench.engine.zygote``), and each waits for the connection file itself
    (``wait_for_url_file``, on the same disk). With ``standby_dir``, the forker also forks
    a standby there for replacement engines (standby.py).
    """
    from traitlets.config import Config

    cfg = Config()
    cfg.ForkEngineSetLauncher.engine_args = [
        f"--IPEngine.wait_for_url_file={start_timeout}",
        # No nanny (one more interpreter per engine, waited for while it registers): the
        # kernel watches and signals its local engines itself (engine_watch.py).
        "--IPEngine.enable_nanny=False",
    ]
    cfg.ForkEngineSetLauncher.standby_dir = standby_dir
    return {
        "config": cfg,
        "send_engines_connection_env": False,
        "engines": ForkEngineSetLauncher,
        # ipyparallel's, or the one the workbench kernel started ahead (warm_start.py)
        "controller": WarmControllerLauncher,
    }


def new_cluster_id() -> str:
    """ipyparallel's form of a cluster id (the start's second, then a suffix) with the suffix
    drawn from the OS. ipyparallel draws it from Python's global ``random``, which a
    notebook's ``random.seed(0)`` (or a run seeded in the kernel) sets alike in every kernel:
    two kernels starting in the same second got one id, and a stop, which also ends the
    processes carrying its ``IPP_CLUSTER_ID`` (``processes.started_for``), ended the
    other's controller."""
    return f"{int(time.time())}-{secrets.token_hex(4)}"


def make_ipp_cluster(engines: EngineSet) -> ipp.Cluster:
    c = engines.config
    kwargs: dict[str, Any] = {
        "cluster_id": new_cluster_id(),
        "n": c.n,
        "log_level": logging.ERROR,
        "controller_args": controller_args(c.launcher),
        # a kept cluster outlives this process (keep.py): never stopped at its exit
        "shutdown_atexit": engines.keep is None,
    }
    # Loopback unless the user asked for a multi-node launcher; then only the address
    # that reaches the other hosts (see launchers.py).
    kwargs.update(
        launchers.ipp_settings(
            c.launcher,
            c.n,
            c.hosts,
            engines.launcher_options,
            engines.controller_address,
            engines.ssh_dir,
            engines.run_dir,
        )
    )
    if c.launcher == "local":
        ahead = engines.standby.directory if engines.standby is not None else ""
        local = local_settings(c.start_timeout, ahead)
        local["config"].merge(kwargs["config"])  # launchers' settings win where both set
        kwargs.update(local)
    return ipp.Cluster(**kwargs)


async def start(
    engines: EngineSet,
    world: World,
    commit: Commit,
    startup: StartupProfile,
    report: Report,
    on_register: OnRegister | None = None,
) -> dict[str, float]:
    """The whole start: the watchdog, then controller and engines, then the process group
    (the world of ranks assigned goes to ``commit``, made from ``world``). Returns where
    the time went (``Cluster.timings``); on failure the caller stops what started."""
    t0 = time.perf_counter()
    engines.open_run_dir()
    # The watchdog runs before the first process starts, and learns every process as
    # it appears: a kernel killed at any moment of the start leaves nothing behind.
    engines.start_watchdog()
    startup.mark("watchdog started")
    # (no rank yet: the processes are found from the controller's and the launchers')
    tracker = asyncio.ensure_future(engines.track_start(())) if engines.watchdog else None
    try:
        await start_engines(engines, startup, report, on_register)
        t1 = time.perf_counter()
        world = await init_process_group(engines, world, commit, startup, report)
    finally:
        if tracker is not None:
            tracker.cancel()
    engines.write_pidfile(world.ranks)
    await engines.publish_kept(world.ranks)  # keep=True: how another kernel finds it (keep.py)
    return {
        "engines_s": t1 - t0,
        "process_group_s": time.perf_counter() - t1,
        "total_s": time.perf_counter() - t0,
    }


async def start_engines(
    engines: EngineSet,
    startup: StartupProfile,
    report: Report,
    on_register: OnRegister | None = None,
) -> None:
    """Start (or connect to) the controller and the engines; return once ``n`` engines
    have registered (``engines.engine_ids``)."""
    c = engines.config
    if engines.owns:
        if c.launcher == "ssh":
            engines.open_ssh_dir()
        if c.launcher in MULTI_NODE:
            engines.controller_at(
                launchers.controller_address(c.launcher, c.hosts, engines.launcher_options)
            )
            await launchers.preflight(
                c.launcher, c.n, c.hosts, engines.launcher_options, engines.ssh_dir
            )
            startup.mark("launcher checked")
        engines.standby_ready(standby.prepare(c.launcher, engines.owns, engines.run_dir))
        ipp_cluster = make_ipp_cluster(engines)
        engines.launched(ipp_cluster)
        # Locally this only spawns the controller: the engines wait for its connection
        # file themselves (local_settings), so their process is launched right after it.
        await ipp_cluster.start_controller()
        startup.mark("controller started")
        engines.write_pidfile(())
        try:
            await ipp_cluster.start_engines(c.n)
        except Exception as exc:
            output = launchers.launcher_output(ipp_cluster)
            raise ClusterError(
                f"launcher={c.launcher!r} failed to start engines: {exc}"
                + (f"\n--- launcher output ---\n{output}" if output else "")
            ) from exc
        startup.mark("engines launched")
        startup.remarks.extend(warm_start.pop_outcomes())
        engines.write_pidfile(())
        # a local cluster's engines have no nanny (see local_settings): the kernel watches
        engines.connected(
            await ipp_cluster.connect_client(**CLIENT_SESSION), watch=c.launcher == "local"
        )
        startup.mark("client connected")
    else:
        engines.connected(
            ipp.Client(profile=c.profile, cluster_id=c.cluster_id or "", **CLIENT_SESSION)
        )
    await wait_for_engines(engines, startup, report, on_register)


def check_environments(
    engines: EngineSet,
    startup: StartupProfile,
    found: list[EngineInfo],
    infos: list[dict[str, Any]],
) -> None:
    """Refuse a start whose engines differ where a run needs them equal; warn of the rest.
    The comparison is kept (``engines.environment``) also when it refuses."""
    labelled = [
        (e.host, e.engine_id, i.get("environment", {})) for e, i in zip(found, infos, strict=True)
    ]
    report = doctor_env.environment_report(labelled, engines.check_packages)
    engines.compared(report)
    doctor_env.refuse_mismatch(report)
    for text in report.warnings:
        warnings.warn(f"workbench: {text}", UserWarning, stacklevel=2)
    startup.mark("environments compared")


def setup_requests(
    engines: EngineSet, ranks: Sequence[RankAssignment], clock_offsets: dict[int, int]
) -> list[Any]:
    """``setup_rank`` sent to every engine at once (an engine missing from
    ``clock_offsets`` shares rank 0's clock); the requests, in rank order."""
    client = engines.client_unchecked()
    return [
        client[r.engine_id].apply_async(
            process_group.setup_rank,
            r.as_dict(),
            engines.config.init_timeout,
            clock_offsets.get(r.engine_id, 0),
            engines.status_dir_of(r),
        )
        for r in ranks
    ]


async def wait_joined(init_timeout: float, futures: list[Any]) -> None:
    """Until every ``setup_rank`` request answered (the group formed); a rank that cannot
    join fails the whole (a margin over the group's own timeout for the replies' trip)."""
    try:
        await asyncio.wait_for(
            asyncio.gather(*(asyncio.wrap_future(f) for f in futures)),
            timeout=init_timeout + 10,
        )
    except TimeoutError as exc:
        raise ClusterError(
            f"process group did not form within init_timeout={init_timeout}s"
        ) from exc
    except ipp.error.RemoteError as exc:
        raise ClusterError(f"init_process_group failed on an engine: {exc}") from exc


async def init_process_group(
    engines: EngineSet, world: World, commit: Commit, startup: StartupProfile, report: Report
) -> World:
    """Assign ranks, open the rendezvous store on rank 0, join every rank; the world of
    them (made from ``world``, committed once every rank joined)."""
    client = engines.client_unchecked()
    config = engines.config
    ids, infos = await engine_infos(engines, startup)
    found = [engine_info(eid, info) for eid, info in zip(ids, infos, strict=True)]
    check_environments(engines, startup, found, infos)  # before any process group forms
    # Clock offsets to rank 0 from one quick round trip per engine (torch is loaded now);
    # engines that all run on one host share its clock and need none.
    sent = received = time.time_ns()
    clocks = [sent] * len(ids)
    if len({e.host for e in found}) > 1:
        clocks = await asyncio.wrap_future(client[ids].apply_async(time.time_ns))
        received = time.time_ns()
    draft = assign_ranks(
        found, backend=config.backend, threads_per_engine=config.threads_per_engine
    )
    # Across hosts, every rank first proves it reaches MASTER_ADDR (and points gloo at
    # the interface that does): an unreachable address fails here, named (rendezvous.py).
    if draft[0].num_nodes > 1:
        await rendezvous.check_reachable(client, draft)
    port = await open_store(engines, draft[0])
    assigned = assign_ranks(
        found,
        backend=config.backend,
        master_port=int(port),
        threads_per_engine=config.threads_per_engine,
    )
    # Clock offsets to rank 0: midpoint estimate of each engine's wall clock vs ours.
    midpoint = (sent + received) // 2
    offsets = {eid: midpoint - t for eid, t in zip(ids, clocks, strict=True)}
    base = offsets[assigned[0].engine_id]
    startup.mark("clocks and port")
    report("rendezvous", 0, len(assigned))
    # Engines on rank 0's host share its clock; others get the measured offset.
    shifts = {
        r.engine_id: 0 if r.host == assigned[0].host else offsets[r.engine_id] - base
        for r in assigned
    }
    futures = setup_requests(engines, assigned, shifts)
    for r, future in zip(assigned, futures, strict=True):
        future.add_done_callback(lambda _f, eid=r.engine_id: startup.engine_now(eid, "joined"))
    await wait_joined(config.init_timeout, futures)
    world = world.replaced(assigned)
    commit(world)
    startup.mark("process group formed")
    report("rendezvous", len(assigned), len(assigned))
    return world


async def open_store(engines: EngineSet, r0: RankAssignment) -> int:
    """Rank 0 opens the rendezvous store on ``MASTER_ADDR`` only (loopback for a local
    cluster) and keeps it for ``setup_rank``; returns the port it listens on."""
    port = await asyncio.wrap_future(
        engines.client_unchecked()[r0.engine_id].apply_async(
            process_group.open_store, r0.master_addr, r0.world_size, engines.config.init_timeout
        )
    )
    return int(port)
