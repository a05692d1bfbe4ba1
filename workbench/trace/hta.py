"""Per-rank traces in the shape of PyTorch profiler (Kineto) traces, for Holistic Trace
Analysis (``holistictraceanalysis``: ``TraceAnalysis(trace_dir=...)``).

HTA reads one JSON file per rank (``distributedInfo.rank``), steps from ``ProfilerStep#N``
annotations, and device work from "kernel" events on a stream, each tied by a correlation
id to the CPU call that launched it. The workbench's events map onto that shape:

- each step is a ``ProfilerStep#<step>`` annotation over that step's phases;
- each compute phase (not ``sync``, which is the collectives' time) is a kernel named after
  the phase on stream 7: HTA counts it as computation;
- each collective's transfer is a kernel ``ncclKernel_<Op>`` on stream 8 (HTA counts a
  kernel named ``nccl...Kernel`` as communication) that starts once the latest peer has
  arrived: the time a rank waited inside it for a late peer (``stragglers.py``) is left
  out, so HTA's temporal breakdown counts that wait as idle, apart from the transfer.

On CPU ranks the "kernels" are the phases the workbench timed; HTA's GPU-only analyses
(kernel launch statistics, CUDA counters) have nothing to read here.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from workbench.trace.events import CommEvent, Event, PhaseSpan
from workbench.trace.stragglers import collective_waits

__all__ = ["to_hta"]

COMPUTE_STREAM = 7
COMM_STREAM = 8


def _op_name(op: str) -> str:
    return "ncclKernel_" + "".join(part.capitalize() for part in op.split("_"))


class _RankTrace:
    """One rank's Kineto-shaped events; times are microseconds from the run's first event."""

    def __init__(self, rank: int, world: int, t0: int, backend: str) -> None:
        self.rank, self.t0 = rank, t0
        self.events: list[dict[str, Any]] = []
        self.correlation = 0
        self.head = {
            "schemaVersion": 1,
            "distributedInfo": {"backend": backend, "rank": rank, "world_size": world},
            "deviceProperties": [],
        }

    def _us(self, t_ns: int) -> float:
        return (t_ns - self.t0) / 1000.0

    def step(self, step: int, start: int, end: int) -> None:
        self.events.append(
            {
                "ph": "X",
                "cat": "user_annotation",
                "name": f"ProfilerStep#{step}",
                "pid": self.rank,
                "tid": 1,
                "ts": self._us(start),
                "dur": (end - start) / 1000.0,
                "args": {"External id": 0},
            }
        )

    def kernel(self, name: str, stream: int, start: int, end: int) -> None:
        """A launch on the CPU and the kernel it starts, tied by one correlation id."""
        self.correlation += 1
        args = {"correlation": self.correlation, "External id": self.correlation}
        self.events.append(
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": self.rank,
             "tid": 1, "ts": self._us(start), "dur": 0.001, "args": dict(args)}
        )  # fmt: skip
        self.events.append(
            {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": stream,
             "ts": self._us(start), "dur": (end - start) / 1000.0,
             "args": {**args, "stream": stream, "device": 0}}
        )  # fmt: skip

    def as_dict(self) -> dict[str, Any]:
        return {**self.head, "traceEvents": self.events}


def to_hta(
    events: Iterable[Event], directory: str | os.PathLike[str], *, backend: str = "gloo"
) -> list[Path]:
    """Write ``rank<N>.json`` for every rank of ``events`` into ``directory`` (created if
    missing); returns the paths. ``TraceAnalysis(trace_dir=directory)`` loads them."""
    items = list(events)
    timed = [e for e in items if isinstance(e, PhaseSpan | CommEvent)]
    if not timed:
        raise ValueError("no phases or collectives to export; trace a few steps first")
    t0 = min(e.start for e in timed)
    ranks = sorted({e.rank for e in timed})
    traces = {r: _RankTrace(r, len(ranks), t0, backend) for r in ranks}
    bounds: dict[tuple[int, int], list[int]] = defaultdict(list)
    for e in timed:
        bounds[(e.rank, e.step)] += [e.start, e.end]
    for (rank, step), times in sorted(bounds.items()):
        traces[rank].step(step, min(times), max(times))
    waits = collective_waits(items)
    for e in sorted(timed, key=lambda e: e.start):
        if isinstance(e, PhaseSpan) and not e.phase.startswith("sync"):
            traces[e.rank].kernel(e.phase, COMPUTE_STREAM, e.start, e.end)
        elif isinstance(e, CommEvent):
            start = e.start + waits.get(e, 0)
            traces[e.rank].kernel(_op_name(e.op), COMM_STREAM, start, max(e.end, start))
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for rank, trace in traces.items():
        path = out / f"rank{rank}.json"
        path.write_text(json.dumps(trace.as_dict()), encoding="utf-8")
        paths.append(path)
    return paths
