"""Client side of the out-of-band channel: the hang report of a timed-out cell or step,
and the message for engines that died or stopped answering.

Reads the per-rank status files the engines' status threads write (see ``engine/hang.py``), so it
works while the engines are blocked and cannot answer ipyparallel. The files are local to
each engine's host: ranks on other hosts show as "no status" unless ``run_dir`` is shared.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

from workbench.cluster.hosts.host_loss import host_lost, mpi_job_ended
from workbench.cluster.hosts.slurm_nodes import host_answers
from workbench.cluster.processes import FROZEN, GONE, local_state
from workbench.cluster.ranks import RankAssignment
from workbench.engine.hang import status_path
from workbench.errors import ClusterError, EngineDied, EngineUnresponsive

__all__ = [
    "after_interrupt",
    "describe_rank",
    "hang_report",
    "lost_engines_error",
    "read_status",
    "stopped_while_waiting",
]


def read_status(run_dir: str | os.PathLike[str] | None, rank: int) -> dict[str, Any] | None:
    """The last status rank ``rank`` wrote, or None (no file, other host, unreadable).

    Anything but a JSON object whose ``in_flight`` (if any) is a list of objects counts as
    unreadable: the report must come out whatever a damaged file holds."""
    if run_dir is None:
        return None
    try:
        status = json.loads(status_path(run_dir, rank).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(status, dict):
        return None
    flights = status.get("in_flight") or []
    if not isinstance(flights, list) or not all(isinstance(f, dict) for f in flights):
        return None
    return status


def _no_status(run_dir: str | os.PathLike[str] | None, rank: int) -> str:
    """Why a rank has no status: a file that is there but unreadable, or none at all."""
    if run_dir is not None and status_path(run_dir, rank).exists():
        return "status file unreadable"
    return "no status (engine on another host?)"


def _where(status: dict[str, Any]) -> str:
    phase = status.get("phase") or "-"
    return f"step {status.get('step', 0)}, phase {phase}"


def _flight_text(flight: dict[str, Any]) -> str:
    return (
        f"{flight.get('op', '?')} ({flight.get('bytes', 0)} bytes, group of "
        f"{flight.get('group_size', '?')}, issued by {flight.get('source', '?')}) at "
        f"step {flight.get('step', 0)}, phase {flight.get('phase') or '-'}"
    )


def describe_rank(status: dict[str, Any] | None) -> str:
    """What a rank was doing, for messages about a dead or stuck engine."""
    if status is None:
        return "no status recorded"
    flights = status.get("in_flight") or []
    if flights:
        return f"waiting in {_flight_text(flights[0])}"
    return f"at {_where(status)}, no collective in flight"


def hang_report(
    run_dir: str | os.PathLike[str] | None,
    pending: list[int],
    finished: list[int],
    timeout: float | None,
) -> tuple[str, dict[str, Any]]:
    """The message and the structured report of a timeout on ``pending`` ranks.

    The report always has ``pending`` and ``finished``; when a rank waits in a collective
    also ``waiting`` (rank -> its in-flight record: op, bytes, group_size, source, step,
    phase), ``never_entered`` (ranks not waiting in it) and ``status`` (every rank's file).
    """
    statuses = {r: read_status(run_dir, r) for r in sorted([*pending, *finished])}
    waiting = {
        r: (statuses[r] or {}).get("in_flight", [])[0]
        for r in pending
        if (statuses[r] or {}).get("in_flight")
    }
    ops = sorted({f.get("op", "?") for f in waiting.values()})
    never = [r for r in sorted(statuses) if r not in waiting]
    lines = [f"not finished within timeout={timeout}s on ranks {pending} (finished: {finished})"]
    for rank in sorted(statuses):
        status = statuses[rank]
        if rank in waiting:
            lines.append(f"  rank {rank}: waits in {_flight_text(waiting[rank])}")
        elif rank in finished:
            entered = f", never entered {' / '.join(ops)}" if ops else ""
            lines.append(f"  rank {rank}: finished the cell{entered}")
        elif status is None:
            lines.append(f"  rank {rank}: busy, {_no_status(run_dir, rank)}")
        else:
            lines.append(
                f"  rank {rank}: busy at {_where(status)}, not in a collective"
                + (f" (never entered {' / '.join(ops)})" if ops else "")
            )
    if waiting and never:  # (all waiting: in different collectives; the autopsy says which)
        lines.append(
            f"ranks {sorted(waiting)} wait for ranks {never} that never entered the "
            "collective; the process group is stuck."
        )
    lines.append(
        "Recover with `%wb restart` (cluster.recover()): it frees the waiting ranks "
        "(or replaces their engines) and re-creates the process group on a fresh port."
    )
    report: dict[str, Any] = {"pending": list(pending), "finished": list(finished)}
    if waiting:  # a hang, not just a slow cell: who waits where, who never came
        report.update(waiting=waiting, never_entered=never, status=statuses)
    return "\n".join(lines), report


def after_interrupt(freed: list[int], blocked: list[int]) -> str:
    """The hang message's last lines: which ranks the interrupt freed, which stay blocked."""
    message = ""
    if freed:
        message += f"\nranks {freed} were interrupted and are free for the next cell."
    if blocked:
        message += (
            f"\nranks {blocked} are still blocked (an interrupt does not end a "
            "collective) and cannot run another cell until `%wb restart` "
            "(cluster.recover_sync()) frees them."
        )
    return message


def lost_engines_error(
    ranks: Sequence[RankAssignment],
    lost: list[int],
    run_dir: str | None,
    client: Any = None,
    launcher: str = "",
) -> EngineDied:
    """``EngineDied`` for ranks whose engine is gone; ``EngineUnresponsive`` when every
    one of them still has a process (looked at on this host only) that does not answer;
    ``HostLost`` when their host is gone whole (``host_loss.py``; needs ``client``; under
    ``launcher="slurm"`` a node Slurm has out of service is gone too: ``slurm_nodes.py``)."""
    if launcher == "mpi":  # one rank's death ends mpiexec's whole job: no host is lost
        return mpi_job_ended(lost)
    gone_host = host_lost(ranks, lost, client, host_answers if launcher == "slurm" else None)
    if gone_host is not None:
        return gone_host
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


def stopped_while_waiting(ranks: list[int]) -> ClusterError:
    """What a call waiting for ``ranks`` gets when the cluster is stopped under it: its
    replies can never come (the engines, the client and the cell sockets are gone)."""
    return ClusterError(
        f"the cluster was stopped while ranks {ranks} were running this work (stop_sync() "
        "or `%wb stop` from elsewhere); start it again with `%wb start` (cluster.start_sync())"
    )
