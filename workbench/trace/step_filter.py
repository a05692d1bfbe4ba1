"""``StepFilter``: the recording policy applied on the engine, before anything is sent.

A step the policy does not keep (``policy.RecordPolicy``) would reach the kernel as a few
hundred event records, be decoded there, summarised and thrown away. Its recorder hands
such a step to this filter instead, which folds it into one summary row per (rank, step)
(``StepSummaries``' columns) and sends that: the kernel neither decodes nor allocates the
detail. Which steps it takes is the recorder's call (``Recorder.pull`` / ``emit``):

- at a pull, the completed steps before the kernel's ``detail_from`` (a stepper run knows
  which of its steps will have left the kernel's recent window when it ends: those before
  its target minus the window; its last ``recent`` steps keep their detail);
- as events arrive, the steps that left the policy's recent window counted from the newest
  step (a ``wb.traced`` loop of 100k steps in one cell, pulled only when the cell ends);
- past ``cap`` held events, the oldest held events whatever their step (``overflow``
  counts them; their summaries are still right).

Steps taken at a pull keep their detail here for the last ``recent`` of them
(``recent_records``): a run stopped early (Pause) fetches its window from there.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from workbench.trace.events import Event, Metric, to_record
from workbench.trace.policy import RecordPolicy
from workbench.trace.summary import StepSummaries

__all__ = ["DEFAULT_CAP", "StepFilter"]

# Detail events one recorder holds at most between pulls: a long loop in one cell, or
# record="all", stops here (about 20 MB of event objects) and counts what it let go.
DEFAULT_CAP = 100_000


class StepFilter:
    """Summary rows for the steps a recorder does not send in detail (see module doc)."""

    def __init__(self, policy: RecordPolicy, *, cap: int = DEFAULT_CAP) -> None:
        self.policy = policy
        self.cap = cap
        self.overflow = 0  # detail events let go because the recorder held ``cap``
        self._table = StepSummaries()  # rows not sent yet
        self._sent: list[dict[str, Any]] = []  # rows of the last pull, until acknowledged
        self._sent_at = 0  # the cursor that pull returned
        self._recent: OrderedDict[int, list[Event]] = OrderedDict()  # step -> its detail

    def __repr__(self) -> str:
        return (
            f"<StepFilter {self.policy.describe()!r} unsent={self._table.steps} "
            f"overflow={self.overflow}>"
        )

    def change(self, policy: RecordPolicy, *, cap: int = DEFAULT_CAP) -> None:
        """Apply ``policy`` and ``cap`` from now on (rows not sent yet stay)."""
        self.policy = policy
        self.cap = cap

    @property
    def window(self) -> int:
        """Steps the kernel keeps in detail behind the newest one (at least that one)."""
        return max(self.policy.recent, 1)

    def keeps(self, event: Event) -> bool:
        """Whether ``event`` travels in detail whatever its age: a step the policy
        selects, or a metric other than the loss (few, and the kernel keeps them all)."""
        if isinstance(event, Metric) and event.name != "loss":
            return True
        return self.policy.selected(event.step)

    def absorb(self, events: list[Event], *, recent: bool = False) -> None:
        """Summarise ``events`` (sent as rows from now on); with ``recent``, also keep
        their detail among the last ``recent`` steps so taken."""
        self._table.add(events)
        if not recent or self.policy.recent == 0:
            return
        held = self._recent
        for event in events:
            found = held.get(event.step)
            if found is None:
                found = held[event.step] = []
            found.append(event)
        while len(held) > self.policy.recent:
            held.popitem(last=False)

    def forget_from(self, step: int) -> None:
        """A roll-back: the detail kept of steps from ``step`` on is of a run undone."""
        for stale in [s for s in self._recent if s >= step]:
            del self._recent[stale]

    def count_overflow(self, events: list[Event]) -> None:
        """``events`` were let go at the cap: summarised, counted, their detail gone."""
        self.overflow += len(events)
        self._table.add(events)

    def rows(self, cursor: int, new_cursor: int) -> list[dict[str, Any]]:
        """The rows to send with a pull from ``cursor`` that returns ``new_cursor``: those
        not sent yet, and those of the last pull again unless ``cursor`` acknowledges it."""
        if cursor >= self._sent_at:
            self._sent = []
        if self._table.steps:
            self._sent.extend(self._table.export_rows())
            self._table = StepSummaries()
        self._sent_at = new_cursor
        return list(self._sent)

    def recent_records(self, first: int) -> list[dict[str, Any]]:
        """The detail of the steps from ``first`` on that a pull sent as rows (the last
        ``recent`` of them), as records."""
        return [to_record(e) for step, evs in self._recent.items() if step >= first for e in evs]
