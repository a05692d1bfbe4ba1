"""``StuckRanks``: the ranks a cell or call left blocked, and whether new work may go there.

A timeout, an interrupt or a peer's death can leave a rank busy: in Python code (an
interrupt ends that) or in a collective that cannot finish (only ``recover()`` frees it).
The dispatcher records each such rank with its unfinished request; those a timeout or an
interrupt gave up on refuse new work, and a survivor of a death is waited for a moment (it
fails out of its next collective). ``recover()`` reads them; a new process group or a stop
forgets them.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from workbench.cluster.dispatch.hang import describe_rank, read_status
from workbench.cluster.ranks import RankAssignment
from workbench.errors import ClusterError

__all__ = ["INTERRUPT_GRACE_S", "POLL_S", "StuckRanks"]

# After an interrupt, engines in Python code stop at once; one blocked in a collective
# does not (signals run between bytecodes) and is left for recover().
INTERRUPT_GRACE_S = 2.0
POLL_S = 0.02


class StuckRanks:
    """Ranks left blocked, each with its unfinished request (``held``), and those of them
    a timeout or an interrupt gave up on (``given_up``)."""

    def __init__(self) -> None:
        self.held: dict[int, Any] = {}
        self.given_up: set[int] = set()

    @property
    def ranks(self) -> list[int]:
        return sorted(self.held)

    def mark(self, targets: Sequence[RankAssignment], futures: Sequence[Any]) -> bool:
        """Hold every target whose request has not finished; True when any rank is held."""
        for r, f in zip(targets, futures, strict=True):
            if not f.ready():
                self.held[r.rank] = f
        return bool(self.held)

    def still_pending(self, grace_s: float = 0.0) -> list[int]:
        """Held ranks whose request is still pending, after waiting up to ``grace_s`` for
        them to come back (a survivor of a dead peer fails out of its collective a moment
        later; one waiting on a silent host never does): work sent to them would only queue
        behind that request."""
        deadline = time.monotonic() + grace_s
        while True:
            pending = sorted(r for r, f in self.held.items() if not f.ready())
            if not pending or time.monotonic() >= deadline:
                return pending
            time.sleep(0.05)

    def forget(self) -> None:
        """A new process group (or a stop): no rank is blocked any more."""
        self.held = {}
        self.given_up = set()

    def ensure_free(self, ranks: Sequence[int], run_dir: str | None) -> None:
        """Raise at once when a rank is still blocked by an earlier cell that timed out or
        was interrupted, or waits in a collective that cannot finish: new work would only
        queue behind it (and be dropped by the engine when that cell finally fails). A rank
        merely still busy after a peer died is waited for, as before: it fails out of its
        next collective and is free a moment later."""
        suspects = [r for r in sorted(set(ranks)) if r in self.held]
        if not suspects:
            return
        if any(r not in self.given_up for r in suspects):
            # a survivor of a peer's death fails out of its collective a moment later
            end = time.monotonic() + INTERRUPT_GRACE_S
            while time.monotonic() < end and not all(self.held[r].ready() for r in suspects):
                time.sleep(POLL_S)
        self.held = {r: f for r, f in self.held.items() if not f.ready()}
        self.given_up &= set(self.held)
        statuses = {r: read_status(run_dir, r) for r in suspects if r in self.held}
        blocked = [
            r
            for r, status in statuses.items()
            if r in self.given_up or (status is not None and status.get("in_flight"))
        ]
        if blocked:
            where = "; ".join(f"rank {r}: {describe_rank(statuses[r])}" for r in blocked)
            raise ClusterError(
                f"ranks {blocked} are still blocked by an earlier cell (it timed out, was "
                f"interrupted or lost a peer: {where}); free them with `%wb restart` "
                "(cluster.recover_sync()), which keeps their engines when it can"
            )
