"""How long an engine on another host may go without its controller's heartbeat before it
ends itself (``workbench.engine.fencing``), and the heartbeat that bound derives from.

The controller pings every engine each ``REMOTE_PERIOD_MS`` and declares one dead after
``CONTROLLER_MISSES`` unanswered pings (ipyparallel's ``HeartMonitor`` default): 5 s. The
kernel tells a lost host within ~10 s (``host_loss.py``; 8-10 s measured on the bed) and
re-forms the group without it. An engine that has heard no ping for ``FENCE_AFTER_S`` =
6 x those 5 s = 30 s was dropped by the controller 25 s earlier and is no rank of any group
the kernel forms since: ending it can only free what it holds. Six windows rather than one
keep a controller slowed by a loaded machine (or a brief link flap) from costing a healthy
engine its life; a rank busy in a long cell is never at risk, since the pings reach a
thread of its own. ipyparallel's own engine-side check (``IPEngine.max_heartbeat_misses``,
50 checks of period + 500 ms: 50 s here) runs only while the engine's main loop is idle
and leaves the nanny running: measured on the bed without the fence, a cut-off host's
engines and nannies were still there 120 s after the cut and 20 s after the stop.
"""

from __future__ import annotations

__all__ = ["CONTROLLER_MISSES", "FENCE_AFTER_S", "REMOTE_PERIOD_MS", "fence_after_s"]

REMOTE_PERIOD_MS = 500  # the controller's heartbeat period when engines are on other hosts
CONTROLLER_MISSES = 10  # ipyparallel's HeartMonitor.max_heartmonitor_misses (its default)
FENCE_AFTER_S = 6 * CONTROLLER_MISSES * REMOTE_PERIOD_MS / 1000


def fence_after_s(launcher: str) -> float:
    """The fence for engines ``launcher`` starts: ``FENCE_AFTER_S`` on other hosts (ssh,
    mpi, slurm), 0 (none) for a local cluster, whose engines the kernel reaches directly."""
    return 0.0 if launcher == "local" else FENCE_AFTER_S
