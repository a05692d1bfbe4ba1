"""The pieces of ``RankDispatch.wait_unless_a_rank_failed``: when one rank of a call fails
part-way, wait briefly for its peers, then name the failing ranks and those left waiting.

A rank that raises inside a collective leaves its peers waiting in that collective (a gloo
collective cannot be interrupted); ``fail_together`` on the engines drops the group so the
peers fail at once, and what comes back becomes one ``RankError``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from workbench.cluster.dispatch.results import format_remote
from workbench.cluster.ranks import RankAssignment
from workbench.errors import RankError

__all__ = [
    "DEATH_CHECK_S",
    "DEATH_NOTICE_S",
    "PEER_GRACE_S",
    "Seen",
    "death_notice_s",
    "failed_together",
    "failures_and_waiting",
    "wait_for_a_failure",
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
    try:
        future.get(0)
    except Exception as exc:
        return format_remote(exc)
    return "?"


def wait_for_a_failure(
    futures: Sequence[Any], timeout: float | None, any_dead: Callable[[], bool] = bool
) -> bool:
    """Wait until every request finished, ``timeout`` ran out or ``any_dead()`` says an
    engine is gone (False: ``collect`` takes over and reports it), or until ``PEER_GRACE_S``
    after the first failure with some still running (True). The death check matters for a
    silent host: its survivors never fail out by themselves (no reset reaches them), so
    waiting for them to fail first meant waiting for the process group's timeout."""
    deadline = None if timeout is None else time.monotonic() + timeout
    failed_at: float | None = None
    next_death_check = 0.0
    while True:
        pending = [f for f in futures if not f.ready()]
        now = time.monotonic()
        if not pending or (deadline is not None and now >= deadline):
            return False
        if now >= next_death_check:
            next_death_check = now + DEATH_CHECK_S
            if any_dead():
                return False
        if failed_at is None and any(_raised(f) for f in futures if f.ready()):
            failed_at = now
        if failed_at is not None and now - failed_at >= PEER_GRACE_S:
            return True
        pending[0].wait(0.02)


@dataclass
class Seen:
    """After a death, the ranks of a cell seen waiting in a collective, which they fail out
    of: from their status files (``hang.read_status``)."""

    ranks: set[int] = field(default_factory=set)
    sent: float = field(default_factory=time.time)  # when the cell was sent (its wait began)

    def look(self, index: int, status: dict[str, Any] | None) -> None:
        """Count rank ``index`` as seen when its status shows it in a collective, or shows
        that one of its collectives failed since the cell was sent. The second matters on
        the first fault after a start as on any: a survivor's collective fails the moment
        its peer's connection closes, and its status may lose that collective before the
        kernel has heard of the death; its reply then waits for its traceback (slow)."""
        if not status:
            return
        failed_at = status.get("failed_at")
        failed = isinstance(failed_at, int | float) and failed_at >= self.sent
        if status.get("in_flight") or failed:
            self.ranks.add(index)


def failures_and_waiting(
    targets: Sequence[RankAssignment], futures: Sequence[Any]
) -> tuple[dict[int, str], list[int]]:
    """Each failed rank's remote traceback, and the ranks still running."""
    failures: dict[int, str] = {}
    waiting: list[int] = []
    for target, future in zip(targets, futures, strict=True):
        if not future.ready():
            waiting.append(target.rank)
        elif _raised(future):
            failures[target.rank] = _remote_failure(future)
    return failures, waiting


def death_notice_s(failures: dict[int, str]) -> float:
    """ "Connection closed by peer" on a survivor is also what a killed engine looks like:
    the controller gets time to hear of a death (from the kernel's engine watch for a local
    engine, from the dead engine's nanny on another host) so that the error names it."""
    lost = any(m in f for f in failures.values() for m in _LOST_PEER)
    return DEATH_NOTICE_S if lost else 0.0


def failed_together(failures: dict[int, str], waiting: list[int]) -> RankError:
    """One error naming the failed ranks and, for each rank still waiting, what frees it."""
    failed = sorted(failures)
    for rank in waiting:
        failures[rank] = (
            f"rank {rank} still waits (in a collective) for rank(s) {failed}, which failed; "
            "session.recover() / `%wb restart` frees it and rolls back to the last checkpoint"
        )
    return RankError.from_failures(failures)
