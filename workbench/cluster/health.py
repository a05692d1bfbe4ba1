"""What a rank's engine is doing, seen from the kernel: the rows of ``Cluster.status()``
and the error for ranks whose engine died or stopped answering. The process state is read
here (psutil) only for engines in this host's pid space; another host's are judged from the
controller's view alone."""

from __future__ import annotations

from typing import Any

from workbench.cluster.hang import describe_rank, read_status
from workbench.cluster.processes import FROZEN, GONE, local_state
from workbench.cluster.ranks import RankAssignment
from workbench.errors import EngineDied, EngineUnresponsive

__all__ = ["lost_error", "status_rows"]


def lost_error(ranks: list[RankAssignment], run_dir: str | None, lost: list[int]) -> EngineDied:
    """``EngineDied`` for ranks whose engine is gone; ``EngineUnresponsive`` when every
    one of them still has a process (looked at on this host only) that does not answer."""
    dead: list[str] = []
    unresponsive: list[str] = []
    for rank in lost:
        r = ranks[rank]
        state = local_state(r.host, r.pid)
        where = f"rank {rank} (engine {r.engine_id} on {r.host}, pid {r.pid}"
        seen = f"last seen {describe_rank(read_status(run_dir, rank))}"
        if state is None or state == GONE:  # another host: its pid is not ours to read
            dead.append(f"{where}; {seen})")
        elif state in FROZEN:
            unresponsive.append(
                f"{where}; its process is {state}, e.g. by SIGSTOP or a debugger; {seen})"
            )
        else:
            unresponsive.append(
                f"{where}; its process is {state} but missed the controller's heartbeats; {seen})"
            )
    parts = []
    if dead:
        parts.append(f"engine died: {', '.join(dead)}")
    if unresponsive:
        parts.append(f"engine unresponsive: {', '.join(unresponsive)}")
    which = "dead" if not unresponsive else "unresponsive" if not dead else "lost"
    message = (
        f"{'; '.join(parts)}; the process group is broken on every rank. "
        f"Recover with `%wb restart` (cluster.recover_sync()): it replaces only the {which} "
        "engine(s) and re-creates the process group."
    )
    cls = EngineUnresponsive if not dead else EngineDied
    return cls(message, ranks=lost)


def status_rows(ranks: list[RankAssignment], client: Any) -> list[dict[str, Any]]:
    """One row per rank: rank, engine id, host, pid, device, backend, state."""
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
