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
import tempfile
import time
import warnings
from typing import TYPE_CHECKING, Any

import ipyparallel as ipp

from workbench.cluster import doctor_env, rendezvous, warm_start
from workbench.cluster.engine_watch import EngineWatch
from workbench.cluster.launch import launchers
from workbench.cluster.launch.fork import ForkEngineSetLauncher
from workbench.cluster.launch.ssh import attach_nannies
from workbench.cluster.launch.warm import WarmControllerLauncher
from workbench.cluster.ranks import EngineInfo, RankAssignment, assign_ranks
from workbench.engine import boot, process_group
from workbench.engine.direct_cells import open_if_same_network
from workbench.engine.hosts import local_pid_space, net_space
from workbench.errors import ClusterError

if TYPE_CHECKING:  # the cluster is only a parameter here
    from workbench.cluster.cluster import Cluster

__all__ = [
    "LOCAL_HEARTBEAT",
    "REMOTE_HEARTBEAT",
    "controller_args",
    "engine_infos",
    "init_process_group",
    "local_settings",
    "open_store",
    "start_engines",
    "wait_for_engines",
    "watch_engines",
]

MULTI_NODE = frozenset({"mpi", "ssh", "slurm"})
# The controller's default heartbeat (3 s) dominates start-up: an engine counts as registered
# only at the first beat that finds it answering (1-2 periods after it connects). Locally,
# 100 ms makes that 0.1-0.2 s; 50 allowed misses keep the 5 s of silence (ipyparallel's
# default of 10 misses x 500 ms) before a busy engine is declared dead. The heart answers
# from a C thread, so a rank busy in Python or in a collective still beats.
LOCAL_HEARTBEAT = ["--HeartMonitor.period=100", "--HeartMonitor.max_heartmonitor_misses=50"]
# Across hosts: the period the workbench has always used there (10 misses: 5 s).
REMOTE_HEARTBEAT = ["--HeartMonitor.period=500"]


def controller_args(launcher: str) -> list[str]:
    return list(LOCAL_HEARTBEAT if launcher == "local" else REMOTE_HEARTBEAT)


def local_settings(start_timeout: float) -> dict[str, Any]:
    """``ipyparallel.Cluster`` settings for a local cluster: one process imports torch and
    forks every engine, beside the controller's start.

    By default ipyparallel hands the engines the controller's connection info, so it waits
    for the controller before it launches any engine, then launches them 0.1 s apart, and
    each engine imports torch itself. Here the engines' process starts at once, imports
    torch (and ipyparallel's engine) once while the controller starts, forks the n engines
    (``workbench.engine.zygote``), and each waits for the connection file itself
    (``wait_for_url_file``, on the same disk).
    """
    from traitlets.config import Config

    cfg = Config()
    cfg.ForkEngineSetLauncher.engine_args = [
        f"--IPEngine.wait_for_url_file={start_timeout}",
        # No nanny (one more interpreter per engine, waited for while it registers): the
        # kernel watches and signals its local engines itself (engine_watch.py).
        "--IPEngine.enable_nanny=False",
    ]
    return {
        "config": cfg,
        "send_engines_connection_env": False,
        "engines": ForkEngineSetLauncher,
        # ipyparallel's, or the one the workbench kernel started ahead (warm_start.py)
        "controller": WarmControllerLauncher,
    }


def make_ipp_cluster(cluster: Cluster) -> ipp.Cluster:
    c = cluster.config
    kwargs: dict[str, Any] = {
        "n": c.n,
        "log_level": logging.ERROR,
        "controller_args": controller_args(c.launcher),
        "shutdown_atexit": True,
    }
    # Loopback unless the user asked for a multi-node launcher; then only the address
    # that reaches the other hosts (see launchers.py).
    kwargs.update(
        launchers.ipp_settings(
            c.launcher,
            c.n,
            c.hosts,
            cluster.launcher_options,
            cluster._controller_address,
            cluster._ssh_dir,
            cluster.run_dir,
        )
    )
    if c.launcher == "local":
        local = local_settings(c.start_timeout)
        local["config"].merge(kwargs["config"])  # launchers' settings win where both set
        kwargs.update(local)
    return ipp.Cluster(**kwargs)


