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
import tempfile
import time
import warnings
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import ipyparallel as ipp
import psutil

from workbench.cluster import gpus, launchers, rendezvous
from workbench.cluster.connection import find_connection_file
from workbench.cluster.direct_channel import DirectCells
from workbench.cluster.dispatch import RankDispatch
from workbench.cluster.doctor import ClusterDoctor
from workbench.cluster.doctor_env import EnvironmentReport, check_package_names
from workbench.cluster.doctor_net import NetworkReport
from workbench.cluster.engine_watch import EngineWatch
from workbench.cluster.hosts import local_pid_space
from workbench.cluster.loop import OneAtATime, async_first, sync_twin
from workbench.cluster.ranks import RankAssignment
from workbench.cluster.scripts import ScriptRuns
from workbench.cluster.shutdown import shutdown
from workbench.cluster.start_sequence import init_process_group, start_engines
from workbench.cluster.startup import StartupProfile
from workbench.cluster.tracking import ProcessTracking
from workbench.config import ClusterConfig
from workbench.errors import (
    ClusterError,
)

__all__ = ["Cluster", "ProgressCallback"]

log = logging.getLogger("workbench.cluster")

# (stage, done, total): "engines" while engines register, "rendezvous" while ranks join.
ProgressCallback = Callable[[str, int, int], None]


_live: weakref.WeakSet[Cluster] = weakref.WeakSet()
# Clusters in the order they started. The last one not stopped is "the current cluster"
# that %wb, the stepper and the dashboard all use; stopping it makes the one before current.
_current: list[weakref.ref[Cluster]] = []


@atexit.register
def _stop_all_at_exit() -> None:
    """Stop every cluster this process started (a normal kernel shutdown or restart)."""
    for cluster in list(_live):
        try:
            cluster.stop_sync()
        except Exception:  # exit path: never mask the interpreter's own shutdown
            log.debug("atexit stop failed for %r", cluster, exc_info=True)


