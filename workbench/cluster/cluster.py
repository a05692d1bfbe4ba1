"""``Cluster``: ipyparallel engines joined into one torch.distributed process group.

ipyparallel is the engine (launchers, controller, client); the workbench adds rank
assignment, rendezvous, a bounded process-group init, rank-ordered results and clean stops.
Control is async-first (``start``/``stop``) with ``*_sync`` twins, like ipyparallel's own
``Cluster``.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import shutil
import tempfile
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import ipyparallel as ipp
import psutil

from workbench.cluster import launchers, rendezvous, watchdog
from workbench.cluster.connection import find_connection_file
from workbench.cluster.dispatch import RankDispatch
from workbench.cluster.hosts import local_pid_space
from workbench.cluster.loop import async_first, sync_twin
from workbench.cluster.processes import is_local, reap, started_for
from workbench.cluster.ranks import EngineInfo, RankAssignment, assign_ranks
from workbench.cluster.remote_ends import remote_ends
from workbench.cluster.ssh_launcher import attach_nannies
from workbench.config import ClusterConfig
from workbench.engine import process_group
from workbench.errors import (
    ClusterError,
)

__all__ = ["Cluster", "ProgressCallback"]

log = logging.getLogger("workbench.cluster")

# (stage, done, total): "engines" while engines register, "rendezvous" while ranks join.
ProgressCallback = Callable[[str, int, int], None]

# The controller's default heartbeat (3 s) dominates start-up; 500 ms keeps engine-death
# detection fast and start-up near 3 s for 2 local engines (measured, see DESIGN.md).
_CONTROLLER_ARGS = ["--HeartMonitor.period=500"]
_MULTI_NODE = {"mpi", "ssh", "slurm"}
# How often a starting cluster records its new processes for the orphan watchdog.
_TRACK_S = 0.1

_live: weakref.WeakSet[Cluster] = weakref.WeakSet()
_current: list[weakref.ref[Cluster]] = []  # the most recently started cluster, if alive


@atexit.register
def _stop_all_at_exit() -> None:
    """Stop every cluster this process started (a normal kernel shutdown or restart)."""
    for cluster in list(_live):
        try:
            cluster.stop_sync()
        except Exception:  # exit path: never mask the interpreter's own shutdown
            log.debug("atexit stop failed for %r", cluster, exc_info=True)


def _terminate(processes: list[psutil.Process]) -> None:
    """SIGTERM each process that is still the one we started (``reap`` kills the rest)."""
    for proc in processes:
        try:
            if proc.is_running():
                proc.terminate()
        except psutil.Error:
            continue


def _running(proc: psutil.Process) -> bool:
    """Still this process (pid and start time) and not exited."""
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


class Cluster(RankDispatch):
    """Engines + process group. Use as a context manager or call ``start_sync``/``stop_sync``.

    >>> with Cluster(n=2) as cluster:                # doctest: +SKIP
    ...     cluster.run(lambda: torch.distributed.get_rank())
    [0, 1]
    """

    def __init__(
        self,
        n: int = 2,
        *,
        backend: str = "auto",
        launcher: str = "local",
        hosts: Sequence[str] = (),
        profile: str | None = None,
        cluster_id: str | None = None,
        init_timeout: float = 60.0,
        start_timeout: float = 60.0,
        threads_per_engine: int | None = None,
        progress: ProgressCallback | None = None,
        launcher_options: Mapping[str, Any] | None = None,
    ) -> None:
        self.config = ClusterConfig(
            n=n,
            backend=backend,
            launcher=launcher,
            hosts=hosts,  # ClusterConfig: a str is one host (or comma-separated hosts)
            profile=profile,
            cluster_id=cluster_id,
            init_timeout=init_timeout,
            start_timeout=start_timeout,
            threads_per_engine=threads_per_engine,
        )
        # ssh: remote_python, ssh_args; mpi: hostfile, mpi_args, mpiexec; slurm: partition,
        # time, account, sbatch_args; all three: network_interface (see launchers.py)
        self.launcher_options = launchers.parse_options(launcher, launcher_options)
        self._controller_address: str | None = None
        self._ssh_dir: str | None = None  # ssh's shared-connection sockets (launcher="ssh")
        # engine id -> the launcher's host entry that started it (ssh), for replacements
        self.launch_hosts: dict[int, str] = {}
        if profile is not None or cluster_id is not None:  # fail now, not at start
            find_connection_file(profile, cluster_id)
        self.progress = progress
        self._state = "stopped"
        self.ranks: list[RankAssignment] = []
        self.timings: dict[str, float] = {}
        self._ipp: ipp.Cluster | None = None
        self._client: ipp.Client | None = None
        self._owns_engines = profile is None and cluster_id is None
        self._info_futures: dict[int, Any] = {}
        self._engine_ids: list[int] = []  # the engines that get ranks, chosen at start
        self._nanny_pids: set[int] = set()
        # Out-of-band status files of the engines (see flight.py) and the orphan watchdog.
        self.run_dir: str | None = None
        self._watchdog: Any | None = None
        # Ranks left blocked by a timeout / interrupt / death, and their unfinished futures.
        self._stuck: dict[int, Any] = {}
        # Set when a failing rank closed the process group on every rank (a session's
        # fail-together operation); the next session build re-creates it (recover()).
        self.group_closed = False
        # Those of them a timeout or an interrupt gave up on: they refuse new work.
        self._given_up: set[int] = set()
        # Every process this cluster started, remembered from the moment it is seen: once a
        # parent dies (a killed controller), its children cannot be found from here any more.
        self._known: dict[int, psutil.Process] = {}

    @classmethod
    def current(cls) -> Cluster:
        """The most recently started cluster that is still running (e.g. by ``%wb start``)."""
        cluster = _current[0]() if _current else None
        if cluster is not None and cluster.state == "broken":
            raise cluster.controller_died()
        if cluster is None or cluster.state not in ("running", "degraded"):
            raise ClusterError(
                "no running cluster; start one with `%wb start -n 2` or "
                "`workbench.Cluster(n=2).start_sync()`"
            )
        return cluster

    # ----------------------------------------------------------------- state
    @property
    def state(self) -> str:
        """``stopped``, ``starting``, ``running``, ``degraded`` (a dead or stuck engine:
        ``recover``), ``broken`` (the controller died: ``restart``), ``stopping``."""
        if self._state in ("running", "degraded") and self.controller_lost():
            self._state = "broken"
        return self._state

    @state.setter
    def state(self, value: str) -> None:
        self._state = value

    def controller_lost(self) -> bool:
        """True when the controller this cluster started has exited. It is a child of this
        process, so its pid is checked here; without it nothing routes work to the engines
        or notices that one died."""
        proc = self._controller_process()
        if proc is None:
            return False
        try:
            return not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
        except psutil.Error:
            return True

    def _controller_process(self) -> psutil.Process | None:
        if not self._owns_engines or self._ipp is None:
            return None
        proc = getattr(getattr(self._ipp, "controller", None), "process", None)
        return proc if isinstance(proc, psutil.Process) else None

    def controller_died(self) -> ClusterError:
        """The error every call raises once the controller is gone."""
        proc = self._controller_process()
        pid = f" (pid {proc.pid})" if proc is not None else ""
        return ClusterError(
            f"the cluster's ipyparallel controller{pid} died: nothing can reach the engines "
            "or notice an engine death any more. Rebuild the whole cluster with "
            "`%wb restart` (cluster.restart_sync()); this stops every process it started."
        )

    def check_controller(self) -> None:
        """Raise ``controller_died()`` when the controller is gone (fast, no round trip)."""
        if self.state == "broken":
            raise self.controller_died()

    # ----------------------------------------------------------------- introspection
    def __repr__(self) -> str:
        c = self.config
        parts = [f"n={c.n}", f"launcher={c.launcher!r}", f"state={self.state!r}"]
        if self.ranks:
            r0 = self.ranks[0]
            hosts = len({r.host for r in self.ranks})
            parts += [
                f"backend={r0.backend!r}",
                f"world_size={r0.world_size}",
                f"hosts={hosts}",
                f"master={r0.master_addr}:{r0.master_port}",
            ]
        return f"<workbench.Cluster {' '.join(parts)}>"

    @property
    def world_size(self) -> int:
        return len(self.ranks)

    @property
    def backend(self) -> str | None:
        return self.ranks[0].backend if self.ranks else None

    @property
    def client(self) -> ipp.Client:
        self.check_controller()
        if self._client is None or self.state not in ("running", "degraded"):
            raise ClusterError("the cluster is not running; start it with start_sync()")
        return self._client

    @property
    def ipp_cluster(self) -> ipp.Cluster | None:
        """The underlying ipyparallel cluster (None when connected to an external one)."""
        return self._ipp

    def _process_tree(self) -> list[psutil.Process]:
        """Controller, engines, nannies and every process they spawned (schedulers...),
        including those seen before whose parent has died since; only running ones."""
        engine_pids = {r.pid for r in self._local_ranks()}
        self._nanny_pids = set()
        for pid in self.pids():
            try:
                proc = self._known.get(pid) or psutil.Process(pid)
                children = proc.children(recursive=True)
            except psutil.Error:
                continue
            self._known[pid] = proc
            for child in children:
                self._known.setdefault(child.pid, child)
            if pid in engine_pids:  # an engine's children are its nanny
                self._nanny_pids.update(c.pid for c in children)
        return [p for p in self._known.values() if _running(p)]

    def pids(self) -> list[int]:
        """Process ids (on this host) of the controller, engines and their nannies started
        by this cluster."""
        pids: list[int] = []
        if self._ipp is None:
            return pids
        ctrl = getattr(self._ipp, "controller", None)
        proc = getattr(ctrl, "process", None)
        if proc is not None:
            pids.append(proc.pid)
        for engine_set in getattr(self._ipp, "engines", {}).values():
            for launcher in getattr(engine_set, "launchers", {}).values():
                proc = getattr(launcher, "process", None)
                if proc is not None:
                    pids.append(proc.pid)
        # An engine on another host (or in another PID namespace) has a pid that means
        # nothing here (its launcher's local process, e.g. ssh, is listed above instead).
        pids += [r.pid for r in self._local_ranks() if r.pid not in pids]
        return pids

    def _local_ranks(self) -> list[RankAssignment]:
        """Ranks whose pid is meaningful here (same machine, same PID namespace). A remote
        engine is signalled only through its own host, never by its pid here."""
        here = local_pid_space()
        # (ranks made by hand, without a pid space, fall back to comparing host names)
        return [r for r in self.ranks if (r.pid_space == here if r.pid_space else is_local(r.host))]

    # ----------------------------------------------------------------- lifecycle
    def __enter__(self) -> Cluster:
        return self.start_sync()

    def __exit__(self, *exc: object) -> None:
        self.stop_sync()

    async def __aenter__(self) -> Cluster:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @async_first
    async def start(self) -> Cluster:
        """Start (or connect to) engines, assign ranks and initialise the process group."""
        if self.state in ("running", "degraded"):
            return self
        if self.state == "broken":  # reap what outlived the controller before starting anew
            await self.stop()
        self.state = "starting"
        t0 = time.perf_counter()
        # status_dir: a directory every node shares, so hang reports include remote ranks
        self.run_dir = tempfile.mkdtemp(
            prefix="wb-run-", dir=self.launcher_options.status_dir or None
        )
        # The watchdog runs before the first process starts, and learns every process as
        # it appears: a kernel killed at any moment of the start leaves nothing behind.
        self._start_watchdog()
        tracker = asyncio.ensure_future(self._track_start()) if self._watchdog else None
        try:
            await self._start_engines()
            t1 = time.perf_counter()
            await self._init_process_group()
        except BaseException:
            if tracker is not None:
                tracker.cancel()
            await self._shutdown(quiet=True)
            self.state = "stopped"
            raise
        if tracker is not None:
            tracker.cancel()
        self._write_pidfile()
        self.timings = {
            "engines_s": t1 - t0,
            "process_group_s": time.perf_counter() - t1,
            "total_s": time.perf_counter() - t0,
        }
        self.state = "running"
        _live.add(self)
        _current[:] = [weakref.ref(self)]
        return self

    @async_first
    async def stop(self) -> None:
        """Leave the process group; stop controller and engines if this cluster started them
        (every process it started, by pid, also after its controller died)."""
        if self.state == "stopped" and self._ipp is None and self._client is None:
            return
        self.state = "stopping"
        await self._shutdown(quiet=False)
        self.state = "stopped"
        _live.discard(self)

    @async_first
    async def restart(self) -> Cluster:
        """Stop everything and start again with the same settings (fresh ranks and port).
        This is the way back from a dead controller."""
        await self.stop()
        return await self.start()

    @async_first
    async def recover(self) -> Any:
        """Replace dead engines, free or replace stuck ones, keep the rest and their rank
        numbers, and re-create the process group on a fresh port. Returns a
        ``RecoveryReport``. See ``workbench.cluster.recovery``."""
        from workbench.cluster.recovery import recover

        return await recover(self)

    # the blocking twins, for scripts (workbench.cluster.loop: one rule for every pair)
    start_sync = sync_twin(start)
    stop_sync = sync_twin(stop)
    restart_sync = sync_twin(restart)
    recover_sync = sync_twin(recover)

    @property
    def stuck_ranks(self) -> list[int]:
        """Ranks left blocked (in a collective) by a timeout, an interrupt or a death."""
        return sorted(self._stuck)

    # ----------------------------------------------------------------- orphan watchdog
    def _start_watchdog(self) -> None:
        if not self._owns_engines or self.run_dir is None:
            return
        watchdog.write_pidfile(self.run_dir, [])
        self._watchdog = watchdog.spawn(self.run_dir)

    async def _track_start(self) -> None:
        """While starting, tell the watchdog about each process within ``_TRACK_S`` of its
        launch (the controller, its schedulers, engines and their nannies)."""
        while True:
            try:
                self._write_pidfile()
            except Exception:  # a process exiting mid-walk: the next pass sees the rest
                log.debug("pid file update failed", exc_info=True)
            await asyncio.sleep(_TRACK_S)

    def _write_pidfile(self) -> None:
        if self.run_dir is not None and self._owns_engines:
            pids = [p.pid for p in self._process_tree()]
            # and how to end the engines on other hosts, through their host (remote_ends.py)
            watchdog.write_pidfile(self.run_dir, pids, remote_ends(self._ipp, self._ssh_dir))

    # ----------------------------------------------------------------- internals
    def _report(self, stage: str, done: int, total: int) -> None:
        if self.progress is not None:
            try:
                self.progress(stage, done, total)
            except Exception:  # a broken progress display must never break start-up
                log.debug("progress callback failed", exc_info=True)

    def _make_ipp_cluster(self) -> ipp.Cluster:
        c = self.config
        kwargs: dict[str, Any] = {
            "n": c.n,
            "log_level": logging.ERROR,
            "controller_args": list(_CONTROLLER_ARGS),
            "shutdown_atexit": True,
        }
        # Loopback unless the user asked for a multi-node launcher; then only the address
        # that reaches the other hosts (see launchers.py).
        kwargs.update(
            launchers.ipp_settings(
                c.launcher,
                c.n,
                c.hosts,
                self.launcher_options,
                self._controller_address,
                self._ssh_dir,
                self.run_dir,
            )
        )
        return ipp.Cluster(**kwargs)

    async def _start_engines(self) -> None:
        c = self.config
        if self._owns_engines:
            if c.launcher == "ssh":
                self._ssh_dir = tempfile.mkdtemp(prefix="wb-ssh-")
            if c.launcher in _MULTI_NODE:
                self._controller_address = launchers.controller_address(
                    c.launcher, c.hosts, self.launcher_options
                )
                await launchers.preflight(c.launcher, c.hosts, self.launcher_options, self._ssh_dir)
            self._ipp = self._make_ipp_cluster()
            await self._ipp.start_controller()
            self._write_pidfile()
            try:
                await self._ipp.start_engines(c.n)
            except Exception as exc:
                output = launchers.launcher_output(self._ipp)
                raise ClusterError(
                    f"launcher={c.launcher!r} failed to start engines: {exc}"
                    + (f"\n--- launcher output ---\n{output}" if output else "")
                ) from exc
            self._write_pidfile()
            self._client = await self._ipp.connect_client()
        else:
            self._client = ipp.Client(profile=c.profile, cluster_id=c.cluster_id or "")
        await self._wait_for_engines()

    async def _wait_for_engines(self) -> None:
        client = self._client
        if client is None:
            raise ClusterError("no ipyparallel client")
        n = self.config.n
        deadline = time.monotonic() + self.config.start_timeout
        seen = -1
        self._info_futures = {}
        self._address_futures: dict[int, Any] = {}
        while True:
            # One read of the ids per pass: an engine may register between two reads, and
            # every id counted must be one whose facts were asked for.
            ids = sorted(client.ids)
            # Ask each engine for its facts as soon as it registers: importing torch there
            # overlaps with the other engines still starting.
            for eid in ids:
                if eid not in self._info_futures:
                    self._info_futures[eid] = client[eid].apply_async(process_group.engine_info)
                    self._address_futures[eid] = client[eid].apply_async(*self.address_call())
            count = len(ids)
            if count != seen:
                self._report("engines", min(count, n), n)
                seen = count
            if count >= n:
                self._engine_ids = ids[:n]
                return
            if self.controller_lost():
                raise ClusterError(
                    "the ipyparallel controller exited during start-up; run "
                    "`ipcontroller --debug` by hand to see why"
                )
            if self._owns_engines and self._engines_exited():
                output = launchers.launcher_output(self._ipp)
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
                    f"start_timeout={self.config.start_timeout}s; raise start_timeout or "
                    "check the launcher"
                )
            await asyncio.sleep(0.02)

    def status_dir_of(self, rank: RankAssignment) -> str | None:
        """Where ``rank`` writes its out-of-band status: the run directory when the rank
        sees it (same machine, or a ``status_dir`` shared by every node), else nowhere (a
        node-local /tmp path would only litter the node)."""
        if self.launcher_options.status_dir or rank.pid_space == local_pid_space():
            return self.run_dir
        return None

    def address_call(self) -> tuple[Any, ...]:
        """``apply_async`` arguments asking an engine for its reachable address etc."""
        iface = self.launcher_options.network_interface or None
        return (rendezvous.engine_address, self._controller_address, iface)

    def _engines_exited(self) -> bool:
        if self._ipp is None:
            return False
        for engine_set in self._ipp.engines.values():
            # a set started as one process (mpiexec, a batch job) ends as a whole
            if getattr(engine_set, "state", "running") == "after":
                return True
            for launcher in getattr(engine_set, "launchers", {}).values():
                # ipyparallel launchers move from "running" to "after" when the process exits
                if getattr(launcher, "state", "running") == "after":
                    return True
        return False

    async def _engine_infos(self) -> tuple[list[int], list[dict[str, Any]]]:
        """The engines chosen by ``_wait_for_engines`` and the facts each reported."""
        ids = list(self._engine_ids)
        futures = [self._info_futures[eid] for eid in ids]
        infos = await asyncio.gather(*(asyncio.wrap_future(f) for f in futures))
        try:
            addresses = await asyncio.gather(
                *(asyncio.wrap_future(self._address_futures[eid]) for eid in ids)
            )
        except ipp.error.RemoteError as exc:  # e.g. network_interface missing on a host
            raise ClusterError(f"{exc.ename}: {exc.evalue}") from None
        infos = [{**info, **addr} for info, addr in zip(infos, addresses, strict=True)]
        self.launch_hosts = {
            eid: str(info.get("launch_host", "")) for eid, info in zip(ids, infos, strict=True)
        }
        if self._ipp is not None:
            attach_nannies(self._ipp, dict(zip(ids, infos, strict=True)))
        return ids, list(infos)

    async def _init_process_group(self) -> None:
        client = self.client_unchecked()
        ids, infos = await self._engine_infos()
        # Clock offsets to rank 0 from one quick round trip per engine (torch is loaded now).
        sent = time.time_ns()
        clocks = await asyncio.wrap_future(client[ids].apply_async(time.time_ns))
        received = time.time_ns()
        engines = [
            EngineInfo(
                engine_id=eid,
                host=info["host"],
                pid=info["pid"],
                address=info["address"],
                cuda_devices=info["cuda_devices"],
                cpus=info["cpus"],
                pid_space=info.get("pid_space", ""),
            )
            for eid, info in zip(ids, infos, strict=True)
        ]
        draft = assign_ranks(
            engines,
            backend=self.config.backend,
            threads_per_engine=self.config.threads_per_engine,
        )
        # Across hosts, every rank first proves it reaches MASTER_ADDR (and points gloo at
        # the interface that does): an unreachable address fails here, named (rendezvous.py).
        if draft[0].num_nodes > 1:
            await rendezvous.check_reachable(client, draft)
        port = await self._open_store(draft[0])
        ranks = assign_ranks(
            engines,
            backend=self.config.backend,
            master_port=int(port),
            threads_per_engine=self.config.threads_per_engine,
        )
        # Clock offsets to rank 0: midpoint estimate of each engine's wall clock vs ours.
        midpoint = (sent + received) // 2
        offsets = {eid: midpoint - t for eid, t in zip(ids, clocks, strict=True)}
        base = offsets[ranks[0].engine_id]
        self._report("rendezvous", 0, len(ranks))
        futures = [
            client[r.engine_id].apply_async(
                process_group.setup_rank,
                r.as_dict(),
                self.config.init_timeout,
                # Engines on rank 0's host share its clock; others get the measured offset.
                0 if r.host == ranks[0].host else offsets[r.engine_id] - base,
                self.status_dir_of(r),
            )
            for r in ranks
        ]
        try:
            await asyncio.wait_for(
                asyncio.gather(*(asyncio.wrap_future(f) for f in futures)),
                timeout=self.config.init_timeout + 10,
            )
        except TimeoutError as exc:
            raise ClusterError(
                f"process group did not form within init_timeout={self.config.init_timeout}s"
            ) from exc
        except ipp.error.RemoteError as exc:
            raise ClusterError(f"init_process_group failed on an engine: {exc}") from exc
        self.ranks = ranks
        self._report("rendezvous", len(ranks), len(ranks))

    async def _open_store(self, r0: RankAssignment) -> int:
        """Rank 0 opens the rendezvous store on ``MASTER_ADDR`` only (loopback for a local
        cluster) and keeps it for ``setup_rank``; returns the port it listens on."""
        port = await asyncio.wrap_future(
            self.client_unchecked()[r0.engine_id].apply_async(
                process_group.open_store, r0.master_addr, r0.world_size, self.config.init_timeout
            )
        )
        return int(port)

    def client_unchecked(self) -> ipp.Client:
        if self._client is None:
            raise ClusterError("no ipyparallel client; the cluster has not started")
        return self._client

    async def _shutdown(self, *, quiet: bool) -> None:
        # Snapshot every process first: once engines exit, their nannies are orphans.
        processes = self._process_tree()
        # Without a controller no request reaches the engines: stop them by pid below.
        lost = self.controller_lost()
        client, self._client = self._client, None
        if client is not None:
            if self.ranks and self._owns_engines and not lost:
                try:  # leave the process group cleanly so engines exit without noise
                    ar = client[[r.engine_id for r in self.ranks if r.engine_id in client.ids]]
                    ar.apply_async(process_group.teardown_rank).get(timeout=5)
                    # Asking engines to exit is faster than SIGTERM from the launcher.
                    client.shutdown(targets=ar.targets, hub=False, block=True)
                except Exception:
                    log.debug("teardown on engines failed", exc_info=True)
            client.close()
        if client is not None and self._owns_engines and not lost:
            await asyncio.to_thread(self._finish_engines, processes)
        if lost:  # the dead controller's schedulers and the engines: nobody else ends them
            await asyncio.to_thread(_terminate, processes)
        cluster, self._ipp = self._ipp, None
        if cluster is not None:
            try:
                # every engine set at once (ipyparallel stops them one after another;
                # recovery adds a set per replacement)
                await asyncio.gather(*(cluster.stop_engines(i) for i in list(cluster.engines)))
            except Exception:  # e.g. a set that failed to start: stop_cluster retries
                log.debug("stopping engine sets failed", exc_info=True)
            try:
                await cluster.stop_cluster()
            except Exception:
                if not quiet:
                    raise
        self.ranks = []
        self._stuck = {}
        ssh_dir, self._ssh_dir = self._ssh_dir, None
        if ssh_dir is not None:
            await launchers.close_ssh(self.config.hosts, self.launcher_options, ssh_dir)
            shutil.rmtree(ssh_dir, ignore_errors=True)
        if cluster is not None and self._owns_engines:
            known = {p.pid for p in processes}
            processes += [p for p in started_for(cluster.cluster_id) if p.pid not in known]
        self._given_up = set()
        await asyncio.to_thread(reap, processes)
        self._known = {}
        dog, self._watchdog = self._watchdog, None
        if dog is not None:
            watchdog.stop(dog)
        run_dir, self.run_dir = self.run_dir, None
        if run_dir is not None:
            shutil.rmtree(run_dir, ignore_errors=True)

    def _finish_engines(self, processes: list[psutil.Process]) -> None:
        """Once the engines have exited on request, end their nannies too.

        ipyparallel's per-engine nanny notices its engine is gone only after seconds of
        polling, and the launcher's stop waits for it; with the engine already gone it
        supervises nothing, so it is killed here and the stop that follows is quick.
        """
        engine_pids = {r.pid for r in self._local_ranks()}
        engines = [p for p in processes if p.pid in engine_pids]
        nannies = [p for p in processes if p.pid in self._nanny_pids]
        psutil.wait_procs(engines, timeout=2.0)
        for proc in nannies:
            try:
                proc.kill()
            except psutil.Error:
                continue
