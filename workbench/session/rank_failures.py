"""When a rank fails part-way through a session's call: wait briefly for its peers, tell a
dead engine from a failed rank, and name where each failing rank was.

A rank that raises inside a collective leaves its peers waiting in that collective (a gloo
collective cannot be interrupted); ``fail_together`` on the engines drops the group so the
peers fail at once, and this module turns what comes back into one ``RankError``.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from workbench.errors import CollectiveTimeout, EngineDied, HostLost, RankError
from workbench.session.run_state import RankStatus

if TYPE_CHECKING:
    from workbench.cluster.cluster import Cluster

__all__ = [
    "DEATH_NOTICE_S",
    "PEER_GRACE_S",
    "closed_group",
    "error_fields",
    "rank_failure",
    "wait_unless_a_rank_failed",
]

# After one rank failed, how long the ranks still running get to finish (a peer freed by the
# failed rank's teardown fails within milliseconds) before they are reported as waiting.
PEER_GRACE_S = 3.0
# A rank that lost its connection to a peer may have lost it to a dead engine: how long the
# controller gets to report that death (ms on one host; the nanny's word travels further).
DEATH_NOTICE_S = 10.0
# How often the wait looks for a dead engine among the ranks (the controller's bookkeeping).
DEATH_CHECK_S = 0.25
_LOST_PEER = ("Connection closed by peer", "Connection reset by peer")


def _raised(future: Any) -> bool:
    """A finished remote call that raised (a dead engine is collect()'s business)."""
    try:
        future.get(0)
    except Exception as exc:
        return getattr(exc, "ename", "") != "EngineError"
    return False


def _remote_failure(future: Any) -> str:
    from workbench.cluster.results import format_remote

    try:
        future.get(0)
    except Exception as exc:
        return format_remote(exc)
    return "?"


def error_fields(exc: Exception) -> dict[str, Any]:
    if isinstance(exc, HostLost):  # re-raised with more words: still naming its host
        return {"ranks": exc.ranks, "host": exc.host}
    if isinstance(exc, EngineDied):
        return {"ranks": exc.ranks}
    if isinstance(exc, CollectiveTimeout):
        return {"report": exc.report}
    return {}


def closed_group(exc: RankError) -> bool:
    """Whether a rank's failure closed the process group (``fail_together`` raises these
    two on every rank); a plain error on every rank leaves the group as it was."""
    return (
        any("RankFailed" in text or "PeerFailed" in text for text in (exc.failures or {}).values())
        or "RankFailed" in str(exc)
        or "PeerFailed" in str(exc)
    )


def wait_unless_a_rank_failed(
    cluster: Cluster, targets: list[Any], futures: list[Any], timeout: float | None
) -> None:
    """Return when every rank finished, or raise ``RankError`` soon after one rank
    failed while others still run: those wait in a collective for the failed rank
    (a gloo collective cannot be interrupted), so they are marked stuck for
    ``recover()`` instead of being waited for until the process-group timeout. The
    failed rank has written its error to the store and dropped its group
    (``fail_together``); a peer that this frees finishes within the grace and names it.
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    failed_at: float | None = None
    next_death_check = 0.0
    while True:
        pending = [f for f in futures if not f.ready()]
        now = time.monotonic()
        if not pending or (deadline is not None and now >= deadline):
            return  # collect() gathers the results or reports the timeout
        if now >= next_death_check:  # a silent host's survivors never fail out by themselves
            next_death_check = now + DEATH_CHECK_S
            if any(
                cluster._dead_engine(f, t.engine_id) for t, f in zip(targets, futures, strict=True)
            ):
                return  # collect() reports EngineDied (or HostLost) and marks them stuck
        if failed_at is None and any(_raised(f) for f in futures if f.ready()):
            failed_at = now
        if failed_at is not None and now - failed_at >= PEER_GRACE_S:
            break
        pending[0].wait(0.02)
    failures: dict[int, str] = {}
    waiting: list[int] = []
    for target, future in zip(targets, futures, strict=True):
        if not future.ready():
            waiting.append(target.rank)
        elif _raised(future):
            failures[target.rank] = _remote_failure(future)
    if not failures:  # an engine died meanwhile: collect() reports it
        return
    # "connection closed by peer" on a survivor is also what a killed engine looks like:
    # give the controller time to hear of a death (from the kernel's engine watch for a
    # local engine, from the dead engine's nanny on another host) so that the error names
    # the dead engine
    lost = any(m in f for f in failures.values() for m in _LOST_PEER)
    notice = time.monotonic() + (DEATH_NOTICE_S if lost else 0.0)
    while time.monotonic() < notice:
        if any(cluster._dead_engine(f, t.engine_id) for t, f in zip(targets, futures, strict=True)):
            return  # collect() reports EngineDied
        time.sleep(0.05)
    cluster._mark_stuck(targets, futures)
    failed = sorted(failures)
    for rank in waiting:
        failures[rank] = (
            f"rank {rank} still waits (in a collective) for rank(s) {failed}, which failed; "
            "session.recover() / `%wb restart` frees it and rolls back to the last checkpoint"
        )
    raise RankError.from_failures(failures)


def rank_failure(exc: RankError, statuses: dict[int, RankStatus], cluster: Cluster) -> RankError:
    """The ranks' exceptions, headed by where each failing rank was (host, step, phase)."""
    heads = []
    for rank in sorted(exc.failures):
        status = statuses.get(rank, RankStatus(rank=rank))
        host = cluster.ranks[rank].host if rank < cluster.world_size else "?"
        what = "stopped (a peer failed)" if "PeerFailed" in exc.failures[rank] else "failed"
        heads.append(
            f"rank {rank} on {host} {what} in phase {status.next_phase!r} of step {status.step}"
        )
    error = RankError.from_failures(exc.failures)
    error.args = ("; ".join(heads) + "\n" + str(error.args[0]),)
    return error
