"""Per-step summaries of every rank, kept for every step of a run at a few bytes each.

One row per (rank, step), columns of 8-byte floats (NaN where a step has no value): the
loss and any other metric, the step's start and duration, the peak bytes of each memory
category and the bytes and seconds of each collective op. Older rows are sealed in chunks
and a chunk of one repeated value keeps that value once (``summary_columns.Column``): the
peaks and a collective's bytes repeat step after step, so 100k steps of two ranks with one
op take about 9 MB (48 bytes a rank a step on a DP run; 24 MB as plain arrays), against
~100 KB per step for the events themselves. A figure reads a column as a numpy array
(``column``), bucketed to min/max envelopes (``envelope``) so its size does not grow with
the run.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable
from typing import Any

from workbench.trace.events import CommEvent, Event, MemorySample, Metric, PhaseSpan
from workbench.trace.summary_columns import Column

__all__ = ["MEMORY_COLUMNS", "StepSummaries", "envelope"]

NAN = math.nan
# Peak bytes per memory category (``MemorySample`` fields) and of their total.
MEMORY_COLUMNS = (
    "params",
    "frozen",
    "grads",
    "optimizer",
    "activations",
    "other",
    "allocator",
    "total",
)
_TIMES = ("start_ns", "end_ns")
_FIXED = (*_TIMES, *(f"peak:{c}" for c in MEMORY_COLUMNS))


class _RankTable:
    """The summary rows of one rank, steps ascending."""

    __slots__ = ("columns", "origin", "steps")

    def __init__(self) -> None:
        # Times are kept as ns after the rank's first span: an epoch's ns (1.7e18) would
        # lose its last digits in a float, small offsets keep them.
        self.origin: int | None = None
        self.steps = Column("q")
        self.columns: dict[str, Column] = {name: Column("d") for name in _FIXED}

    def row(self, step: int) -> int:
        """The row of ``step``, made (NaN everywhere) when it is new."""
        steps = self.steps
        if steps and steps[-1] == step:  # the common case: the step in progress
            return len(steps) - 1
        if not steps or step > steps[-1]:
            steps.append(step)
            for column in self.columns.values():
                column.append(NAN)
            return len(steps) - 1
        i = bisect.bisect_left(steps, step)
        if steps[i] == step:
            return i
        steps.insert(i, step)
        for column in self.columns.values():
            column.insert(i, NAN)
        return i

    def column(self, name: str) -> Column:
        found = self.columns.get(name)
        if found is None:
            found = self.columns[name] = Column("d", [NAN] * len(self.steps))
        return found

    def add_span(self, i: int, span: PhaseSpan) -> None:
        """Row ``i``'s start and end: the earliest start and latest end of its spans."""
        # A span that began before the previous step ended encloses several steps (the
        # ``wb.traced`` block itself, emitted at its end): it is not this step's time.
        previous_end = self.columns["end_ns"][i - 1] if i > 0 else NAN
        if self.origin is not None and span.start - self.origin < previous_end:
            return
        if self.origin is None:
            self.origin = span.start
        begin, finish = span.start - self.origin, span.end - self.origin
        start, end = self.columns["start_ns"], self.columns["end_ns"]
        if math.isnan(start[i]) or begin < start[i]:
            start[i] = begin
        if math.isnan(end[i]) or finish > end[i]:
            end[i] = finish

    def drop_from(self, step: int) -> None:
        i = bisect.bisect_left(self.steps, step)
        self.steps.truncate(i)
        for column in self.columns.values():
            column.truncate(i)


