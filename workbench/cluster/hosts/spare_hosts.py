"""A lost host's ranks started again on a spare host (``Cluster(..., spare_hosts=[...])``).

When recovery finds a host lost (every engine gone, the host silent or, under Slurm, its
node out of service: ``decide_loss`` with ``slurm_nodes.host_answers``) and the cluster has a
spare that runs none of its ranks and answers, the lost ranks' engines are started there
instead: their launch host becomes the spare, so recovery's replacement step starts them
there with the ranks' old numbers (``recovery._replace``): ssh runs them on the spare, Slurm
submits 1-engine jobs pinned to it (``--nodelist=SPARE``, in the cluster's partition).
``spare_hosts="any"`` (Slurm only) names no node: the jobs go wherever the partition has
room, ``--exclude`` naming every node the cluster runs on or lost (``start_args``) and
those the user's own ``sbatch_args`` exclude (sbatch keeps only the last ``--exclude``, so
the two are merged into one).
Their host changes, so ``LOCAL_RANK`` / ``GROUP_RANK`` are recomputed for every rank, and
when rank 0 was on the lost host the rendezvous moves to rank 0's new host (its address
becomes ``MASTER_ADDR``). A training session then rolls back to its last checkpoint, as
after any recovery.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from workbench.cluster.hosts import slurm_nodes
from workbench.cluster.launch.launchers import sbatch_args
from workbench.cluster.launch.sbatch_exclude import split_exclude
from workbench.cluster.lifecycle.elastic import decide_loss, probe_host
from workbench.cluster.lifecycle.engines import EngineSet
from workbench.cluster.ranks import RankAssignment
from workbench.config import ANY_SPARE
from workbench.errors import HostLost

__all__ = ["move_to_spares", "start_args"]


def move_to_spares(
    engines: EngineSet, ranks: Sequence[RankAssignment], dead: list[int]
) -> dict[str, str]:
    """For each lost host among ``dead``'s, point its ranks' launch host at a free spare
    that answers; returns lost host -> spare. Raises ``HostLost`` (saying no spare is left
    when the cluster had some) for a lost host no spare can take."""
    moved: dict[str, str] = {}
    answers = _answers(engines)
    while True:
        try:
            decide_loss([r for r in ranks if r.host not in moved], dead, answers)
            return moved
        except HostLost as lost:
            spare = _free_spare(engines, ranks, set(moved.values()))
            if spare is None:
                if engines.config.spare_hosts:
                    raise HostLost(
                        f"{lost}; no spare host is left to take its ranks (spare_hosts="
                        f"{list(engines.config.spare_hosts)} are in use or do not answer)",
                        ranks=lost.ranks,
                        host=lost.host,
                    ) from None
                raise
            for rank in lost.ranks:
                engines.host_lost(ranks[rank].engine_id, lost.host, spare)
            moved[lost.host] = spare


def _free_spare(engines: EngineSet, ranks: Sequence[RankAssignment], taken: set[str]) -> str | None:
    """The first spare that runs no rank, is not taken already and answers a probe (under
    Slurm: is also in service); ``ANY_SPARE`` while Slurm has a node free for it."""
    busy = {r.host for r in ranks} | set(engines.launch_hosts.values()) | taken
    if engines.config.spare_hosts == (ANY_SPARE,):
        # the user's excluded entries compare as names: a range such as n[1-4] matches no
        # node here, so such a node may count as free (sbatch still honours the range)
        _, theirs = split_exclude(sbatch_args(engines.launcher_options))
        avoid = busy | engines.lost_hosts | set(theirs)
        free = slurm_nodes.free_nodes(engines.launcher_options.partition, avoid)
        return None if free is not None and not free else ANY_SPARE  # None: sbatch decides
    answers = _answers(engines)
    for spare in engines.config.spare_hosts:
        if spare not in busy and spare not in engines.lost_hosts and answers(spare):
            return spare
    return None


def _answers(engines: EngineSet) -> Callable[[str], bool]:
    """How a host is asked whether it is there: its sshd; under Slurm, its node too."""
    if engines.config.launcher != "slurm":
        return probe_host
    return partial(slurm_nodes.host_answers, probe=probe_host)


def start_args(engines: EngineSet, host: str, count: int) -> dict[str, Any]:
    """``ipyparallel.Cluster.start_engines``' keyword arguments for ``count`` engines on
    launch host ``host``: that host, or for ``ANY_SPARE`` any node of the partition but
    those the cluster runs on or lost (sbatch's ``--exclude``)."""
    if host != ANY_SPARE:
        return {"engines": {host: count}}
    used = (set(engines.launch_hosts.values()) | engines.lost_hosts) - {ANY_SPARE, ""}
    rest, theirs = split_exclude(sbatch_args(engines.launcher_options))
    names = [*sorted(used), *(name for name in theirs if name not in used)]
    exclude = [f"--exclude={','.join(names)}"] if names else []
    return {"engines": {}, "sbatch_args": [*rest, *exclude]}
