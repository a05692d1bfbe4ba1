"""Kernel side of ``wb.traced``: pull every rank's trace events by cursor, keep them in an
``EventStore`` (summaries of every step, detail as the recording policy says: ``record=`` of
``wb.traced``, ``%wb run --trace --record``), export them to Perfetto. Plain object; figures
are drawn from ``events`` by plots/."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from workbench.cluster.cluster import Cluster
from workbench.engine import traced
from workbench.trace import Event, from_record, to_perfetto
from workbench.trace.policy import RecordPolicy
from workbench.trace.store import EventStore

__all__ = ["TraceLog"]


class TraceLog:
    """The events of ``wb.traced`` blocks and traced cells on every rank of ``cluster``."""

    def __init__(self, cluster: Cluster, *, timeout: float | None = 60.0) -> None:
        self.cluster = cluster
        self.timeout = timeout
        self.cells = False  # %wb trace on: every %%wb cell is one traced span
        self._cursors: dict[int, int] = {}
        self._store = EventStore()
        self._overflow: dict[int, int] = {}

    def __repr__(self) -> str:
        return f"<TraceLog ranks={self.cluster.world_size} events={len(self._store)}>"

    @property
    def events(self) -> list[Event]:
        """The events kept in detail (the recording policy's steps), oldest first."""
        return self._store.events()

    @property
    def store(self) -> EventStore:
        return self._store

    @property
    def overflow(self) -> dict[int, int]:
        """Per rank, detail events its recorder let go at its cap (one long cell of a very
        long loop, pulled only at its end); their steps are still summarised."""
        return dict(self._overflow)

    def set_policy(self, policy: RecordPolicy) -> None:
        """Which steps of what follows keep full detail (``%wb run --trace --record``);
        the engines apply it too, so what they do not keep leaves them as summary rows."""
        self._store.set_policy(policy)
        self.cluster.run(traced.set_trace_policy, asdict(policy), timeout=self.timeout)

    def pull(self) -> list[Event]:
        """Fetch what every rank recorded since the last pull; returns the new events."""
        ranks = list(range(self.cluster.world_size))
        new: list[Event] = []
        for rank in ranks:
            result = self.cluster.run(
                traced.pull_trace,
                self._cursors.get(rank, 0),
                ranks=[rank],
                timeout=self.timeout,
            )[0]
            self._cursors[rank] = int(result["cursor"])
            if result.get("policy") is not None:  # wb.traced(record=...) on that rank
                self._store.set_policy(RecordPolicy(**result["policy"]))
            new.extend(from_record(r) for r in result["records"])
            self._store.add_rows(result.get("rows") or [])
            self._overflow[rank] = int(result.get("overflow") or 0)
        self._store.add(new)
        return new

    def begin_cell(self, label: str = "cell") -> None:
        self.cluster.run(traced.begin_cell, label, timeout=self.timeout)

    def end_cell(self) -> list[Event]:
        self.cluster.run(traced.end_cell, timeout=self.timeout)
        return self.pull()

    def export(self, path: str | Path) -> Path:
        """Write the pulled events as a Perfetto / Chrome trace JSON file."""
        self.pull()
        out = Path(path)
        to_perfetto(self._store.events(), out)
        return out
