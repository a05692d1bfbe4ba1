"""``Cluster``: ipyparallel engines joined into one torch.distributed process group.

ipyparallel is the engine (launchers, controller, client); the workbench adds rank
assignment, rendezvous, a bounded process-group init, rank-ordered results and clean stops.
Control is async-first (``start``/``stop``) with ``*_sync`` twins, like ipyparallel's own
``Cluster``.
"""

from __future__ import annotations

import asyncio
import atexit
import functools
import logging
import threading
import warnings
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Concatenate, ParamSpec, TypeVar

import ipyparallel as ipp

from workbench.cluster.dispatch.rank_dispatch import RankDispatch
from workbench.cluster.dispatch.scripts import ScriptRuns
from workbench.cluster.doctor.cluster_doctor import ClusterDoctor
from workbench.cluster.doctor.doctor_env import EnvironmentReport, check_package_names
from workbench.cluster.doctor.doctor_net import NetworkReport
from workbench.cluster.hosts import gpus
from workbench.cluster.keep import (
    DEFAULT_LEASE_S,
    KeptCluster,
    KeptClusters,
    foreign_setting,
    keep_settings,
)
from workbench.cluster.launch import launchers
from workbench.cluster.lifecycle import start_sequence
from workbench.cluster.lifecycle.connection import find_connection_file
from workbench.cluster.lifecycle.engines import CLIENT_SESSION, EngineSet
from workbench.cluster.lifecycle.grow import grow as grow_engines
from workbench.cluster.lifecycle.recovery import RecoveryReport, lost_ranks
from workbench.cluster.lifecycle.recovery import recover as recover_engines
from workbench.cluster.lifecycle.shutdown import shutdown
from workbench.cluster.lifecycle.startup import StartupProfile
from workbench.cluster.loop import OneAtATime, async_first, run_sync, sync_twin
from workbench.cluster.ranks import RankAssignment
from workbench.cluster.state import CURRENT, LIVE, ClusterState, StateLink, checked_move
from workbench.cluster.world import World
from workbench.config import ClusterConfig
from workbench.errors import ClusterError

__all__ = ["Cluster", "ProgressCallback"]

log = logging.getLogger("workbench.cluster")

# (stage, done, total): "engines" while engines register, "rendezvous" while ranks join.
ProgressCallback = Callable[[str, int, int], None]
P = ParamSpec("P")
R = TypeVar("R")


_live: weakref.WeakSet[Cluster] = weakref.WeakSet()
_STATE_MOVE = threading.Lock()  # state moves are rare and instant: one lock for all clusters
# Clusters in the order they started. The last one not stopped is "the current cluster"
# that %wb, the stepper and the dashboard all use; stopping it makes the one before current.
_current: list[weakref.ref[Cluster]] = []


@atexit.register
def _stop_all_at_exit() -> None:
    """Stop every cluster this process started (a normal kernel shutdown or restart); a
    kept one is only let go of (it runs on until its lease ends: keep.py)."""
    for cluster in list(_live):
        try:
            if cluster.kept:
                cluster.detach_sync()
            else:
                cluster.stop_sync()
        except Exception:  # exit path: never mask the interpreter's own shutdown
            log.debug("atexit stop failed for %r", cluster, exc_info=True)


def _gpu_notice(config: ClusterConfig) -> str | None:
    """More local engines than GPUs: refused for NCCL, said (and warned) for auto, before
    any process starts (the engines inherit this environment, so this count is theirs:
    gpus.py)."""
    if config.launcher != "local" or config.profile is not None or config.cluster_id is not None:
        return None
    notice = gpus.gpu_choice(config.n, config.backend, gpus.visible_gpu_count())
    if notice is not None:
        warnings.warn(notice, UserWarning, stacklevel=3)  # the caller of Cluster(...)
    return notice


def _forwarded(method: Callable[Concatenate[RankDispatch, P], R]) -> Callable[..., R]:
    """``Cluster.<name>``: ``RankDispatch.<name>`` called on the cluster's dispatcher."""

    @functools.wraps(method)
    def forward(self: Cluster, *args: P.args, **kwargs: P.kwargs) -> R:
        return method(self.dispatch, *args, **kwargs)

    return forward