async def start_engines(cluster: Cluster) -> None:
    """Start (or connect to) the controller and the engines; return once ``n`` engines
    have registered (``cluster._engine_ids``)."""
    c = cluster.config
    profile = cluster.startup
    if cluster._owns_engines:
        if c.launcher == "ssh":
            cluster._ssh_dir = tempfile.mkdtemp(prefix="wb-ssh-")
        if c.launcher in MULTI_NODE:
            cluster._controller_address = launchers.controller_address(
                c.launcher, c.hosts, cluster.launcher_options
            )
            await launchers.preflight(
                c.launcher, c.n, c.hosts, cluster.launcher_options, cluster._ssh_dir
            )
            profile.mark("launcher checked")
        ipp_cluster = cluster._ipp = make_ipp_cluster(cluster)
        # Locally this only spawns the controller: the engines wait for its connection
        # file themselves (local_settings), so their process is launched right after it.
        await ipp_cluster.start_controller()
        profile.mark("controller started")
        cluster._write_pidfile()
        try:
            await ipp_cluster.start_engines(c.n)
        except Exception as exc:
            output = launchers.launcher_output(ipp_cluster)
            raise ClusterError(
                f"launcher={c.launcher!r} failed to start engines: {exc}"
                + (f"\n--- launcher output ---\n{output}" if output else "")
            ) from exc
        profile.mark("engines launched")
        profile.remarks.extend(warm_start.pop_outcomes())
        cluster._write_pidfile()
        cluster._client = await ipp_cluster.connect_client()
        profile.mark("client connected")
        if c.launcher == "local":  # its engines have no nanny: see local_settings
            cluster._engine_watch = EngineWatch.for_client(cluster._client)
    else:
        cluster._client = ipp.Client(profile=c.profile, cluster_id=c.cluster_id or "")
    await wait_for_engines(cluster)


async def wait_for_engines(cluster: Cluster) -> None:
    """Until ``n`` engines have registered; each is asked for its facts as it registers."""
    client = cluster._client
    if client is None:
        raise ClusterError("no ipyparallel client")
    n = cluster.config.n
    profile = cluster.startup
    deadline = time.monotonic() + cluster.config.start_timeout
    seen = -1
    cluster._info_futures = {}
    cluster._address_futures = {}
    cluster._direct_port_futures = {}
    while True:
        # One read of the ids per pass: an engine may register between two reads, and
        # every id counted must be one whose facts were asked for.
        ids = sorted(client.ids)
        # Ask each engine for its facts as soon as it registers: importing torch there
        # overlaps with the other engines still starting.
        for eid in ids:
            if eid not in cluster._info_futures:
                profile.engine_now(eid, "registered")
                future = client[eid].apply_async(boot.timed_engine_info, cluster.check_packages)
                future.add_done_callback(lambda _f, eid=eid: profile.engine_now(eid, "answered"))
                cluster._info_futures[eid] = future
                cluster._address_futures[eid] = client[eid].apply_async(*cluster.address_call())
                # its %%wb cell socket too (local engines), so the first cell sends at once
                cluster._direct_port_futures[eid] = client[eid].apply_async(
                    open_if_same_network, net_space()
                )
        count = len(ids)
        if count != seen:
            cluster._report("engines", min(count, n), n)
            seen = count
        if count >= n:
            profile.mark("all engines registered")
            cluster._engine_ids = ids[:n]
            return
        if cluster.controller_lost():
            raise ClusterError(
                "the ipyparallel controller exited during start-up; run "
                "`ipcontroller --debug` by hand to see why"
            )
        if cluster._owns_engines and engines_exited(cluster):
            output = launchers.launcher_output(cluster._ipp)
            raise ClusterError(
                f"engines exited during start-up ({count} of {n} registered); "
                + (
                    f"the launcher's output:\n{output}"
                    if output
                    else "run `ipengine --debug` by hand to see why"
                )
            )
        if time.monotonic() > deadline:
            raise ClusterError(
                f"only {count} of {n} engines registered within "
                f"start_timeout={cluster.config.start_timeout}s; raise start_timeout or "
                "check the launcher"
            )
        await asyncio.sleep(0.02)


