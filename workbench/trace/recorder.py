"""The recorder: where every tracer appends events and every viewer reads them.

It also holds *where we are* (current step and phase), so tracers that fire deep inside
torch can tag their events without being told, and the in-flight collectives, so a hang
report can say which rank waits in which collective.
"""

from __future__ import annotations

import bisect
import threading
import time
from array import array
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from workbench.trace.clock import Clock
from workbench.trace.events import Event, PhaseSpan, from_record, to_record
from workbench.trace.policy import RecordPolicy
from workbench.trace.step_filter import DEFAULT_CAP, StepFilter

__all__ = ["Recorder"]

Subscriber = Callable[[Event], None]


class Recorder:
    """Append-only event log of one rank with a cursor API for cheap incremental pulls.

    A pull with ``since(cursor)`` acknowledges every event before ``cursor``: those are the
    client's now and are dropped here, so a recorder pulled as it goes (the stepper after
    every call, ``wb.traced`` after every cell) holds only what was not pulled yet, however
    long the run. Cursors count every event ever emitted, dropped ones included.

    With a recording policy (``set_policy``), the steps it does not keep leave as summary
    rows instead of events (``pull``; ``step_filter.StepFilter``), and what it holds between
    pulls is bounded (the policy's recent window, a cap).
    """

    def __init__(self, rank: int = 0, *, clock: Clock | None = None) -> None:
        self.rank = rank
        self.clock = clock or Clock()
        self.step = 0
        self.phase = ""
        self.in_flight: dict[int, dict[str, Any]] = {}
        # When (time.time()) a collective of this rank last failed, 0.0 if none: the
        # status file shows it so the kernel knows a rank whose collective just failed
        # (a peer died) is on its way out of the cell, not busy elsewhere.
        self.failed_at = 0.0
        self._events: list[Event] = []  # held: not acknowledged by a pull yet
        self._seqs: array[int] = array("q")  # the cursor position of each held event
        self._emitted = 0  # every event ever emitted: the next cursor
        # Held events before this index were looked at by the filter (or sent): only those
        # after it may still become summary rows.
        self._settled = 0
        self._newest = -1  # the newest step an event carried
        self._sent_to = 0  # the cursor the last pull returned: events from it on never left
        self._filter: StepFilter | None = None
        self._subscribers: list[Subscriber] = []
        self._lock = threading.Lock()
        self._next_flight = 0

    def __repr__(self) -> str:
        return (
            f"Recorder(rank={self.rank}, events={len(self._events)}, "
            f"step={self.step}, phase={self.phase!r})"
        )

    def __len__(self) -> int:
        """Events emitted so far (pulled and dropped ones included): the next cursor."""
        return self._emitted

    @property
    def events(self) -> list[Event]:
        """The events not yet acknowledged by a pull (all of them when nothing pulls)."""
        return list(self._events)

    def now(self) -> int:
        return self.clock.now()

    def emit(self, event: Event) -> None:
        with self._lock:
            self._events.append(event)
            self._seqs.append(self._emitted)
            self._emitted += 1
            found = self._filter
            if found is not None and (event.step > self._newest or len(self._events) > found.cap):
                self._newest = max(self._newest, event.step)
                # steps that left the kernel's window behind the newest: rows from here
                self._settle(self._newest - found.window + 1, recent=False)
                if len(self._events) > found.cap:
                    self._overflow(found)
            subscribers = list(self._subscribers)
        for callback in subscribers:
            callback(event)

    def extend(self, events: Iterable[Event]) -> None:
        for event in events:
            self.emit(event)

    def subscribe(self, callback: Subscriber) -> Callable[[], None]:
        """Call ``callback(event)`` for each new event; returns an unsubscribe function."""
        with self._lock:
            self._subscribers.append(callback)

        def unsubscribe() -> None:
            with self._lock:
                if callback in self._subscribers:
                    self._subscribers.remove(callback)

        return unsubscribe

    def since(self, cursor: int = 0) -> tuple[list[Event], int]:
        """Events appended after ``cursor`` and the new cursor (pass it back next time);
        the events before ``cursor`` are dropped (the caller has them)."""
        with self._lock:
            self._acknowledge(cursor)
            self._settled = len(self._events)
            self._sent_to = self._emitted
            return list(self._events), self._emitted

    def records_since(self, cursor: int = 0) -> tuple[list[dict[str, Any]], int]:
        """Like ``since`` but as plain dicts: what engines send to the client."""
        events, new_cursor = self.since(cursor)
        return [to_record(e) for e in events], new_cursor

    def set_policy(self, policy: RecordPolicy, *, cap: int = DEFAULT_CAP) -> None:
        """Send the steps ``policy`` does not keep as summary rows (``pull``), and hold at
        most ``cap`` events between pulls (the oldest past it are summarised, counted in
        ``overflow``). Rows not sent yet under the previous policy are kept."""
        with self._lock:
            if self._filter is None:
                self._filter = StepFilter(policy, cap=cap)
            else:
                self._filter.change(policy, cap=cap)

    @property
    def overflow(self) -> int:
        """Detail events let go because the recorder held its cap (0 without a policy)."""
        return 0 if self._filter is None else self._filter.overflow

    def pull(self, cursor: int = 0, *, detail_from: int = 0) -> dict[str, Any]:
        """What a kernel's pull from ``cursor`` takes: ``records`` (events in detail, as
        plain dicts), ``rows`` (summary rows of steps sent without their detail),
        ``cursor`` (pass it back next time: it acknowledges both) and ``overflow``.

        Completed steps before ``detail_from`` that the policy does not keep are sent as
        rows; the detail of the last ``recent`` of them stays here (``recent_records``)."""
        with self._lock:
            self._acknowledge(cursor)
            rows: list[dict[str, Any]] = []
            found = self._filter
            if found is not None:
                self._settle(min(detail_from, self.step), recent=True)
                rows = found.rows(cursor, self._emitted)
            events = list(self._events)
            self._settled = len(events)
            self._sent_to = new_cursor = self._emitted
        return {
            "records": [to_record(e) for e in events],
            "rows": rows,
            "cursor": new_cursor,
            "overflow": self.overflow,
        }

    def recent_records(self, first: int) -> list[dict[str, Any]]:
        """Detail of steps from ``first`` on that a pull sent as rows (the policy's last
        ``recent`` of them): a run stopped before its target fills its window from here."""
        with self._lock:
            return [] if self._filter is None else self._filter.recent_records(first)

    def rewind(self, step: int) -> None:
        """A roll-back: steps from ``step`` on run again, so the detail kept of their
        first run (``recent_records``) is stale."""
        with self._lock:
            self._newest = min(self._newest, step - 1)
            if self._filter is not None:
                self._filter.forget_from(step)

    def _acknowledge(self, cursor: int) -> None:
        """Let go of the held events before ``cursor`` (the caller has them)."""
        drop = bisect.bisect_left(self._seqs, cursor)
        if drop:
            del self._events[:drop]
            del self._seqs[:drop]
            self._settled = max(self._settled - drop, 0)

    def _settle(self, below: int, *, recent: bool) -> None:
        """Held events of steps before ``below`` that were never sent and the policy does
        not keep become summary rows. Events arrive in step order: the scan stops at the
        first newer one (a straggler of an old step waits for the next scan)."""
        found = self._filter
        events, seqs = self._events, self._seqs
        start = end = self._settled
        if found is None or end >= len(events) or events[end].step >= below:
            return
        kept: list[Event] = []
        kept_seqs: array[int] = array("q")
        gone: list[Event] = []
        while end < len(events) and events[end].step < below:
            event = events[end]
            if found.keeps(event):
                kept.append(event)
                kept_seqs.append(seqs[end])
            else:
                gone.append(event)
            end += 1
        if gone:
            events[start:end] = kept
            seqs[start:end] = kept_seqs
            found.absorb(gone, recent=recent)
        self._settled = start + len(kept)

    def _overflow(self, found: StepFilter) -> None:
        """Past the cap: the oldest tenth of the events never sent is summarised and let
        go (counted), whatever the policy says of them."""
        first = max(bisect.bisect_left(self._seqs, self._sent_to), 0)
        last = first + max(found.cap // 10, 1)
        found.count_overflow(self._events[first:last])
        del self._events[first:last]
        del self._seqs[first:last]
        if self._settled > first:
            self._settled = max(first, self._settled - (last - first))

    def clear(self) -> None:
        with self._lock:
            self._events.clear()  # cursors stay valid: they count on
            del self._seqs[:]
            self._settled = 0
            self.in_flight.clear()

    def to_records(self) -> list[dict[str, Any]]:
        return [to_record(e) for e in self.events]

    @classmethod
    def from_records(cls, records: Iterable[dict[str, Any]], rank: int = 0) -> Recorder:
        recorder = cls(rank)
        recorder.extend(from_record(r) for r in records)
        return recorder

    @contextmanager
    def phase_span(self, phase: str, step: int | None = None) -> Iterator[None]:
        """Mark a compute phase: sets the current phase and emits a ``PhaseSpan`` at exit."""
        if step is not None:
            self.step = step
        previous = self.phase
        self.phase = phase
        start = self.now()
        try:
            yield
        finally:
            self.emit(
                PhaseSpan(rank=self.rank, step=self.step, phase=phase, start=start, end=self.now())
            )
            self.phase = previous

    def begin_flight(self, **info: Any) -> int:
        """Register a collective that has been issued but not completed; returns its token."""
        with self._lock:
            token = self._next_flight
            self._next_flight += 1
            self.in_flight[token] = {"step": self.step, "phase": self.phase, **info}
        return token

    def end_flight(self, token: int) -> None:
        with self._lock:
            self.in_flight.pop(token, None)

    def fail_flight(self, token: int) -> None:
        """End a collective that failed (its peer died, its group was dropped)."""
        with self._lock:
            self.failed_at = time.time()  # before it leaves in_flight: never shows neither
            self.in_flight.pop(token, None)

    def snapshot(self) -> dict[str, Any]:
        """Where this rank is and what it waits for, as plain data (read by the engine's
        out-of-band status thread while the main thread may be blocked in a collective)."""
        with self._lock:
            flights = [dict(info) for _, info in sorted(self.in_flight.items())]
        return {"rank": self.rank, "step": self.step, "phase": self.phase, "in_flight": flights}
