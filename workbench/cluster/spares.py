"""A lost host's ranks started again on a spare host (``Cluster(..., spare_hosts=[...])``).

When recovery finds a host lost (every engine gone, the host silent: ``decide_loss``) and
the cluster has a spare that runs none of its ranks and answers, the lost ranks' engines are
started there instead: their launch host becomes the spare, so recovery's replacement step
starts them there with the ranks' old numbers (``recovery._replace``). Their host changes,
so ``LOCAL_RANK`` / ``GROUP_RANK`` are recomputed for every rank, and when rank 0 was on the
lost host the rendezvous moves to rank 0's new host (its address becomes ``MASTER_ADDR``).
A training session then rolls back to its last checkpoint, as after any recovery.
"""

from __future__ import annotations

from workbench.cluster.elastic import decide_loss, probe_host
from workbench.cluster.engines import EngineSet
from workbench.cluster.ranks import RankAssignment
from workbench.errors import HostLost

__all__ = ["move_to_spares"]


def move_to_spares(
    engines: EngineSet, ranks: list[RankAssignment], dead: list[int]
) -> dict[str, str]:
    """For each lost host among ``dead``'s, point its ranks' launch host at a free spare
    that answers; returns lost host -> spare. Raises ``HostLost`` (saying no spare is left
    when the cluster had some) for a lost host no spare can take."""
    moved: dict[str, str] = {}
    while True:
        try:
            decide_loss([r for r in ranks if r.host not in moved], dead, probe_host)
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
                engines.launch_hosts[ranks[rank].engine_id] = spare
            moved[lost.host] = spare


def _free_spare(engines: EngineSet, ranks: list[RankAssignment], taken: set[str]) -> str | None:
    """The first spare that runs no rank, is not taken already and answers a probe."""
    busy = {r.host for r in ranks} | set(engines.launch_hosts.values()) | taken
    for spare in engines.config.spare_hosts:
        if spare not in busy and probe_host(spare):
            return spare
    return None