def engines_exited(cluster: Cluster) -> bool:
    if cluster._ipp is None:
        return False
    for engine_set in cluster._ipp.engines.values():
        # a set started as one process (mpiexec, a batch job) ends as a whole
        if getattr(engine_set, "state", "running") == "after":
            return True
        if isinstance(engine_set, ForkEngineSetLauncher) and engine_set.engine_exited():
            return True
        for launcher in getattr(engine_set, "launchers", {}).values():
            # ipyparallel launchers move from "running" to "after" when the process exits
            if getattr(launcher, "state", "running") == "after":
                return True
    return False


async def engine_infos(cluster: Cluster) -> tuple[list[int], list[dict[str, Any]]]:
    """The engines chosen by ``wait_for_engines`` and the facts each reported."""
    ids = list(cluster._engine_ids)
    futures = [cluster._info_futures[eid] for eid in ids]
    infos = await asyncio.gather(*(asyncio.wrap_future(f) for f in futures))
    cluster.startup.mark("torch imported on every engine")
    try:
        addresses = await asyncio.gather(
            *(asyncio.wrap_future(cluster._address_futures[eid]) for eid in ids)
        )
    except ipp.error.RemoteError as exc:  # e.g. network_interface missing on a host
        raise ClusterError(f"{exc.ename}: {exc.evalue}") from None
    infos = [{**info, **addr} for info, addr in zip(infos, addresses, strict=True)]
    here = local_pid_space()
    for eid, info in zip(ids, infos, strict=True):
        # another host's wall clock is not ours: its process start is left out
        cluster.startup.engine_facts(eid, info, same_clock=info.get("pid_space") == here)
    cluster.launch_hosts = {
        eid: str(info.get("launch_host", "")) for eid, info in zip(ids, infos, strict=True)
    }
    if cluster._ipp is not None:
        attach_nannies(cluster._ipp, dict(zip(ids, infos, strict=True)))
    watch_engines(cluster, list(zip(ids, infos, strict=True)))
    return ids, list(infos)


def watch_engines(cluster: Cluster, engines: list[tuple[int, dict[str, Any]]]) -> None:
    """Have the kernel report these engines' deaths (a local cluster's engines have no
    nanny to do it; ``engines`` are (engine id, the facts it reported))."""
    watch = cluster._engine_watch
    if watch is None:
        return
    here = local_pid_space()
    for eid, info in engines:
        if info.get("pid_space") == here:
            watch.watch(eid, int(info["pid"]))


def check_environments(
    cluster: Cluster, engines: list[EngineInfo], infos: list[dict[str, Any]]
) -> None:
    """Refuse a start whose engines differ where a run needs them equal; warn of the rest."""
    labelled = [
        (e.host, e.engine_id, i.get("environment", {})) for e, i in zip(engines, infos, strict=True)
    ]
    report = cluster.environment = doctor_env.environment_report(labelled, cluster.check_packages)
    doctor_env.refuse_mismatch(report)
    for text in report.warnings:
        warnings.warn(f"workbench: {text}", UserWarning, stacklevel=2)
    cluster.startup.mark("environments compared")


def _engine_info(engine_id: int, info: dict[str, Any]) -> EngineInfo:
    return EngineInfo(
        engine_id=engine_id,
        host=info["host"],
        pid=info["pid"],
        address=info["address"],
        cuda_devices=info["cuda_devices"],
        cpus=info["cpus"],
        pid_space=info.get("pid_space", ""),
    )


