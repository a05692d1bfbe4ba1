"""A cluster's stop: every process it started ends, and its files go.

A local cluster stops within a second (fast_stop.py): its engines end themselves with
``os._exit(0)``, one blocked in a collective is ended by pid, and the controller gets
SIGTERM then SIGKILL. The multi-node launchers keep the polite path: the ranks leave the
process group, ipyparallel asks the engines to exit, and the launcher stops what it started
on the other hosts (a remote pid is never signalled from here).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
from collections.abc import Sequence
from typing import Any

import psutil

from workbench.cluster import watchdog
from workbench.cluster.launch import launchers, standby
from workbench.cluster.lifecycle import fast_stop
from workbench.cluster.lifecycle.engines import EngineSet, local_ranks
from workbench.cluster.processes import reap, started_for, terminate
from workbench.cluster.ranks import RankAssignment
from workbench.engine import boot, process_group

__all__ = ["shutdown"]

log = logging.getLogger("workbench.cluster")


async def shutdown(engines: EngineSet, ranks: Sequence[RankAssignment], *, quiet: bool) -> None:
    """Stop every process of ``engines`` (see the module docstring); ``ranks`` are the
    cluster's, whose world is empty once this returns. What the cluster holds per rank
    besides (views, stuck cells, cell sockets) is its dispatcher's to forget."""
    kept = engines.kept
    if engines.adopted is not None and kept is not None:  # attached here: its watchdog ends it
        engines.release()
        await asyncio.to_thread(kept.end)
        return
    standby.end(engines.take_standby())  # not yet taken: nothing else would end it
    # Snapshot every process first: once engines exit, their nannies are orphans.
    processes = engines.process_tree(ranks)
    watch = engines.take_watch()
    if watch is not None:  # the engines' exits that follow are this stop's own
        await asyncio.to_thread(watch.close)
    # Without a controller no request reaches the engines: stop them by pid below.
    lost = engines.controller_lost()
    fast = engines.config.launcher == "local" and engines.owns
    client = engines.take_client()
    asked = client is not None and bool(ranks) and engines.owns and not lost
    if client is not None:
        if asked:
            await _ask_engines_to_exit(engines, ranks, client, processes, fast)
        client.close()
    if asked and not fast:
        await asyncio.to_thread(_finish_engines, engines, ranks, processes, False)
    if lost:  # the dead controller's schedulers and the engines: nobody else ends them
        await asyncio.to_thread(terminate, processes)
    elif fast:  # a local controller holds nothing worth a slow exit
        await asyncio.to_thread(fast_stop.end, _controller_tree(engines))
    dog = engines.take_watchdog()
    if dog is not None:  # told now (it only exits), so its last poll overlaps what follows
        dog.terminate()
    ipp_cluster = engines.take_ipp()
    if ipp_cluster is not None:
        await _stop_ipyparallel(ipp_cluster, quiet=quiet)
    ssh_dir = engines.take_ssh_dir()
    if ssh_dir is not None:
        await launchers.close_ssh(engines.config.hosts, engines.launcher_options, ssh_dir)
        shutil.rmtree(ssh_dir, ignore_errors=True)
    if ipp_cluster is not None and engines.owns:
        known = {p.pid for p in processes}
        processes += [p for p in started_for(ipp_cluster.cluster_id) if p.pid not in known]
    await asyncio.to_thread(reap, processes)
    if ipp_cluster is not None and engines.owns:  # its controller is gone: nothing rewrites it
        _remove_engine_state(ipp_cluster)
    engines.forget_processes()
    if dog is not None:
        watchdog.stop(dog)
    run_dir = engines.take_run_dir()
    if run_dir is not None:
        shutil.rmtree(run_dir, ignore_errors=True)
    if kept is not None:  # a kept cluster stopped in the kernel that started it
        engines.forget_kept()
        kept.remove()


