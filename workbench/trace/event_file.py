"""Events on disk: one sqlite file per run, one typed table per event kind.

Chosen over Arrow/Parquet (``benchmarks/event_formats.py`` measures both): a Parquet file
cannot be read until it is closed (its footer), while a running notebook reads its events
at every zoom and export; sqlite is read while it is written, deletes a roll-back's steps in
place, answers "steps a to b" from an index, and ships with Python (no 50 MB wheel pinned
for seven branches). Each kind's table holds its dataclass fields as typed columns, so a
reader (pandas ``read_sql``, DuckDB's sqlite scanner, the ``sqlite3`` shell) needs no
workbench code.
"""

from __future__ import annotations

import heapq
import os
import sqlite3
from collections.abc import Iterable, Iterator
from dataclasses import fields
from operator import attrgetter
from pathlib import Path
from typing import Any

from workbench.trace.events import CommEvent, Event, MemorySample, Metric, PhaseSpan

__all__ = ["EventFile"]

_CLASSES: tuple[type[Any], ...] = (PhaseSpan, MemorySample, CommEvent, Metric)
_SQL_TYPE = {int: "INTEGER", float: "REAL", str: "TEXT", "int": "INTEGER", "float": "REAL"}


def _columns(cls: type[Any]) -> list[str]:
    return [f.name for f in fields(cls)]


class EventFile:
    """Append events, read them back by step range; ``seq`` keeps the arrival order."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)  # the user's events only
        os.close(fd)
        self._db = sqlite3.connect(self.path, check_same_thread=False)
        # A crash loses at most the last batch; no fsync per step (WAL, synchronous=NORMAL).
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._seq = 0
        self._getters: dict[type[Any], Any] = {}
        for cls in _CLASSES:
            names = _columns(cls)
            kinds = {f.name: f.type for f in fields(cls)}
            cols = ", ".join(f"{n} {_SQL_TYPE.get(kinds[n], 'TEXT')}" for n in names)
            self._db.execute(f"CREATE TABLE IF NOT EXISTS {cls.kind} (seq INTEGER, {cols})")
            self._db.execute(
                f"CREATE INDEX IF NOT EXISTS {cls.kind}_step ON {cls.kind} (step, rank)"
            )
            self._getters[cls] = attrgetter(*names)
            row = self._db.execute(f"SELECT MAX(seq) FROM {cls.kind}").fetchone()
            self._seq = max(self._seq, (row[0] or 0) + 1)
        self._db.commit()

    def __repr__(self) -> str:
        return f"<EventFile {str(self.path)!r}>"

    def write(self, events: Iterable[Event]) -> int:
        """Append ``events`` (one transaction); returns how many."""
        by_kind: dict[type[Any], list[tuple[Any, ...]]] = {}
        n = 0
        for event in events:
            cls = type(event)
            by_kind.setdefault(cls, []).append((self._seq, *self._getters[cls](event)))
            self._seq += 1
            n += 1
        with self._db:
            for cls, rows in by_kind.items():
                marks = ", ".join("?" * (len(rows[0])))
                self._db.executemany(f"INSERT INTO {cls.kind} VALUES ({marks})", rows)
        return n

    def read(
        self, first: int | None = None, last: int | None = None, ranks: Iterable[int] | None = None
    ) -> list[Event]:
        """Events of steps ``first`` to ``last`` (inclusive; None: open), in arrival order."""
        where, args = [], []
        if first is not None:
            where.append("step >= ?")
            args.append(first)
        if last is not None:
            where.append("step <= ?")
            args.append(last)
        if ranks is not None:
            wanted = sorted({int(r) for r in ranks})
            where.append(f"rank IN ({', '.join('?' * len(wanted))})")
            args.extend(wanted)
        clause = f" WHERE {' AND '.join(where)}" if where else ""
        streams = [self._kind(cls, clause, args) for cls in _CLASSES]
        return [event for _, event in heapq.merge(*streams, key=lambda p: p[0])]

    def _kind(self, cls: type[Any], clause: str, args: list[Any]) -> Iterator[tuple[int, Any]]:
        names = _columns(cls)
        query = f"SELECT seq, {', '.join(names)} FROM {cls.kind}{clause} ORDER BY seq"
        for seq, *values in self._db.execute(query, args):
            yield seq, cls(**dict(zip(names, values, strict=True)))

    def steps(self) -> list[int]:
        """The steps with events on file, ascending."""
        union = " UNION ".join(f"SELECT DISTINCT step FROM {c.kind}" for c in _CLASSES)
        return [row[0] for row in self._db.execute(f"SELECT step FROM ({union}) ORDER BY step")]

    def count(self) -> int:
        return sum(
            self._db.execute(f"SELECT COUNT(*) FROM {c.kind}").fetchone()[0] for c in _CLASSES
        )

    def drop_from(self, step: int) -> None:
        """A roll-back: the events of ``step`` and later are deleted."""
        with self._db:
            for cls in _CLASSES:
                self._db.execute(f"DELETE FROM {cls.kind} WHERE step >= ?", (step,))

    def close(self) -> None:
        self._db.close()
