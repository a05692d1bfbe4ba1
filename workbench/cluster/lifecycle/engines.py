"""``EngineSet``: one cluster's ipyparallel engines and every process started for them.

The one owner of what the kernel holds about its engines: the ipyparallel cluster and
client, the facts each engine was asked for as it registered, the engines chosen to get
ranks, their launch hosts and nannies, the kernel's watch on local engines, the orphan
watchdog with its pid file and run directory, and the controller's address (the cluster's
state is ``Cluster``'s: state.py). The start sequence, the stop and the
recovery (``start_sequence.py``, ``shutdown.py``, ``recovery.py``) change it through this
object; ``Cluster`` holds one.

Processes are remembered from the moment they are seen: once a parent dies (a killed
controller), its children cannot be found from it any more. The watchdog (watchdog.py)
learns them from a pid file, so a kernel killed at any moment leaves nothing behind. Only
pids of this host's pid space are listed: a remote engine is signalled through its own host,
never by its pid here; the pid file also carries the commands that end them there
(remote_ends.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import ipyparallel as ipp
import psutil

from workbench.cluster import watchdog
from workbench.cluster.doctor.doctor_env import EnvironmentReport
from workbench.cluster.keep import KeepSettings, KeptCluster, KeptClusters, process_info
from workbench.cluster.launch.launchers import LauncherOptions
from workbench.cluster.lifecycle.engine_watch import EngineWatch
from workbench.cluster.lifecycle.remote_ends import remote_ends
from workbench.cluster.processes import is_local, running
from workbench.cluster.ranks import RankAssignment
from workbench.config import ClusterConfig
from workbench.engine import rendezvous_probe
from workbench.engine.hosts import local_pid_space
from workbench.errors import ClusterError

if TYPE_CHECKING:
    from workbench.cluster.launch.standby import Standby

__all__ = ["EngineSet", "local_ranks"]

# jupyter_client's replay check remembers the signature of every message a session took,
# 65,536 of them by default: about 6 a training step on the kernel's client, 7.9 MiB held
# for the rest of a long run once full. What reaches the client are replies and outputs of
# its own requests (signed with the cluster's key: made by its engines); one replayed after
# CLIENT_DIGESTS newer messages names a request long resolved, which ipyparallel reports as
# unknown and no caller waits for. Given to the client's Session when it is made.
CLIENT_DIGESTS = 8192
CLIENT_SESSION = {"digest_history_size": CLIENT_DIGESTS}

log = logging.getLogger("workbench.cluster")

# How often a starting cluster records its new processes for the orphan watchdog.
_TRACK_S = 0.1


def local_ranks(ranks: Sequence[RankAssignment]) -> list[RankAssignment]:
    """Ranks whose pid is meaningful here (same machine, same PID namespace). A remote
    engine is signalled only through its own host, never by its pid here."""
    here = local_pid_space()
    # (ranks made by hand, without a pid space, fall back to comparing host names)
    return [r for r in ranks if (r.pid_space == here if r.pid_space else is_local(r.host))]


class EngineSet:
    """A cluster's engines and their processes (one owner each)."""

    def __init__(
        self,
        config: ClusterConfig,
        launcher_options: LauncherOptions,
        check_packages: tuple[str, ...],
        keep: KeepSettings | None = None,
    ) -> None:
        self.config = config
        self.launcher_options = launcher_options
        self.check_packages = check_packages  # compared on every host at start (doctor_env)
        # an external cluster (profile / cluster_id) is connected to, never started or stopped
        self.owns = config.profile is None and config.cluster_id is None
        # Fields are private: the start, the stop and the recovery change them through the
        # methods below (named after what happened), everyone reads them as properties.
        self._ipp: ipp.Cluster | None = None
        self._client: ipp.Client | None = None
        self._controller_address: str | None = None
        self._ssh_dir: str | None = None  # ssh's shared-connection sockets (launcher="ssh")
        # Out-of-band status files of the engines (see engine/hang.py) and the watchdog's pid file.
        self._run_dir: str | None = None
        # engine id -> its pending facts (engine_info; rendezvous_probe.engine_address), asked
        # for as it registers (registration.py)
        self._info_futures: dict[int, Any] = {}
        self._address_futures: dict[int, Any] = {}
        self._engine_ids: list[int] = []  # the engines that get ranks, chosen at start
        # engine id -> the launcher's host entry that started it (ssh), for replacements
        self._launch_hosts: dict[int, str] = {}
        self._lost_hosts: set[str] = set()  # launch hosts found lost: no spare host goes there
        self.nanny_pids: set[int] = set()
        self._environment: EnvironmentReport | None = None  # the hosts compared at start
        self._watch: EngineWatch | None = None  # reports local engines' deaths
        self._watchdog: subprocess.Popen[bytes] | None = None  # ends a killed kernel's orphans
        self._standby: Standby | None = None  # where a warm replacement engine waits
        # Every process this cluster started, remembered from the moment it is seen.
        self._known: dict[int, psutil.Process] = {}
        # keep=True: the processes outlive the kernel (keep.py); ``kept`` is its connection
        # file once written, ``adopted`` the controller of a cluster attached (not started)
        # by this kernel: no ipyparallel Cluster here, its watchdog ends it.
        self.keep = keep
        self.kept: KeptCluster | None = None
        self.adopted: psutil.Process | None = None

    # ----------------------------------------------------------------- read by all
    @property
    def ipp(self) -> ipp.Cluster | None:
        return self._ipp

    @property
    def client(self) -> ipp.Client | None:
        return self._client

    @property
    def controller_address(self) -> str | None:
        return self._controller_address

    @property
    def ssh_dir(self) -> str | None:
        return self._ssh_dir

    @property
    def run_dir(self) -> str | None:
        return self._run_dir

    @property
    def info_futures(self) -> Mapping[int, Any]:
        return self._info_futures

    @property
    def address_futures(self) -> Mapping[int, Any]:
        return self._address_futures

    @property
    def engine_ids(self) -> list[int]:
        return list(self._engine_ids)

    @property
    def launch_hosts(self) -> Mapping[int, str]:
        return self._launch_hosts

    @property
    def lost_hosts(self) -> frozenset[str]:
        return frozenset(self._lost_hosts)

    @property
    def environment(self) -> EnvironmentReport | None:
        return self._environment

    @property
    def watch(self) -> EngineWatch | None:
        return self._watch

    @property
    def watchdog(self) -> subprocess.Popen[bytes] | None:
        return self._watchdog

    @property
    def standby(self) -> Standby | None:
        return self._standby

    @property
    def known(self) -> Mapping[int, psutil.Process]:
        return self._known

    # ----------------------------------------------------------------- the start
    def open_run_dir(self) -> str:
        """A fresh run directory (``status_dir``: one every node shares, so hang reports
        include remote ranks)."""
        self._run_dir = tempfile.mkdtemp(
            prefix="wb-run-", dir=self.launcher_options.status_dir or None
        )
        return self._run_dir

    def open_ssh_dir(self) -> str:
        """A directory for ssh's shared-connection sockets (launcher="ssh")."""
        self._ssh_dir = tempfile.mkdtemp(prefix="wb-ssh-")
        return self._ssh_dir

    def controller_at(self, address: str | None) -> None:
        """The address the controller listens on (found from the hosts, multi-node)."""
        self._controller_address = address

    def standby_ready(self, standby: Standby | None) -> None:
        """Where the forker's standby will wait to become a replacement (standby.py)."""
        self._standby = standby

    def launched(self, ipp_cluster: ipp.Cluster) -> None:
        """The ipyparallel cluster that starts the controller and the engines."""
        self._ipp = ipp_cluster

    def connected(self, client: ipp.Client, *, watch: bool = False) -> None:
        """The client to the controller; ``watch``: the kernel reports its local engines'
        deaths itself (a local cluster's engines have no nanny)."""
        self._client = client
        if watch:
            self._watch = EngineWatch.for_client(client)

    def registering(self) -> None:
        """Engines start registering: no facts asked for yet."""
        self._info_futures, self._address_futures = {}, {}

    def asked(self, engine_id: int, info: Any, address: Any) -> None:
        """``engine_id`` registered and was asked for its facts and its address."""
        self._info_futures[engine_id] = info
        self._address_futures[engine_id] = address

    def chose(self, engine_ids: Sequence[int]) -> None:
        """The engines that get ranks."""
        self._engine_ids = list(engine_ids)

    def started_by(self, hosts: Mapping[int, str], *, only: bool = False) -> None:
        """Which launch host started each engine (``only``: these are all of them)."""
        if only:
            self._launch_hosts = {}
        self._launch_hosts.update(hosts)

    def host_lost(self, engine_id: int, lost: str, spare_host: str) -> None:
        """``engine_id``'s launch host ``lost`` is lost: it is started again on
        ``spare_host`` (spare_hosts.py), and no spare host goes to ``lost`` any more."""
        self._lost_hosts.add(self._launch_hosts.get(engine_id) or lost)
        self._launch_hosts[engine_id] = spare_host

    def compared(self, environment: EnvironmentReport) -> None:
        """The hosts' versions as last compared (doctor_env.py)."""
        self._environment = environment

    # ----------------------------------------------------------------- the stop
    # Each hands over what the stop ends, and holds it no more.
    def take_standby(self) -> Standby | None:
        standby, self._standby = self._standby, None
        return standby

    def take_watch(self) -> EngineWatch | None:
        watch, self._watch = self._watch, None
        return watch

    def take_client(self) -> ipp.Client | None:
        client, self._client = self._client, None
        return client

    def take_watchdog(self) -> subprocess.Popen[bytes] | None:
        dog, self._watchdog = self._watchdog, None
        return dog

    def take_ipp(self) -> ipp.Cluster | None:
        ipp_cluster, self._ipp = self._ipp, None
        return ipp_cluster

    def take_ssh_dir(self) -> str | None:
        ssh_dir, self._ssh_dir = self._ssh_dir, None
        return ssh_dir

    def take_run_dir(self) -> str | None:
        run_dir, self._run_dir = self._run_dir, None
        return run_dir

    def forget_processes(self) -> None:
        """Every process it started has ended."""
        self._known = {}

    # ----------------------------------------------------------------- controller
    def controller_died(self) -> ClusterError:
        """The error every call raises once the controller is gone."""
        proc = self.controller_process()
        pid = f" (pid {proc.pid})" if proc is not None else ""
        return ClusterError(
            f"the cluster's ipyparallel controller{pid} died: nothing can reach the engines "
            "or notice an engine death any more. Rebuild the whole cluster with "
            "`%wb restart` (cluster.restart_sync()); this stops every process it started."
        )

    def controller_lost(self) -> bool:
        """True when the controller this cluster started has exited. It is a child of this
        process, so its pid is checked here; without it nothing routes work to the engines
        or notices that one died."""
        proc = self.controller_process()
        if proc is None:
            return False
        return not running(proc)

    def controller_process(self) -> psutil.Process | None:
        if self.adopted is not None:
            return self.adopted
        if not self.owns or self.ipp is None:
            return None
        proc = getattr(getattr(self.ipp, "controller", None), "process", None)
        return proc if isinstance(proc, psutil.Process) else None

    def client_unchecked(self) -> ipp.Client:
        """The client, whatever the state (the start, stop and recovery use it)."""
        if self.client is None:
            raise ClusterError("no ipyparallel client; the cluster has not started")
        return self.client

    # ----------------------------------------------------------------- engine facts
    def address_call(self) -> tuple[Any, ...]:
        """``apply_async`` arguments asking an engine for its reachable address etc."""
        iface = self.launcher_options.network_interface or None
        return (rendezvous_probe.engine_address, self.controller_address, iface)

    def status_dir_of(self, rank: RankAssignment) -> str | None:
        """Where ``rank`` writes its out-of-band status: the run directory when the rank
        sees it (same machine, or a ``status_dir`` shared by every node), else nowhere (a
        node-local /tmp path would only litter the node)."""
        if self.launcher_options.status_dir or rank.pid_space == local_pid_space():
            return self.run_dir
        return None

    # ----------------------------------------------------------------- processes
    def process_tree(self, ranks: Sequence[RankAssignment]) -> list[psutil.Process]:
        """Controller, engines, nannies and every process they spawned (schedulers...),
        including those seen before whose parent has died since; only running ones."""
        engine_pids = {r.pid for r in local_ranks(ranks)}
        self.nanny_pids = set()
        for pid in self.pids(ranks):
            try:
                proc = self._known.get(pid) or psutil.Process(pid)
                children = proc.children(recursive=True)
            except psutil.Error:
                continue
            self._known[pid] = proc
            for child in children:
                self._known.setdefault(child.pid, child)
            if pid in engine_pids:  # an engine's children are its nanny
                self.nanny_pids.update(c.pid for c in children)
        return [p for p in self._known.values() if running(p)]

    def pids(self, ranks: Sequence[RankAssignment]) -> list[int]:
        """Process ids (on this host) of the controller, engines and their nannies started
        by this cluster."""
        pids: list[int] = []
        if self.adopted is not None:  # attached: the controller and the local engines
            return [self.adopted.pid] + [r.pid for r in local_ranks(ranks)]
        if self.ipp is None:
            return pids
        proc = getattr(getattr(self.ipp, "controller", None), "process", None)
        if proc is not None:
            pids.append(proc.pid)
        for engine_set in getattr(self.ipp, "engines", {}).values():
            # a set that is one process (the local engines' forking one, mpiexec), or ...
            proc = getattr(engine_set, "process", None)
            if proc is not None:
                pids.append(proc.pid)
            # ... one launcher per engine
            for launcher in getattr(engine_set, "launchers", {}).values():
                proc = getattr(launcher, "process", None)
                if proc is not None:
                    pids.append(proc.pid)
        # An engine on another host (or in another PID namespace) has a pid that means
        # nothing here (its launcher's local process, e.g. ssh, is listed above instead).
        pids += [r.pid for r in local_ranks(ranks) if r.pid not in pids]
        return pids

    def start_watchdog(self) -> None:
        if not self.owns or self.run_dir is None:
            return
        watchdog.write_pidfile(self.run_dir, [])
        if self.keep is None:
            self._watchdog = watchdog.spawn(self.run_dir)
            return
        # kept: it follows the kernel that holds the cluster (this one, for now) and ends it
        # a lease after none does; the name is claimed here, before any process starts
        files = KeptClusters()
        name = files.free_name(self.keep.name)
        watchdog.write_holder(self.run_dir, os.getpid())
        self._watchdog = watchdog.spawn(self.run_dir, self.keep.lease, str(files.path_of(name)))
        self.kept = KeptCluster(files.path_of(name), {"name": name, "run_dir": self.run_dir})

    async def publish_kept(self, ranks: Sequence[RankAssignment]) -> None:
        """Write a started kept cluster's connection file (keep.py): what ``attach`` needs
        to rebuild this cluster in another kernel."""
        if self.kept is None or self.keep is None or self.ipp is None or self.run_dir is None:
            return
        info = await self.ipp.controller.get_connection_info()
        controller, dog = self.controller_process(), self.watchdog
        defaults = dataclasses.asdict(type(self.launcher_options)())
        options = {
            k: v for k, v in dataclasses.asdict(self.launcher_options).items() if v != defaults[k]
        }
        c = self.config
        self.kept = KeptClusters().write(
            self.kept.name,
            {
                "created": time.time(),
                "lease_s": self.keep.lease,
                "run_dir": self.run_dir,
                "cluster_id": self.ipp.cluster_id,
                "connection": info["client"],
                "watchdog": process_info(psutil.Process(dog.pid)) if dog else None,
                "controller": process_info(controller) if controller else None,
                "config": {
                    "n": c.n,
                    "backend": c.backend,
                    "launcher": c.launcher,
                    "hosts": list(c.hosts),
                    "init_timeout": c.init_timeout,
                    "start_timeout": c.start_timeout,
                    "threads_per_engine": c.threads_per_engine,
                    "spare_hosts": list(c.spare_hosts),
                    "check_packages": list(self.check_packages),
                    "launcher_options": options,
                },
                "ranks": [r.as_dict() for r in ranks],
            },
        )

    def adopt(self, kept: KeptCluster, client: ipp.Client, ranks: Sequence[RankAssignment]) -> None:
        """This kernel holds the kept cluster ``kept`` now, through ``client`` (attach)."""
        self.kept, self._client, self._run_dir = kept, client, kept.run_dir
        self.adopted = kept.controller()
        self._controller_address = (kept.data.get("connection") or {}).get("location")
        watchdog.write_holder(kept.run_dir, os.getpid())  # its lease is whole again
        if self.config.launcher == "local":  # no nannies: this kernel reports their deaths
            self._watch = EngineWatch.for_client(client)
            for r in local_ranks(ranks):
                self._watch.watch(r.engine_id, r.pid)

    def refuse_if_adopted(self, action: str) -> None:
        """An attached kept cluster has no launchers here to start engines with."""
        if self.adopted is not None:
            raise ClusterError(
                f"cannot {action} on a kept cluster this kernel attached (its launchers "
                "live in the kernel that started it); `%wb restart --full` "
                "(cluster.restart_sync()) starts it afresh, still kept"
            )

    def forget_kept(self) -> KeptCluster | None:
        """The kept cluster's connection file, no longer this cluster's (it stopped)."""
        kept, self.kept = self.kept, None
        return kept

    def release(self) -> None:
        """Let go of a kept cluster without ending it (detach): its watchdog's lease runs
        from now; a later ``attach`` takes it up again."""
        if self.run_dir is not None and self.kept is not None:
            watchdog.write_holder(self.run_dir, 0)
        watch, self._watch = self._watch, None
        if watch is not None:
            watch.close()
        client, self._client = self._client, None
        if client is not None:
            client.close()
        # dropped, not stopped (its shutdown_atexit is off): the processes run on
        self._ipp = self._watchdog = self.adopted = self.kept = None
        self._run_dir = self._ssh_dir = None
        self._standby = None
        self._known = {}

    async def track_start(self, ranks: Sequence[RankAssignment]) -> None:
        """While starting, tell the watchdog about each process within ``_TRACK_S`` of its
        launch (the controller, its schedulers, engines and their nannies)."""
        while True:
            try:
                self.write_pidfile(ranks)
            except Exception:  # a process exiting mid-walk: the next pass sees the rest
                log.debug("pid file update failed", exc_info=True)
            await asyncio.sleep(_TRACK_S)

    def write_pidfile(self, ranks: Sequence[RankAssignment]) -> None:
        if self.run_dir is not None and self.owns:
            pids = [p.pid for p in self.process_tree(ranks)]
            # and how to end the engines on other hosts, through their host (remote_ends.py)
            watchdog.write_pidfile(self.run_dir, pids, remote_ends(self.ipp, self.ssh_dir))
