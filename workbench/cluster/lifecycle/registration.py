"""Engines registering: each is asked for its facts (host, pid, address, versions) as
soon as it registers, so that importing torch there overlaps with the others still
starting; the start waits for ``n`` of them, refusing at once when the controller or the
engines exited, and hands the chosen engines' facts to rank assignment. Engines started
later (a recovery's replacements, ``grow``'s new ranks) register through ``new_engines``:
the same facts and environment check, and one refused is shut down at once."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import ipyparallel as ipp

from workbench.cluster.doctor.doctor_env import compare_new_engines
from workbench.cluster.hosts import fencing
from workbench.cluster.launch import launchers
from workbench.cluster.launch.fork import ForkEngineSetLauncher
from workbench.cluster.launch.ssh import attach_nannies
from workbench.cluster.lifecycle.engines import EngineSet
from workbench.cluster.lifecycle.startup import StartupProfile
from workbench.cluster.ranks import EngineInfo, RankAssignment
from workbench.engine import boot
from workbench.engine.hosts import local_pid_space
from workbench.errors import ClusterError

__all__ = [
    "OnRegister",
    "Report",
    "engine_info",
    "engine_infos",
    "engines_exited",
    "gather",
    "new_engines",
    "wait_for_engines",
    "watch_engines",
]

# (stage, done, total): the cluster's progress callback, "engines" then "rendezvous"
Report = Callable[[str, int, int], None]
# Called with each engine's id as it registers (the direct cell pool asks for its socket)
OnRegister = Callable[[int], None]


async def wait_for_engines(
    engines: EngineSet,
    startup: StartupProfile,
    report: Report,
    on_register: OnRegister | None = None,
) -> None:
    """Until ``n`` engines have registered; each is asked for its facts as it registers."""
    client = engines.client_unchecked()
    n = engines.config.n
    deadline = time.monotonic() + engines.config.start_timeout
    seen = -1
    engines.registering()
    while True:
        # One read of the ids per pass: an engine may register between two reads, and
        # every id counted must be one whose facts were asked for.
        ids = sorted(client.ids)
        # Ask each engine for its facts as soon as it registers: importing torch there
        # overlaps with the other engines still starting.
        for eid in ids:
            if eid not in engines.info_futures:
                _ask_facts(engines, startup, eid)
                if on_register is not None:  # e.g. its %%wb cell socket, so the first
                    on_register(eid)  # cell sends at once
        count = len(ids)
        if count != seen:
            report("engines", min(count, n), n)
            seen = count
        if count >= n:
            startup.mark("all engines registered")
            engines.chose(ids[:n])
            return
        _refuse_a_failed_start(engines, count, deadline)
        await asyncio.sleep(0.02)


def _ask_facts(engines: EngineSet, startup: StartupProfile, eid: int) -> None:
    client = engines.client_unchecked()
    startup.engine_now(eid, "registered")
    fence_s = fencing.fence_after_s(engines.config.launcher) if engines.owns else 0.0
    future = client[eid].apply_async(boot.timed_engine_info, engines.check_packages, fence_s)
    future.add_done_callback(lambda _f, eid=eid: startup.engine_now(eid, "answered"))
    engines.asked(eid, future, client[eid].apply_async(*engines.address_call()))


def _refuse_a_failed_start(engines: EngineSet, count: int, deadline: float) -> None:
    """Raise when the start cannot finish: the controller or the engines exited, or time
    ran out at ``deadline`` (``count`` engines registered so far)."""
    n = engines.config.n
    if engines.controller_lost():
        raise ClusterError(
            "the ipyparallel controller exited during start-up; run "
            "`ipcontroller --debug` by hand to see why"
        )
    if engines.owns and engines_exited(engines):
        output = launchers.launcher_output(engines.ipp)
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
            f"start_timeout={engines.config.start_timeout}s; raise start_timeout or "
            "check the launcher"
        )


def engines_exited(engines: EngineSet) -> bool:
    if engines.ipp is None:
        return False
    for engine_set in engines.ipp.engines.values():
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


async def engine_infos(
    engines: EngineSet, startup: StartupProfile
) -> tuple[list[int], list[dict[str, Any]]]:
    """The engines chosen by ``wait_for_engines`` and the facts each reported."""
    ids = list(engines.engine_ids)
    futures = [engines.info_futures[eid] for eid in ids]
    infos = await asyncio.gather(*(asyncio.wrap_future(f) for f in futures))
    startup.mark("torch imported on every engine")
    try:
        addresses = await asyncio.gather(
            *(asyncio.wrap_future(engines.address_futures[eid]) for eid in ids)
        )
    except ipp.error.RemoteError as exc:  # e.g. network_interface missing on a host
        raise ClusterError(f"{exc.ename}: {exc.evalue}") from None
    infos = [{**info, **addr} for info, addr in zip(infos, addresses, strict=True)]
    here = local_pid_space()
    for eid, info in zip(ids, infos, strict=True):
        # another host's wall clock is not ours: its process start is left out
        startup.engine_facts(eid, info, same_clock=info.get("pid_space") == here)
    engines.started_by(
        {eid: str(info.get("launch_host", "")) for eid, info in zip(ids, infos, strict=True)},
        only=True,
    )
    if engines.ipp is not None:
        attach_nannies(engines.ipp, dict(zip(ids, infos, strict=True)))
    watch_engines(engines, list(zip(ids, infos, strict=True)))
    return ids, list(infos)


def watch_engines(engines: EngineSet, new: list[tuple[int, dict[str, Any]]]) -> None:
    """Have the kernel report these engines' deaths (a local cluster's engines have no
    nanny to do it; ``new`` are (engine id, the facts it reported))."""
    watch = engines.watch
    if watch is None:
        return
    here = local_pid_space()
    for eid, info in new:
        if info.get("pid_space") == here:
            watch.watch(eid, int(info["pid"]))


def engine_info(engine_id: int, info: dict[str, Any]) -> EngineInfo:
    return EngineInfo(
        engine_id=engine_id,
        host=info["host"],
        pid=info["pid"],
        address=info["address"],
        cuda_devices=info["cuda_devices"],
        cpus=info["cpus"],
        pid_space=info.get("pid_space", ""),
    )


async def gather(futures: list[Any], timeout: float) -> list[Any]:
    """The results of ipyparallel ``futures``, waited for ``timeout`` seconds at most."""
    return await asyncio.wait_for(asyncio.gather(*map(asyncio.wrap_future, futures)), timeout)


async def new_engines(
    engines: EngineSet, ranks: list[RankAssignment], count: int, start: Any
) -> list[tuple[int, dict[str, Any]]]:
    """Await ``start`` (which starts ``count`` engines), wait until they register and return
    each one's id and facts (pid, host, address, launch host)."""
    client = engines.client_unchecked()
    before = set(client.ids)
    await start
    engines.write_pidfile(ranks)  # the watchdog covers the new engines from their launch
    deadline = time.monotonic() + engines.config.start_timeout
    while len(set(client.ids) - before) < count:
        if time.monotonic() > deadline:
            raise ClusterError(
                f"{count} new engine(s) did not register within "
                f"start_timeout={engines.config.start_timeout}s"
            )
        await asyncio.sleep(0.02)
    new_ids = sorted(set(client.ids) - before)[:count]
    # its facts, with the environment the start compared (doctor_env.py); fenced alike
    fence_s = fencing.fence_after_s(engines.config.launcher)
    ask = (boot.timed_engine_info, engines.check_packages, fence_s)
    infos = await gather(
        [client[eid].apply_async(*ask) for eid in new_ids],
        timeout=engines.config.start_timeout,
    )
    try:
        new_infos = list(zip(new_ids, infos, strict=True))
        engines.compared(
            compare_new_engines(engines.environment, new_infos, engines.check_packages)
        )
    except ClusterError:  # refused: they take no rank, so they must not stay idle until stop
        client.shutdown(targets=new_ids, block=False)
        raise
    facts = await gather(
        [client[eid].apply_async(*engines.address_call()) for eid in new_ids],
        timeout=engines.config.start_timeout,
    )
    new = [(eid, {**info, **fact}) for eid, info, fact in zip(new_ids, infos, facts, strict=True)]
    if engines.ipp is not None:
        attach_nannies(engines.ipp, dict(new))
    watch_engines(engines, new)
    return new
