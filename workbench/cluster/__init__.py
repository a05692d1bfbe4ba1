"""Cluster lifecycle: ipyparallel engines, rank assignment, rendezvous, running code."""

from workbench.cluster.cluster import Cluster, ProgressCallback
from workbench.cluster.ranks import EngineInfo, RankAssignment, assign_ranks
from workbench.cluster.results import CellResult

__all__ = [
    "CellResult",
    "Cluster",
    "EngineInfo",
    "ProgressCallback",
    "RankAssignment",
    "assign_ranks",
]
