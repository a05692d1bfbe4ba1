"""The recorder: where every tracer appends events and every viewer reads them.

It also holds *where we are* (current step and phase), so tracers that fire deep inside
torch can tag their events without being told, and the in-flight collectives, so a hang
report can say which rank waits in which collective.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from workbench.trace.clock import Clock
from workbench.trace.events import Event, PhaseSpan, from_record, to_record

__all__ = ["Recorder"]

Subscriber = Callable[[Event], None]


class Recorder:
    """Append-only event log of one rank with a cursor API for cheap incremental pulls.

    A pull with ``since(cursor)`` acknowledges every event before ``cursor``: those are the
    client's now and are dropped here, so a recorder pulled as it goes (the stepper after
    every call, ``wb.traced`` after every cell) holds only what was not pulled yet, however
    long the run. Cursors count every event ever emitted, dropped ones included.
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
        self._events: list[Event] = []
        self._dropped = 0  # events acknowledged by a pull and let go (cursor of _events[0])
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
        return self._dropped + len(self._events)

    @property
    def events(self) -> list[Event]:
        """The events not yet acknowledged by a pull (all of them when nothing pulls)."""
        return list(self._events)

    def now(self) -> int:
        return self.clock.now()

    def emit(self, event: Event) -> None:
        with self._lock:
            self._events.append(event)
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
            drop = min(max(cursor - self._dropped, 0), len(self._events))
            if drop:
                del self._events[:drop]
                self._dropped += drop
            return self._events[max(cursor - self._dropped, 0) :], len(self)

    def records_since(self, cursor: int = 0) -> tuple[list[dict[str, Any]], int]:
        """Like ``since`` but as plain dicts: what engines send to the client."""
        events, new_cursor = self.since(cursor)
        return [to_record(e) for e in events], new_cursor

    def clear(self) -> None:
        with self._lock:
            self._dropped += len(self._events)  # cursors stay valid: they count on
            self._events.clear()
            self.in_flight.clear()

    def to_records(self) -> list[dict[str, Any]]:
        return [to_record(e) for e in self.events]

    @classmethod
    def from_records(cls, records: Iterable[dict[str, Any]], rank: int = 0) -> Recorder:
        recorder = cls(rank)
        recorder._events.extend(from_record(r) for r in records)
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
