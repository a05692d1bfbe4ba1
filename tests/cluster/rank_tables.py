"""Rank tables for tests that need ranks on named hosts but no engines."""

from __future__ import annotations

from workbench.cluster.ranks import EngineInfo, RankAssignment, assign_ranks

__all__ = ["ranks_on"]


def ranks_on(layout: list[tuple[str, int]]) -> list[RankAssignment]:
    """Ranks as ``assign_ranks`` gives them for ``(host, engines)`` pairs, engine ids and
    pids counted up in that order."""
    engines = []
    for host, n in layout:
        for _ in range(n):
            eid = len(engines)
            engines.append(EngineInfo(engine_id=eid, host=host, pid=1000 + eid, cpus=8))
    return assign_ranks(engines)
