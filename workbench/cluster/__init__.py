"""The cluster, in the kernel: ``Cluster`` (cluster.py), the only writer of its state
(state.py) and its ``World`` of ranks (world.py); rank assignment (ranks.py). Its rooms:
``lifecycle/`` (the engines and what starts, stops and recovers them), ``hosts/``,
``launch/`` (how the processes get started), ``dispatch/`` (running code on ranks) and
``doctor/``.

The names below load on first use. Engines no longer import this package (what runs on
them lives in ``workbench.engine``), but the workbench kernel's launcher imports
``launch.warm_start`` before the kernel itself starts (``kernel_launcher.py``), and the whole
kernel-side stack (ipyparallel, zmq) would add ~0.7 s there.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from workbench.lazy import lazy_getattr

if TYPE_CHECKING:
    from workbench.cluster.cluster import Cluster, ProgressCallback
    from workbench.cluster.dispatch.results import CellResult
    from workbench.cluster.ranks import EngineInfo, RankAssignment, assign_ranks

# name -> module that defines it; resolved on first attribute access.
_LAZY: dict[str, str] = {
    "CellResult": "workbench.cluster.dispatch.results",
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