def _remove_engine_state(ipp_cluster: Any) -> None:
    """The controller's hub records its engines in ``<profile>/log/engines<id>.json``
    (for ``--restore``, which a cluster of ours never uses) and never removes it: one file
    per start would pile up in the user's profile. Its connection files are removed too:
    ipyparallel does, but a soak of 31 starts left one pair behind (a controller ended
    before its own clean-up ran)."""
    profile_dir = getattr(ipp_cluster, "profile_dir", None)
    cluster_id = getattr(ipp_cluster, "cluster_id", None)
    if not (profile_dir and cluster_id):
        return
    left = [os.path.join(profile_dir, "log", f"engines{cluster_id}.json")]
    left += [
        os.path.join(profile_dir, "security", f"ipcontroller-{cluster_id}-{kind}.json")
        for kind in ("client", "engine")
    ]
    for path in left:
        with contextlib.suppress(OSError):
            os.remove(path)


async def _ask_engines_to_exit(
    engines: EngineSet,
    ranks: Sequence[RankAssignment],
    client: Any,
    processes: list[psutil.Process],
    fast: bool,
) -> None:
    if fast:
        try:  # engines end themselves at once: see fast_stop.py
            ids = [r.engine_id for r in ranks if r.engine_id in client.ids]
            client[ids].apply_async(boot.exit_now)
        except Exception:
            log.debug("asking engines to exit failed", exc_info=True)
        # before client.close(): the requests must have left
        await asyncio.to_thread(_finish_engines, engines, ranks, processes, True)
        return
    try:  # leave the process group cleanly so engines exit without noise
        ar = client[[r.engine_id for r in ranks if r.engine_id in client.ids]]
        ar.apply_async(process_group.teardown_rank).get(timeout=5)
        # Asking engines to exit is faster than SIGTERM from the launcher.
        client.shutdown(targets=ar.targets, hub=False, block=True)
    except Exception:
        log.debug("teardown on engines failed", exc_info=True)


async def _stop_ipyparallel(ipp_cluster: Any, *, quiet: bool) -> None:
    """Stop the launcher's engine sets, then the controller (through ipyparallel)."""
    try:
        # every engine set at once (ipyparallel stops them one after another;
        # recovery adds a set per replacement)
        await asyncio.gather(*(ipp_cluster.stop_engines(i) for i in list(ipp_cluster.engines)))
    except Exception:  # e.g. a set that failed to start: stop_cluster retries
        log.debug("stopping engine sets failed", exc_info=True)
    try:
        await ipp_cluster.stop_cluster()
    except Exception:
        if not quiet:
            raise


def _controller_tree(engines: EngineSet) -> list[psutil.Process]:
    """The controller this cluster started and its schedulers (empty if none)."""
    proc = engines.controller_process()
    if proc is None:
        return []
    try:
        return [proc, *proc.children(recursive=True)]
    except psutil.Error:
        return []


def _finish_engines(
    engines: EngineSet, ranks: Sequence[RankAssignment], processes: list[psutil.Process], fast: bool
) -> None:
    """Once the engines have exited on request, end their nannies too.

    ipyparallel's per-engine nanny notices its engine is gone only after seconds of
    polling, and the launcher's stop waits for it; with the engine already gone it
    supervises nothing, so it is killed here and the stop that follows is quick. Only
    engines in this host's pid space are looked at.
    """
    engine_pids = {r.pid for r in local_ranks(ranks)}
    exiting = [p for p in processes if p.pid in engine_pids]
    nannies = [p for p in processes if p.pid in engines.nanny_pids]
    if fast:
        _, busy = psutil.wait_procs(exiting, timeout=1.0)
        # A local engine blocked in a collective never ran exit_now: end it by pid.
        fast_stop.end(busy, grace=0.2)
    else:
        psutil.wait_procs(exiting, timeout=2.0)
    for proc in nannies:
        try:
            proc.kill()
        except psutil.Error:
            continue
