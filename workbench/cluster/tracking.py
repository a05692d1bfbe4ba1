"""Which processes a cluster started on this host, and the orphan watchdog that ends them.

A cluster remembers every process it started (controller, its schedulers, engines, their
nannies) from the moment it is seen: once a parent dies (a killed controller), its children
cannot be found from it any more. The watchdog (watchdog.py) learns them from a pid file,
so a kernel killed at any moment leaves nothing behind. Only pids of this host's pid space
are listed: a remote engine is signalled through its own host, never by its pid here; the
pid file also carries the commands that end them there (remote_ends.py).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import psutil

from workbench.cluster import watchdog
from workbench.cluster.processes import is_local, running
from workbench.cluster.ranks import RankAssignment
from workbench.cluster.remote_ends import remote_ends
from workbench.engine.hosts import local_pid_space

__all__ = ["ProcessTracking"]

log = logging.getLogger("workbench.cluster")

# How often a starting cluster records its new processes for the orphan watchdog.
_TRACK_S = 0.1


class ProcessTracking:
    """The local processes of a ``Cluster`` (a base class of it; state lives there)."""

    ranks: list[RankAssignment]
    run_dir: str | None
    _ipp: Any
    _ssh_dir: str | None
    _owns_engines: bool
    _watchdog: Any | None
    _known: dict[int, psutil.Process]
    _nanny_pids: set[int]

    def controller_lost(self) -> bool:
        """True when the controller this cluster started has exited. It is a child of this
        process, so its pid is checked here; without it nothing routes work to the engines
        or notices that one died."""
        proc = self._controller_process()
        if proc is None:
            return False
        return not running(proc)

    def _controller_process(self) -> psutil.Process | None:
        if not self._owns_engines or self._ipp is None:
            return None
        proc = getattr(getattr(self._ipp, "controller", None), "process", None)
        return proc if isinstance(proc, psutil.Process) else None

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
        return [p for p in self._known.values() if running(p)]

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
        pids += [r.pid for r in self._local_ranks() if r.pid not in pids]
        return pids

    def _local_ranks(self) -> list[RankAssignment]:
        """Ranks whose pid is meaningful here (same machine, same PID namespace). A remote
        engine is signalled only through its own host, never by its pid here."""
        here = local_pid_space()
        # (ranks made by hand, without a pid space, fall back to comparing host names)
        return [r for r in self.ranks if (r.pid_space == here if r.pid_space else is_local(r.host))]

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
