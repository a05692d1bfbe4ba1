"""Cluster lifecycle: ipyparallel engines, rank assignment, rendezvous, running code.

The names below load on first use: engines import modules of this package too (the
functions the start sequence runs on them, e.g. ``rendezvous.engine_address``), and
importing the whole kernel-side stack there cost every engine ~0.1 s of CPU on the start's
critical path.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from workbench.lazy import lazy_getattr

if TYPE_CHECKING:
    from workbench.cluster.cluster import Cluster, ProgressCallback
    from workbench.cluster.ranks import EngineInfo, RankAssignment, assign_ranks
    from workbench.cluster.results import CellResult

# name -> module that defines it; resolved on first attribute access.
_LAZY: dict[str, str] = {
    "CellResult": "workbench.cluster.results",
    "Cluster": "workbench.cluster.cluster",
    "EngineInfo": "workbench.cluster.ranks",
    "ProgressCallback": "workbench.cluster.cluster",
    "RankAssignment": "workbench.cluster.ranks",
    "assign_ranks": "workbench.cluster.ranks",
}

__all__ = [
    "CellResult",
    "Cluster",
    "EngineInfo",
    "ProgressCallback",
    "RankAssignment",
    "assign_ranks",
]


__getattr__ = lazy_getattr(__name__, _LAZY, globals())