async def _join_every_rank(
    cluster: Cluster, ranks: list[RankAssignment], clock_offsets: dict[int, int]
) -> None:
    """``setup_rank`` on every engine at once; a rank that cannot join fails the start."""
    client = cluster.client_unchecked()
    config = cluster.config
    futures = [
        client[r.engine_id].apply_async(
            process_group.setup_rank,
            r.as_dict(),
            config.init_timeout,
            clock_offsets[r.engine_id],
            cluster.status_dir_of(r),
        )
        for r in ranks
    ]
    for r, future in zip(ranks, futures, strict=True):
        future.add_done_callback(
            lambda _f, eid=r.engine_id: cluster.startup.engine_now(eid, "joined")
        )
    try:
        await asyncio.wait_for(
            asyncio.gather(*(asyncio.wrap_future(f) for f in futures)),
            timeout=config.init_timeout + 10,
        )
    except TimeoutError as exc:
        raise ClusterError(
            f"process group did not form within init_timeout={config.init_timeout}s"
        ) from exc
    except ipp.error.RemoteError as exc:
        raise ClusterError(f"init_process_group failed on an engine: {exc}") from exc


async def init_process_group(cluster: Cluster) -> None:
    """Assign ranks, open the rendezvous store on rank 0 and join every rank."""
    client = cluster.client_unchecked()
    config = cluster.config
    ids, infos = await engine_infos(cluster)
    engines = [_engine_info(eid, info) for eid, info in zip(ids, infos, strict=True)]
    check_environments(cluster, engines, infos)  # before any process group forms
    # Clock offsets to rank 0 from one quick round trip per engine (torch is loaded now);
    # engines that all run on one host share its clock and need none.
    sent = received = time.time_ns()
    clocks = [sent] * len(ids)
    if len({e.host for e in engines}) > 1:
        clocks = await asyncio.wrap_future(client[ids].apply_async(time.time_ns))
        received = time.time_ns()
    draft = assign_ranks(
        engines, backend=config.backend, threads_per_engine=config.threads_per_engine
    )
    # Across hosts, every rank first proves it reaches MASTER_ADDR (and points gloo at
    # the interface that does): an unreachable address fails here, named (rendezvous.py).
    if draft[0].num_nodes > 1:
        await rendezvous.check_reachable(client, draft)
    port = await open_store(cluster, draft[0])
    ranks = assign_ranks(
        engines,
        backend=config.backend,
        master_port=int(port),
        threads_per_engine=config.threads_per_engine,
    )
    # Clock offsets to rank 0: midpoint estimate of each engine's wall clock vs ours.
    midpoint = (sent + received) // 2
    offsets = {eid: midpoint - t for eid, t in zip(ids, clocks, strict=True)}
    base = offsets[ranks[0].engine_id]
    cluster.startup.mark("clocks and port")
    cluster._report("rendezvous", 0, len(ranks))
    # Engines on rank 0's host share its clock; others get the measured offset.
    shifts = {
        r.engine_id: 0 if r.host == ranks[0].host else offsets[r.engine_id] - base for r in ranks
    }
    await _join_every_rank(cluster, ranks, shifts)
    cluster.ranks = ranks
    cluster.startup.mark("process group formed")
    cluster._report("rendezvous", len(ranks), len(ranks))


async def open_store(cluster: Cluster, r0: RankAssignment) -> int:
    """Rank 0 opens the rendezvous store on ``MASTER_ADDR`` only (loopback for a local
    cluster) and keeps it for ``setup_rank``; returns the port it listens on."""
    port = await asyncio.wrap_future(
        cluster.client_unchecked()[r0.engine_id].apply_async(
            process_group.open_store, r0.master_addr, r0.world_size, cluster.config.init_timeout
        )
    )
    return int(port)
