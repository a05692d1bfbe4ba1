"""Export events of every rank as one Chrome Trace Event JSON, readable by Perfetto.

Layout: one process per rank (``pid = rank``); thread tracks for compute phases and for
communication; one counter track per memory category. Overlapping events never share a
track (async collectives overlap, e.g. two DDP buckets in flight): each goes to the first
lane of its kind that is free, so lanes read "comm", "comm 2", ...
A collective in which a rank waited for a late peer holds a child slice ``wait`` over
that part (``stragglers.collective_waits``); its args split ``wait_us`` from ``transfer_us``.

Timestamps are microseconds from the earliest event (``otherData.t0_ns`` keeps the
absolute origin); absolute nanosecond clocks would lose precision as JSON doubles.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from workbench.trace.events import CommEvent, Event, MemorySample, Metric, PhaseSpan
from workbench.trace.stragglers import collective_waits

__all__ = ["MEMORY_COUNTERS", "to_perfetto"]

# MemorySample field -> counter track name.
MEMORY_COUNTERS: dict[str, str] = {
    "params": "memory: params",
    "grads": "memory: grads",
    "optimizer": "memory: optimizer",
    "activations": "memory: activations",
    "other": "memory: other",
    "allocator": "memory: allocator",
    "frozen": "memory: frozen weights",
}

# Thread ids: lanes of a kind are base + 0, 1, 2 ...
_LANE_BASE = {"compute": 1, "comm": 1001}


def _us(t_ns: int, t0: int) -> float:
    return (t_ns - t0) / 1000.0


class _Lanes:
    """Greedy interval partitioning: first lane whose last event ended before ``start``."""

    def __init__(self) -> None:
        self.ends: list[int] = []

    def place(self, start: int, end: int) -> int:
        for i, lane_end in enumerate(self.ends):
            if lane_end <= start:
                self.ends[i] = end
                return i
        self.ends.append(end)
        return len(self.ends) - 1


def _event_time(e: Event) -> int:
    if isinstance(e, PhaseSpan | CommEvent):
        return e.start
    return e.t


def to_perfetto(events: Iterable[Event], path: str | os.PathLike[str] | None = None) -> dict:
    """Chrome Trace Event JSON for ``events`` of any number of ranks.

    Returns the dict; also writes it to ``path`` when given (atomically: a temporary file
    renamed into place). Open the file in https://ui.perfetto.dev or chrome://tracing.
    """
    items = sorted(events, key=lambda e: (e.rank, _event_time(e)))
    times = [_event_time(e) for e in items if _event_time(e) > 0]
    builder = _TraceBuilder(t0=min(times) if times else 0, waits=collective_waits(items))
    for e in items:
        builder.add(e)
    result = {
        "traceEvents": builder.metadata() + builder.trace,
        "displayTimeUnit": "ns",
        "otherData": {"t0_ns": builder.t0, "ranks": sorted(builder.ranks)},
    }
    if path is not None:
        _write_atomically(result, path)
    return result


class _TraceBuilder:
    """Trace events per rank, each on the first free lane of its kind; names for the lanes."""

    def __init__(self, t0: int, waits: dict[CommEvent, int] | None = None) -> None:
        self.t0 = t0
        # ns a rank waited inside a collective for its latest peer (stragglers.py)
        self.waits = waits or {}
        self.trace: list[dict[str, Any]] = []
        self.ranks: set[int] = set()
        self._lanes: dict[tuple[int, str], _Lanes] = defaultdict(_Lanes)
        self._thread_names: dict[tuple[int, int], str] = {}

    def add(self, e: Event) -> None:
        self.ranks.add(e.rank)
        if isinstance(e, PhaseSpan):
            self._span(e, e.phase, "phase", "compute", {"step": e.step})
        elif isinstance(e, CommEvent):
            args = {
                "bytes": e.bytes,
                "group_size": e.group_size,
                "source": e.source,
                "step": e.step,
                "phase": e.phase,
                "algbw_GBps": e.algbw / 1e9,
                "busbw_GBps": e.busbw / 1e9,
            }
            wait = self.waits.get(e, 0)
            if wait:
                args.update(wait_us=wait / 1000.0, transfer_us=(e.end - e.start - wait) / 1000.0)
            tid = self._span(e, e.op, f"comm,{e.source}", "comm", args)
            if wait:  # a child slice: the part of the collective spent waiting for a peer
                self.trace.append(
                    {
                        "name": "wait",
                        "cat": "wait",
                        "ph": "X",
                        "pid": e.rank,
                        "tid": tid,
                        "ts": _us(e.start, self.t0),
                        "dur": wait / 1000.0,
                        "args": {"op": e.op},
                    }
                )
        elif isinstance(e, MemorySample):
            for field, name in MEMORY_COUNTERS.items():
                self._counter(e.rank, e.t, name, "memory", {"bytes": getattr(e, field)})
        elif isinstance(e, Metric) and e.t > 0:
            self._counter(e.rank, e.t, e.name, "metric", {"value": e.value})

    def _span(
        self, e: PhaseSpan | CommEvent, name: str, cat: str, kind: str, args: dict[str, Any]
    ) -> int:
        tid = self._lane_tid(e.rank, kind, e.start, e.end)
        self.trace.append(
            {
                "name": name,
                "cat": cat,
                "ph": "X",
                "pid": e.rank,
                "tid": tid,
                "ts": _us(e.start, self.t0),
                "dur": (e.end - e.start) / 1000.0,
                "args": args,
            }
        )
        return tid

    def _counter(self, rank: int, t: int, name: str, cat: str, args: dict[str, Any]) -> None:
        self.trace.append(
            {"name": name, "cat": cat, "ph": "C", "pid": rank, "ts": _us(t, self.t0), "args": args}
        )

    def _lane_tid(self, rank: int, kind: str, start: int, end: int) -> int:
        index = self._lanes[(rank, kind)].place(start, end)
        tid = _LANE_BASE[kind] + index
        self._thread_names[(rank, tid)] = kind if index == 0 else f"{kind} {index + 1}"
        return tid

    def metadata(self) -> list[dict[str, Any]]:
        """Process names "rank N" and lane names, sorted by rank and lane."""
        meta: list[dict[str, Any]] = []
        for rank in sorted(self.ranks):
            meta += [
                {"name": "process_name", "ph": "M", "pid": rank, "args": {"name": f"rank {rank}"}},
                {
                    "name": "process_sort_index",
                    "ph": "M",
                    "pid": rank,
                    "args": {"sort_index": rank},
                },
            ]
        for (rank, tid), name in sorted(self._thread_names.items()):
            base = {"ph": "M", "pid": rank, "tid": tid}
            meta += [
                {"name": "thread_name", **base, "args": {"name": name}},
                {"name": "thread_sort_index", **base, "args": {"sort_index": tid}},
            ]
        return meta


def _write_atomically(result: dict[str, Any], path: str | os.PathLike[str]) -> None:
    target = os.fspath(path)
    fd, tmp = tempfile.mkstemp(prefix=".perfetto-", dir=os.path.dirname(target) or ".")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(result, f)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
