"""Export events of every rank as one Chrome Trace Event JSON, readable by Perfetto.

Layout: one process per rank (``pid = rank``); thread tracks for compute phases and for
communication; one counter track per memory category. Overlapping events never share a
track (async collectives overlap, e.g. two DDP buckets in flight): each goes to the first
lane of its kind that is free, so lanes read "comm", "comm 2", ...

Timestamps are microseconds from the earliest event (``otherData.t0_ns`` keeps the
absolute origin); absolute nanosecond clocks would lose precision as JSON doubles.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from workbench.trace.events import CommEvent, Event, MemorySample, Metric, PhaseSpan

__all__ = ["MEMORY_COUNTERS", "to_perfetto"]

# MemorySample field -> counter track name.
MEMORY_COUNTERS: dict[str, str] = {
    "params": "memory: params",
    "grads": "memory: grads",
    "optimizer": "memory: optimizer",
    "activations": "memory: activations",
    "other": "memory: other",
    "allocator": "memory: allocator",
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

    Returns the dict; also writes it to ``path`` when given. Open the file in
    https://ui.perfetto.dev or chrome://tracing.
    """
    items = sorted(events, key=lambda e: (e.rank, _event_time(e)))
    times = [_event_time(e) for e in items if _event_time(e) > 0]
    t0 = min(times) if times else 0
    trace: list[dict[str, Any]] = []
    lanes: dict[tuple[int, str], _Lanes] = defaultdict(_Lanes)
    used_tids: dict[tuple[int, int], str] = {}
    ranks: set[int] = set()

    def lane_tid(rank: int, kind: str, start: int, end: int) -> int:
        index = lanes[(rank, kind)].place(start, end)
        tid = _LANE_BASE[kind] + index
        used_tids[(rank, tid)] = kind if index == 0 else f"{kind} {index + 1}"
        return tid

    for e in items:
        ranks.add(e.rank)
        if isinstance(e, PhaseSpan):
            trace.append(
                {
                    "name": e.phase,
                    "cat": "phase",
                    "ph": "X",
                    "pid": e.rank,
                    "tid": lane_tid(e.rank, "compute", e.start, e.end),
                    "ts": _us(e.start, t0),
                    "dur": (e.end - e.start) / 1000.0,
                    "args": {"step": e.step},
                }
            )
        elif isinstance(e, CommEvent):
            trace.append(
                {
                    "name": e.op,
                    "cat": f"comm,{e.source}",
                    "ph": "X",
                    "pid": e.rank,
                    "tid": lane_tid(e.rank, "comm", e.start, e.end),
                    "ts": _us(e.start, t0),
                    "dur": (e.end - e.start) / 1000.0,
                    "args": {
                        "bytes": e.bytes,
                        "group_size": e.group_size,
                        "source": e.source,
                        "step": e.step,
                        "phase": e.phase,
                        "algbw_GBps": e.algbw / 1e9,
                        "busbw_GBps": e.busbw / 1e9,
                    },
                }
            )
        elif isinstance(e, MemorySample):
            for field, name in MEMORY_COUNTERS.items():
                trace.append(
                    {
                        "name": name,
                        "cat": "memory",
                        "ph": "C",
                        "pid": e.rank,
                        "ts": _us(e.t, t0),
                        "args": {"bytes": getattr(e, field)},
                    }
                )
        elif isinstance(e, Metric) and e.t > 0:
            trace.append(
                {
                    "name": e.name,
                    "cat": "metric",
                    "ph": "C",
                    "pid": e.rank,
                    "ts": _us(e.t, t0),
                    "args": {"value": e.value},
                }
            )

    meta: list[dict[str, Any]] = []
    for rank in sorted(ranks):
        meta.append(
            {"name": "process_name", "ph": "M", "pid": rank, "args": {"name": f"rank {rank}"}}
        )
        meta.append(
            {"name": "process_sort_index", "ph": "M", "pid": rank, "args": {"sort_index": rank}}
        )
    for (rank, tid), name in sorted(used_tids.items()):
        meta.append(
            {"name": "thread_name", "ph": "M", "pid": rank, "tid": tid, "args": {"name": name}}
        )
        meta.append(
            {
                "name": "thread_sort_index",
                "ph": "M",
                "pid": rank,
                "tid": tid,
                "args": {"sort_index": tid},
            }
        )
    result = {
        "traceEvents": meta + trace,
        "displayTimeUnit": "ns",
        "otherData": {"t0_ns": t0, "ranks": sorted(ranks)},
    }
    if path is not None:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(result, f)
    return result
