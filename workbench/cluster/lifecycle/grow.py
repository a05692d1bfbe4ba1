"""``grow(engines, world, n)``: more ranks on a running cluster, the inverse of a shrink
(``recover(shrink=True)``): new engines join as the last ranks and every rank joins a new
process group at the bigger world size. A training session then rebuilds its run there and
loads its last checkpoint, resharded (``TrainingSession.grow``)."""

from __future__ import annotations

import time
from dataclasses import replace

from workbench import validate
from workbench.cluster.hosts.host_placement import check_hosts, placed, start_on
from workbench.cluster.lifecycle.engines import EngineSet
from workbench.cluster.lifecycle.recovery import RecoveryReport, regroup
from workbench.cluster.lifecycle.registration import new_engines
from workbench.cluster.state import ClusterState, StateLink
from workbench.cluster.world import Commit, World
from workbench.config import MAX_ENGINES
from workbench.errors import ClusterError

__all__ = ["grow"]


async def grow(
    engines: EngineSet,
    world: World,
    state: StateLink,
    commit: Commit,
    count: int,
    hosts: object = None,
) -> RecoveryReport:
    """Start ``count`` engines where the launcher puts them (or round-robin on ``hosts``)
    and add them as the last ranks (a new process group at the bigger world size). The
    inverse of a shrink. Each new world goes to ``commit`` as it is made."""
    validate.integer("n", count, minimum=1, maximum=MAX_ENGINES, what="a number of engines")
    if hosts is not None:
        hosts = check_hosts("hosts", hosts, engines.config.launcher)
    state.check()
    ranks = world.ranks
    if state.last() != ClusterState.RUNNING or not ranks:
        raise ClusterError(
            f"the cluster is {state.last().value}; grow a running cluster (recover it first)"
        )
    ipp_cluster = engines.ipp
    if ipp_cluster is None or engines.config.launcher == "mpi":
        raise ClusterError(
            "this cluster cannot take new engines (an external ipyparallel cluster or one "
            "mpiexec job); restart it with the number of ranks you want"
        )
    started = time.perf_counter()
    report = RecoveryReport()
    if hosts is None:
        start = ipp_cluster.start_engines(count)
    else:
        start = start_on(ipp_cluster, placed(hosts, count))
    new = await new_engines(engines, ranks, count, start)
    template = ranks[-1]
    added = []
    for eid, info in new:
        engines.started_by({eid: info.get("launch_host", "")})
        added.append(
            replace(
                template,
                engine_id=eid,
                pid=info["pid"],
                host=info["host"],
                pid_space=info["pid_space"],
            )
        )
    world = world.grown(added)
    commit(world)
    report.added = [r.rank for r in world.ranks if r.engine_id in dict(new)]
    await regroup(engines, world, commit)
    report.seconds = time.perf_counter() - started
    return report