class StepSummaries:
    """What every step of every rank came to, built from its events as they arrive."""

    def __init__(self) -> None:
        self._ranks: dict[int, _RankTable] = {}

    def __repr__(self) -> str:
        return f"<StepSummaries ranks={sorted(self._ranks)} steps={self.steps}>"

    @property
    def ranks(self) -> list[int]:
        return sorted(self._ranks)

    @property
    def steps(self) -> int:
        """Steps summarised on the rank with the most."""
        return max((len(t.steps) for t in self._ranks.values()), default=0)

    @property
    def last_step(self) -> int:
        return max((t.steps[-1] for t in self._ranks.values() if t.steps), default=-1)

    def nbytes(self) -> int:
        return sum(
            t.steps.nbytes() + sum(c.nbytes() for c in t.columns.values())
            for t in self._ranks.values()
        )

    def add(self, events: Iterable[Event]) -> None:
        for event in events:
            table = self._ranks.get(event.rank)
            if table is None:
                table = self._ranks[event.rank] = _RankTable()
            i = table.row(event.step)
            if isinstance(event, PhaseSpan):
                table.add_span(i, event)
            elif isinstance(event, MemorySample):
                _max(table, i, "peak:total", event.total)
                for name in MEMORY_COLUMNS[:-1]:
                    _max(table, i, f"peak:{name}", getattr(event, name))
            elif isinstance(event, CommEvent):
                _sum(table, i, f"comm_bytes:{event.op}", event.bytes)
                _sum(table, i, f"comm_s:{event.op}", event.duration_s)
            elif isinstance(event, Metric):
                table.column(f"metric:{event.name}")[i] = event.value

    def drop_from(self, step: int) -> None:
        """A roll-back: steps from ``step`` on did not happen."""
        for table in self._ranks.values():
            table.drop_from(step)

    def columns(self, rank: int) -> list[str]:
        table = self._ranks.get(rank)
        return [] if table is None else sorted(table.columns)

    def column(self, rank: int, name: str) -> Any:
        """``(steps, values)`` of one rank as numpy arrays (copies: a view would pin the
        table's buffers, which then could not grow). ``step_s`` is end minus start, in s."""
        import numpy as np

        table = self._ranks.get(rank)
        if table is None or not table.steps:
            return np.empty(0, dtype=np.int64), np.empty(0)
        steps = table.steps.to_numpy()
        if name == "step_s":
            cols = table.columns
            return steps, (cols["end_ns"].to_numpy() - cols["start_ns"].to_numpy()) / 1e9
        if name not in table.columns:
            return steps, np.full(len(steps), np.nan)
        return steps, table.columns[name].to_numpy()

    def ops(self, rank: int) -> list[str]:
        """The collective ops this rank ran."""
        return sorted(c.split(":", 1)[1] for c in self.columns(rank) if c.startswith("comm_s:"))

    def rows(self, rank: int | None = None) -> list[dict[str, Any]]:
        """Every row as a dict (for a table or a DataFrame): rank, step, step_s and every
        column that has a value."""
        out = []
        for r in [rank] if rank is not None else self.ranks:
            table = self._ranks.get(r)
            if table is None:
                continue
            columns = {name: column.to_array() for name, column in table.columns.items()}
            for i, step in enumerate(table.steps.to_array()):
                row: dict[str, Any] = {"rank": r, "step": step}
                start, end = columns["start_ns"][i], columns["end_ns"][i]
                if not math.isnan(start):
                    row["step_s"] = (end - start) / 1e9
                for name, column in columns.items():
                    if name not in ("start_ns", "end_ns") and not math.isnan(column[i]):
                        row[name] = column[i]
                out.append(row)
        return out

    # -- rows sent by engines: the steps whose detail stays on the engine -----------------
    def export_rows(self) -> list[dict[str, Any]]:
        """Every row as an engine sends it for a step whose detail it does not send
        (``merge_rows`` takes it): ``rank``, ``step``, the columns with a value, and
        ``start_ns`` / ``end_ns`` as absolute ns (each side has its own origin)."""
        out: list[dict[str, Any]] = []
        for rank, table in self._ranks.items():
            origin = table.origin or 0
            items = [(name, column.to_array()) for name, column in table.columns.items()]
            for i, step in enumerate(table.steps.to_array()):
                row: dict[str, Any] = {"rank": rank, "step": step}
                for name, column in items:
                    value = column[i]
                    if math.isnan(value):
                        continue
                    row[name] = origin + int(value) if name in _TIMES else value
                out.append(row)
        return out

    def merge_rows(self, rows: Iterable[dict[str, Any]]) -> None:
        """Fold engines' summary rows in as their events would have been: peaks by max,
        collective bytes and seconds by sum, metrics by value, times by min / max (a step
        may come partly as events, partly as a row)."""
        for row in rows:
            rank = int(row["rank"])
            table = self._ranks.get(rank)
            if table is None:
                table = self._ranks[rank] = _RankTable()
            i = table.row(int(row["step"]))
            for name, value in row.items():
                if name in ("rank", "step"):
                    continue
                if name in _TIMES:
                    if table.origin is None:
                        table.origin = int(value)
                    offset = float(int(value) - table.origin)
                    column = table.columns[name]
                    old = column[i]
                    later = name == "end_ns"
                    if math.isnan(old) or (offset > old if later else offset < old):
                        column[i] = offset
                elif name.startswith("peak:"):
                    _max(table, i, name, value)
                elif name.startswith("comm_"):
                    _sum(table, i, name, value)
                else:
                    table.column(name)[i] = value


def _max(table: _RankTable, i: int, name: str, value: float) -> None:
    column = table.column(name)
    if math.isnan(column[i]) or value > column[i]:
        column[i] = value


def _sum(table: _RankTable, i: int, name: str, value: float) -> None:
    column = table.column(name)
    column[i] = value if math.isnan(column[i]) else column[i] + value


def envelope(steps: Any, values: Any, buckets: int = 1000) -> dict[str, Any]:
    """Min/max/mean of ``values`` per bucket of consecutive steps (W&B's and
    plotly-resampler's envelopes): at most ``buckets`` points whatever the length. A run
    short enough is returned as it is (``min == max == mean``). NaNs are skipped."""
    import numpy as np

    steps = np.asarray(steps)
    values = np.asarray(values, dtype=float)
    n = len(values)
    if n <= buckets:
        return {"x": steps.astype(float), "min": values, "max": values, "mean": values}
    size = -(-n // buckets)
    pad = (-n) % size
    shaped = np.concatenate((values, np.full(pad, np.nan))).reshape(-1, size)
    x = np.concatenate((steps.astype(float), np.full(pad, np.nan))).reshape(-1, size)
    import warnings

    with warnings.catch_warnings():  # an all-NaN bucket is NaN, as it should be
        warnings.simplefilter("ignore", RuntimeWarning)
        return {
            "x": np.nanmean(x, axis=1),
            "min": np.nanmin(shaped, axis=1),
            "max": np.nanmax(shaped, axis=1),
            "mean": np.nanmean(shaped, axis=1),
        }
