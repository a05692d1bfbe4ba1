"""What each rank's engine is doing, seen from the kernel: the rows of ``Cluster.status()``.
The process state is read (psutil) only for engines on this host; another host's are judged
from the controller's view alone. (The error for a lost engine is ``hang.lost_engines_error``.)"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from workbench.cluster.processes import FROZEN, GONE, local_state
from workbench.cluster.ranks import RankAssignment

__all__ = ["status_rows"]


def status_rows(
    ranks: Sequence[RankAssignment], client: Any, running_cells: set[int] | None = None
) -> list[dict[str, Any]]:
    """One row per rank: rank, engine id, host, pid, device, backend, state.
    ``running_cells``: engines running a cell sent to them directly (the controller's
    queues do not see those)."""
    rows = []
    alive: set[int] = set()
    queues: dict[int, Any] = {}
    if client is not None:
        alive = set(client.ids)
        try:
            queues = client.queue_status(verbose=False)
        except Exception:
            queues = {}
    for r in ranks:
        local = local_state(r.host, r.pid)
        if local is not None and local != GONE and (r.engine_id not in alive or local in FROZEN):
            state = "unresponsive"  # the process is there but does not answer
        elif r.engine_id not in alive:
            state = "dead"
        else:
            q = queues.get(r.engine_id, {}) if isinstance(queues, dict) else {}
            busy = isinstance(q, dict) and (q.get("queue", 0) or q.get("tasks", 0))
            busy = busy or r.engine_id in (running_cells or set())
            state = "busy" if busy else "idle"
        rows.append(
            {
                "rank": r.rank,
                "engine": r.engine_id,
                "host": r.host,
                "pid": r.pid,
                "device": r.device,
                "backend": r.backend,
                "state": state,
            }
        )
    return rows