class Cluster(ScriptRuns, ClusterDoctor):
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
        keep: bool = False,
        lease: float = DEFAULT_LEASE_S,
        name: str | None = None,
    ) -> None:
        # keep=True: it outlives this kernel until `lease` s after none holds it (keep.py)
        keep_as = keep_settings(keep, lease, name, foreign=foreign_setting(profile, cluster_id))
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
        # each launcher's own options, checked now (ssh: remote_python; see launch/launchers.py)
        self.launcher_options = launchers.parse_options(launcher, launcher_options)
        # versions that must match on every host, besides torch/CUDA/NCCL/workbench/Python
        self.check_packages = check_package_names("check_packages", check_packages)
        self.network: NetworkReport | None = None  # the last doctor("net")
        if profile is not None or cluster_id is not None:  # fail now, not at start
            find_connection_file(profile, cluster_id)
        self.gpu_notice = _gpu_notice(self.config)
        self.progress = progress
        self.timings: dict[str, float] = {}
        self.startup = StartupProfile()  # where the last start's time went (startup.py)
        # One owner each: the engines and their processes (EngineSet); the state and the
        # World, this cluster's (written only here; the dispatch reads them through what it is
        # handed); running code on the ranks, views, cell sockets, blocked ranks (RankDispatch).
        self.engines = EngineSet(self.config, self.launcher_options, self.check_packages, keep_as)
        self._world = World()
        self._state = ClusterState.STOPPED  # _set_state checks each move (state.py)
        self._link = StateLink(lambda: self._state, self.check_controller, self._degrade)
        self.dispatch = RankDispatch(self.engines, lambda: self._world, self._link)
        # Set when a failing rank closed the process group on every rank (a session's
        # fail-together operation); the next session build re-creates it (recover()).
        self.group_closed = False
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
            if cluster is not None and cluster.state in CURRENT:
                return cluster
        return None

    @classmethod
    def current(cls) -> Cluster:
        """The most recently started cluster that is still running (e.g. by ``%wb start``)."""
        cluster = cls.latest()
        if cluster is not None and cluster.state == ClusterState.BROKEN:
            raise cluster.controller_died()
        if cluster is None:
            raise ClusterError(
                "no running cluster; start one with `%wb start -n 2` or "
                "`workbench.Cluster(n=2).start_sync()`"
            )
        return cluster

    @classmethod
    def attach(cls, name: str | None = None) -> Cluster:
        """The kept cluster ``name`` (None: the only one no kernel holds), started with
        ``keep=True`` by a kernel of this user on this machine, rebuilt here (ranks, hosts,
        state, key) and current, with its engines' variables as they were. Its lease is
        whole again while this kernel holds it. Another live kernel holding it is an
        error naming that kernel's pid (detach or stop it there first)."""
        kept = KeptClusters().take(name)
        for ref in _current:  # already attached (or started) in this kernel
            cluster = ref()
            if (
                cluster is not None
                and cluster.kept == kept.name
                and cluster.state != ClusterState.STOPPED
            ):
                return cluster
        config = dict(kept.data["config"])
        options = config.pop("launcher_options")
        packages = config.pop("check_packages")
        cluster = cls(
            **config,
            launcher_options=options,
            check_packages=packages,
            keep=True,
            lease=float(kept.data["lease_s"]),
            name=kept.name,
        )
        return run_sync(cluster._attach(kept))

    async def _attach(self, kept: KeptCluster) -> Cluster:
        async with self._lifecycle.hold("Cluster.attach()"):
            try:
                client = await asyncio.to_thread(
                    ipp.Client, dict(kept.data["connection"]), **CLIENT_SESSION
                )
            except (OSError, TimeoutError) as exc:  # e.g. its controller just died
                raise ClusterError(
                    f"kept cluster {kept.name!r}: its controller does not answer ({exc}); "
                    "`%wb list` shows whether it still runs"
                ) from exc
            self._set_world(self._world.replaced([RankAssignment(**r) for r in kept.data["ranks"]]))
            self.engines.adopt(kept, client, self._world.ranks)
            # an engine that died while no kernel held the cluster: `%wb restart`
            lost = [r.rank for r in self.ranks if r.engine_id not in client.ids]
            self._set_state(ClusterState.DEGRADED if lost else ClusterState.RUNNING)
            _live.add(self)
            _current[:] = [r for r in _current if r() not in (None, self)] + [weakref.ref(self)]
            return self

    @property
    def kept(self) -> str | None:
        """A kept cluster's name (``keep=True``, or attached); None for an ordinary one."""
        return self.engines.kept.name if self.engines.kept is not None else None

    @async_first
    async def detach(self) -> None:
        """Let go of a kept cluster without stopping it: its processes and the engines'
        variables stay, its lease starts now, and ``Cluster.attach`` (here or in another
        kernel of this user) takes it up again. Kernel exit and restart detach too."""
        async with self._lifecycle.hold("cluster.detach()"):
            if self.engines.kept is None:
                raise ClusterError(
                    "only a kept cluster can be detached (start it with keep=True); "
                    "stop this one with stop_sync()"
                )
            self.dispatch.forget()
            self.engines.release()
            self._set_world(self._world.replaced(()))
            self._set_state(ClusterState.STOPPED)
            _live.discard(self)

    # ----------------------------------------------------------------- state
    @property
    def state(self) -> ClusterState:
        """``stopped``, ``starting``, ``running``, ``degraded`` (a dead or stuck engine:
        ``recover``), ``broken`` (the controller died: ``restart``), ``stopping``
        (``ClusterState``, equal to those strings)."""
        if self._state in LIVE and self.engines.controller_lost():
            self._set_state(ClusterState.BROKEN, if_in=LIVE)
        return self._state

    def _set_state(
        self, new: ClusterState, *, if_in: frozenset[ClusterState] | None = None
    ) -> None:
        """The one writer of the state: a move the lifecycle does not allow raises
        (state.py). ``if_in``: only from these states (a report from another thread)."""
        with _STATE_MOVE:  # a dispatch thread's report and a stop, at once: one after the other
            if if_in is not None and self._state not in if_in:
                return  # it moved meanwhile (stopping, broken): the report is moot
            self._state = checked_move(self._state, new)

    def _degrade(self) -> None:
        """The dispatch saw an engine die or a rank stay stuck: a live cluster is degraded
        (a stopping or broken one stays what it is)."""
        self._set_state(ClusterState.DEGRADED, if_in=LIVE)

    @property
    def world(self) -> World:
        """The ranks now (frozen: a recovery, shrink or grow makes a new one)."""
        return self._world

    @property
    def ranks(self) -> list[RankAssignment]:
        return list(self._world.ranks)

    def _set_world(self, world: World) -> None:
        """The one writer of the world: the start, a recovery or a grow hands each new one
        here as it makes it (world.py)."""
        self._world = world

    @property
    def run_dir(self) -> str | None:
        """Out-of-band status files of the engines (see engine/hang.py) and the watchdog's."""
        return self.engines.run_dir

    @property
    def environment(self) -> EnvironmentReport | None:
        """Every host's versions, compared at start (doctor_env.py)."""
        return self.engines.environment

    def controller_died(self) -> ClusterError:
        """The error every call raises once the controller is gone."""
        return self.engines.controller_died()

    def check_controller(self) -> None:
        """Raise ``controller_died()`` when the controller is gone (fast, no round trip)."""
        if self.state == ClusterState.BROKEN:
            raise self.engines.controller_died()

    def controller_lost(self) -> bool:
        """True when the controller this cluster started has exited."""
        return self.engines.controller_lost()

    def pids(self) -> list[int]:
        """Process ids (on this host) of the controller, engines and their nannies started
        by this cluster."""
        return self.engines.pids(self._world.ranks)

    # ----------------------------------------------------------------- introspection
    def __repr__(self) -> str:
        c = self.config
        parts = [f"n={c.n}", f"launcher={c.launcher!r}", f"state={self.state.value!r}"]
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
        client = self.engines.client
        if client is None or self.state not in LIVE:
            raise ClusterError("the cluster is not running; start it with start_sync()")
        return client

    @property
    def ipp_cluster(self) -> ipp.Cluster | None:
        """The underlying ipyparallel cluster (None when connected to an external one)."""
        return self.engines.ipp

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
    async def recover(self, *, shrink: bool = False, drop: tuple[int, ...] = ()) -> RecoveryReport:
        """Replace dead engines, free or replace stuck ones, keep the rest and their rank
        numbers, and re-create the process group on a fresh port. Returns a
        ``RecoveryReport``. See ``workbench.cluster.lifecycle.recovery``. ``shrink=True`` drops the
        dead ranks instead (and the survivors in ``drop``) and renumbers the rest."""
        async with self._lifecycle.hold("cluster.recover()"):
            self.engines.refuse_if_adopted("recover (replace engines)")
            stuck = self.dispatch.stuck
            report = await recover_engines(
                self.engines,
                self._world,
                (stuck.held, stuck.given_up),
                self._link,
                self._set_world,
                shrink=shrink,
                drop=drop,
            )
            self._regrouped()
            self.timings["recover_s"] = report.seconds
            return report

    @async_first
    async def grow(self, n: int = 1, *, hosts: Sequence[str] | str | None = None) -> RecoveryReport:
        """Add ``n`` engines as new last ranks (round-robin on ``hosts`` when given: ssh,
        slurm) and re-create the process group at the bigger world size (after a shrink:
        back to the size it had). Returns a ``RecoveryReport``."""
        async with self._lifecycle.hold("cluster.grow()"):
            self.engines.refuse_if_adopted("grow")
            report = await grow_engines(
                self.engines, self._world, self._link, self._set_world, n, hosts
            )
            self._regrouped()
            return report

    def _regrouped(self) -> None:
        """A fresh process group on every rank: none is blocked, none has it closed."""
        self._set_state(ClusterState.RUNNING, if_in=LIVE)  # (a controller that died: broken)
        self.dispatch.stuck.forget()
        self.group_closed = False

    def lost_ranks(self) -> list[int]:
        """Ranks whose engine is gone or does not respond (what a recovery replaces or
        drops)."""
        return lost_ranks(self.engines, self._world.ranks)

    # the blocking twins, for scripts (workbench.cluster.loop: one rule for every pair)
    start_sync = sync_twin(start)
    stop_sync = sync_twin(stop)
    restart_sync = sync_twin(restart)
    recover_sync = sync_twin(recover)
    grow_sync = sync_twin(grow)
    detach_sync = sync_twin(detach)

    async def _start(self) -> Cluster:
        if self.state in LIVE:
            return self
        if self.state == ClusterState.BROKEN:  # reap what outlived the controller first
            await self._stop()
        self._set_state(ClusterState.STARTING)
        self.network = None  # measured on the engines that are about to be replaced
        notes, self.startup = self.startup.notes, StartupProfile()
        self.startup.notes.update(notes)  # e.g. the kernel's import of the magics
        try:
            self.timings = await start_sequence.start(
                self.engines,
                self._world,
                self._set_world,
                self.startup,
                self._report,
                self.dispatch.cells.ask_port,
            )
        except BaseException:
            await self._shutdown(quiet=True)
            self._set_state(ClusterState.STOPPED)
            raise
        self._set_state(ClusterState.RUNNING)
        _live.add(self)
        _current[:] = [r for r in _current if r() not in (None, self)] + [weakref.ref(self)]
        return self

    async def _stop(self) -> None:
        if (
            self.state == ClusterState.STOPPED
            and self.engines.ipp is None
            and self.engines.client is None
        ):
            return
        self._set_state(ClusterState.STOPPING)
        await self._shutdown(quiet=False)
        self._set_state(ClusterState.STOPPED)
        _live.discard(self)

    @property
    def stuck_ranks(self) -> list[int]:
        """Ranks left blocked (in a collective) by a timeout, an interrupt or a death."""
        return self.dispatch.stuck.ranks

    # ----------------------------------------------------------------- running code
    # RankDispatch does it; these are the cluster's public names for it (same signatures
    # and docstrings).
    run = _forwarded(RankDispatch.run)
    run_each = _forwarded(RankDispatch.run_each)
    execute = _forwarded(RankDispatch.execute)
    debug = _forwarded(RankDispatch.debug)  # post-mortem pdb on a rank (%wb debug)
    interrupt = _forwarded(RankDispatch.interrupt)
    status = _forwarded(RankDispatch.status)
    stacks = _forwarded(RankDispatch.stacks)
    ensure_alive = _forwarded(RankDispatch.ensure_alive)
    view = _forwarded(RankDispatch.view)
    collect = _forwarded(RankDispatch.collect)

    # ----------------------------------------------------------------- internals
    def _report(self, stage: str, done: int, total: int) -> None:
        if self.progress is not None:
            try:
                self.progress(stage, done, total)
            except Exception:  # a broken progress display must never break start-up
                log.debug("progress callback failed", exc_info=True)

    def status_dir_of(self, rank: RankAssignment) -> str | None:
        """Where ``rank`` writes its out-of-band status (None: nowhere it can see)."""
        return self.engines.status_dir_of(rank)

    async def _shutdown(self, *, quiet: bool) -> None:
        try:
            await shutdown(self.engines, self._world.ranks, quiet=quiet)
            self._set_world(self._world.replaced(()))  # every rank's engine is gone
        finally:  # what the dispatcher holds per engine (views, cell sockets, stuck ranks)
            self.dispatch.forget()