class Cluster(ProcessTracking, RankDispatch, ScriptRuns, ClusterDoctor):
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
        check_packages: Sequence[str] | str = (),
        spare_hosts: Sequence[str] | str = (),
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
            spare_hosts=spare_hosts,  # ssh: where a lost host's ranks are started again
        )
        # ssh: remote_python, ssh_args; mpi: hostfile, mpi_args, mpiexec; slurm: partition,
        # time, account, sbatch_args; all three: network_interface (see launchers.py)
        self.launcher_options = launchers.parse_options(launcher, launcher_options)
        # versions that must match on every host, besides torch/CUDA/NCCL/workbench/Python
        self.check_packages = check_package_names("check_packages", check_packages)
        self.environment: EnvironmentReport | None = None  # compared at start (doctor_env)
        self.network: NetworkReport | None = None  # the last doctor("net")
        self._controller_address: str | None = None
        self._ssh_dir: str | None = None  # ssh's shared-connection sockets (launcher="ssh")
        # engine id -> the launcher's host entry that started it (ssh), for replacements
        self.launch_hosts: dict[int, str] = {}
        if profile is not None or cluster_id is not None:  # fail now, not at start
            find_connection_file(profile, cluster_id)
        # More local engines than GPUs: refused for NCCL, said for auto, before any process
        # starts (the engines inherit this environment, so this count is theirs: gpus.py).
        self.gpu_notice = (
            gpus.gpu_choice(self.config.n, backend, gpus.visible_gpu_count())
            if launcher == "local" and profile is None and cluster_id is None
            else None
        )
        if self.gpu_notice is not None:
            warnings.warn(self.gpu_notice, UserWarning, stacklevel=2)
        self.progress = progress
        self._state = "stopped"
        self.ranks: list[RankAssignment] = []
        self.timings: dict[str, float] = {}
        self.startup = StartupProfile()  # where the last start's time went (startup.py)
        self._ipp: ipp.Cluster | None = None
        self._client: ipp.Client | None = None
        self._views: dict[int, Any] = {}  # per-engine DirectViews of _client (dispatch.py)
        self._direct: DirectCells | None = None  # cells straight to local engines (dispatch.py)
        self._owns_engines = profile is None and cluster_id is None
        # engine id -> its pending facts (engine_info; rendezvous.engine_address), asked
        # for as it registers (start_sequence.py)
        self._info_futures: dict[int, Any] = {}
        self._address_futures: dict[int, Any] = {}
        self._direct_port_futures: dict[int, Any] = {}  # open_if_same_network, at registration
        self._engine_ids: list[int] = []  # the engines that get ranks, chosen at start
        self._nanny_pids: set[int] = set()
        self._engine_watch: EngineWatch | None = None  # reports local engines' deaths
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
        # start, stop, restart and recover one at a time, from any thread or event loop: two
        # recoveries at once started two replacements and left no working group
        self._lifecycle = OneAtATime()

    @classmethod
    def latest(cls) -> Cluster | None:
        """The most recently started cluster that was not stopped (running, degraded, or
        broken by a dead controller), or None. The one place that says which cluster is
        current: ``Cluster.current()``, ``%wb`` and ``%%wb`` all read it."""
        for ref in reversed(_current):
            cluster = ref()
            if cluster is not None and cluster.state in ("running", "degraded", "broken"):
                return cluster
        return None

    @classmethod
    def current(cls) -> Cluster:
        """The most recently started cluster that is still running (e.g. by ``%wb start``)."""
        cluster = cls.latest()
        if cluster is not None and cluster.state == "broken":
            raise cluster.controller_died()
        if cluster is None:
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

    # ----------------------------------------------------------------- lifecycle
    def __enter__(self) -> Cluster:
        return self.start_sync()

    def __exit__(self, *exc: object) -> None:
        self.stop_sync()

    async def __aenter__(self) -> Cluster:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # Lifecycle calls run one at a time (``_lifecycle``): a second caller, from another
    # thread or task, waits for the first to finish, then does its own work on the state
    # the first left (a second recovery of a healthy cluster re-creates the group).
    @async_first
    async def start(self) -> Cluster:
        """Start (or connect to) engines, assign ranks and initialise the process group."""
        async with self._lifecycle.hold("cluster.start()"):
            return await self._start()

    @async_first
    async def stop(self) -> None:
        """Leave the process group; stop controller and engines if this cluster started them
        (every process it started, by pid, also after its controller died)."""
        async with self._lifecycle.hold("cluster.stop()"):
            await self._stop()

    @async_first
    async def restart(self) -> Cluster:
        """Stop everything and start again with the same settings (fresh ranks and port).
        This is the way back from a dead controller."""
        async with self._lifecycle.hold("cluster.restart()"):
            await self._stop()
            return await self._start()

    @async_first
    async def recover(self, *, shrink: bool = False, drop: tuple[int, ...] = ()) -> Any:
        """Replace dead engines, free or replace stuck ones, keep the rest and their rank
        numbers, and re-create the process group on a fresh port. Returns a
        ``RecoveryReport``. See ``workbench.cluster.recovery``. ``shrink=True`` drops the
        dead ranks instead (and the survivors in ``drop``) and renumbers the rest."""
        from workbench.cluster.recovery import recover

        async with self._lifecycle.hold("cluster.recover()"):
            return await recover(self, shrink=shrink, drop=drop)

    @async_first
    async def grow(self, n: int = 1, *, hosts: Sequence[str] | str | None = None) -> Any:
        """Add ``n`` engines as new last ranks (round-robin on ``hosts`` when given: ssh,
        slurm) and re-create the process group at the bigger world size (after a shrink:
        back to the size it had). Returns a ``RecoveryReport``."""
        from workbench.cluster.grow import grow

        async with self._lifecycle.hold("cluster.grow()"):
            return await grow(self, n, hosts)

    # the blocking twins, for scripts (workbench.cluster.loop: one rule for every pair)
    start_sync = sync_twin(start)
    stop_sync = sync_twin(stop)
    restart_sync = sync_twin(restart)
    recover_sync = sync_twin(recover)
    grow_sync = sync_twin(grow)

    async def _start(self) -> Cluster:
        if self.state in ("running", "degraded"):
            return self
        if self.state == "broken":  # reap what outlived the controller before starting anew
            await self._stop()
        self.state = "starting"
        self.network = None  # measured on the engines that are about to be replaced
        notes, self.startup = self.startup.notes, StartupProfile()
        self.startup.notes.update(notes)  # e.g. the kernel's import of the magics
        t0 = time.perf_counter()
        # status_dir: a directory every node shares, so hang reports include remote ranks
        self.run_dir = tempfile.mkdtemp(
            prefix="wb-run-", dir=self.launcher_options.status_dir or None
        )
        # The watchdog runs before the first process starts, and learns every process as
        # it appears: a kernel killed at any moment of the start leaves nothing behind.
        self._start_watchdog()
        self.startup.mark("watchdog started")
        tracker = asyncio.ensure_future(self._track_start()) if self._watchdog else None
        try:
            await start_engines(self)
            t1 = time.perf_counter()
            await init_process_group(self)
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
        _current[:] = [r for r in _current if r() not in (None, self)] + [weakref.ref(self)]
        return self

    async def _stop(self) -> None:
        if self.state == "stopped" and self._ipp is None and self._client is None:
            return
        self.state = "stopping"
        await self._shutdown(quiet=False)
        self.state = "stopped"
        _live.discard(self)

    @property
    def stuck_ranks(self) -> list[int]:
        """Ranks left blocked (in a collective) by a timeout, an interrupt or a death."""
        return sorted(self._stuck)

    # ----------------------------------------------------------------- internals
    def _report(self, stage: str, done: int, total: int) -> None:
        if self.progress is not None:
            try:
                self.progress(stage, done, total)
            except Exception:  # a broken progress display must never break start-up
                log.debug("progress callback failed", exc_info=True)

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

    def client_unchecked(self) -> ipp.Client:
        if self._client is None:
            raise ClusterError("no ipyparallel client; the cluster has not started")
        return self._client

    async def _shutdown(self, *, quiet: bool) -> None:
        await shutdown(self, quiet=quiet)
