"""``EventStore``: a run's events at a flat cost, whatever its length.

Every event updates the per-step summaries (``summary.StepSummaries``, kept for every
step). Full detail is held in memory for a window of the ``recent`` last steps; a step that
leaves the window goes to the run directory's event file when the recording policy selects
it (``policy.RecordPolicy``: the first steps, a profiler-style schedule) and is dropped
otherwise. Metrics other than the loss (a checkpoint's seconds) are few and always kept.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from workbench import validate
from workbench.errors import ConfigError
from workbench.trace.event_file import EventFile
from workbench.trace.events import Event, Metric
from workbench.trace.policy import DEFAULT_POLICY, RecordPolicy
from workbench.trace.summary import StepSummaries

__all__ = ["EventStore", "check_run_dir", "step_ranges"]

EVENT_FILE = "events.sqlite"


def check_run_dir(run_dir: object) -> Path | None:
    """The run directory made and proven writable now, before any run starts; None when
    not given (a private temporary one is made on first need)."""
    if run_dir is None:
        return None
    if not isinstance(run_dir, str | os.PathLike):
        raise validate.invalid("run_dir", run_dir, "not a path", "use a str or Path, or None")
    path = Path(run_dir).expanduser().absolute()
    try:
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
        probe = path / f".write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise ConfigError(
            f"run_dir={str(path)!r} cannot be written ({exc.strerror or exc}); give a "
            "directory you can write, or None for a private temporary one"
        ) from None
    return path


def step_ranges(steps: Iterable[int]) -> str:
    """``[0, 1, 2, 7, 8]`` -> ``"0-2, 7-8"``."""
    runs: list[list[int]] = []
    for step in sorted(set(steps)):
        if runs and step == runs[-1][1] + 1:
            runs[-1][1] = step
        else:
            runs.append([step, step])
    return ", ".join(f"{a}-{b}" if a != b else str(a) for a, b in runs) or "none"


class EventStore:
    """Summaries of every step, detail for the steps the policy keeps (see module doc)."""

    def __init__(
        self, run_dir: str | os.PathLike[str] | None = None, policy: RecordPolicy = DEFAULT_POLICY
    ) -> None:
        self._dir = check_run_dir(run_dir)
        self.policy = policy
        self.summaries = StepSummaries()
        self._window: dict[int, list[Event]] = {}  # step -> its events, in arrival order
        self._kept: list[Metric] = []  # metrics other than the loss: few, always kept
        self._file: EventFile | None = None
        self._newest = -1

    def __repr__(self) -> str:
        return (
            f"<EventStore steps={self.summaries.steps} window={len(self._window)} "
            f"file={str(self._file.path) if self._file else None!r}>"
        )

    def __len__(self) -> int:
        on_file = self._file.count() if self._file is not None else 0
        return on_file + sum(len(v) for v in self._window.values()) + len(self._kept)

    @property
    def run_dir(self) -> Path:
        """Where the event file lives (a private temporary directory unless given)."""
        if self._dir is None:
            self._dir = Path(tempfile.mkdtemp(prefix="workbench-run-"))  # mode 0700
        return self._dir

    @property
    def path(self) -> Path:
        """The event file (steps that left the window and the policy keeps)."""
        return self.run_dir / EVENT_FILE

    def set_policy(self, policy: RecordPolicy) -> None:
        self.policy = policy

    def add(self, events: list[Event]) -> None:
        """Summarise ``events`` and keep their detail as the policy says."""
        self.summaries.add(events)
        window = self._window
        for event in events:
            if isinstance(event, Metric) and event.name != "loss":
                self._kept.append(event)
                continue
            found = window.get(event.step)
            if found is None:
                found = window[event.step] = []
                self._newest = max(self._newest, event.step)
            found.append(event)
        self._slide()

    def add_rows(self, rows: list[dict[str, Any]]) -> None:
        """Summary rows of steps an engine sent without their detail (``StepFilter``)."""
        if rows:
            self.summaries.merge_rows(rows)

    def add_detail(self, events: list[Event]) -> None:
        """Detail of steps already summarised (a run stopped early fetches its window):
        kept in the window for the steps it covers, not summarised again."""
        self._newest = max(self._newest, *(e.step for e in events), -1)
        oldest = self._newest - max(self.policy.recent, 1) + 1
        for event in events:
            if event.step >= oldest and not (isinstance(event, Metric) and event.name != "loss"):
                self._window.setdefault(event.step, []).append(event)
        self._slide()

    def _slide(self) -> None:
        """Steps older than the window go to the file (selected) or away (not)."""
        # The newest step always stays: it may be in progress (a phase at a time).
        oldest = self._newest - max(self.policy.recent, 1) + 1
        leaving = [s for s in self._window if s < oldest]
        if not leaving:
            return
        spill: list[Event] = []
        for step in sorted(leaving):
            events = self._window.pop(step)
            if self.policy.selected(step):
                spill.extend(events)
        if spill:
            self._open().write(spill)

    def _open(self) -> EventFile:
        if self._file is None:
            self._file = EventFile(self.path)
        return self._file

    def events(self, first: int | None = None, last: int | None = None) -> list[Event]:
        """Every event kept in detail for steps ``first`` to ``last`` (inclusive), oldest
        step first: the file's, then the window's, then the kept metrics."""
        out = self._file.read(first, last) if self._file is not None else []
        for step in sorted(self._window):
            if (first is None or step >= first) and (last is None or step <= last):
                out.extend(self._window[step])
        out.extend(
            m
            for m in self._kept
            if (first is None or m.step >= first) and (last is None or m.step <= last)
        )
        return out

    def recorded_steps(self) -> list[int]:
        """Steps whose full detail is kept (on file or in the window)."""
        on_file = self._file.steps() if self._file is not None else []
        return sorted({*on_file, *self._window})

    def window_steps(self) -> list[int]:
        return sorted(self._window)

    def whole_run_in_window(self) -> bool:
        """Every step so far is still in memory (a short run): detail figures are cheap."""
        return self.summaries.steps <= len(self._window) and self._file is None

    def drop_from(self, step: int) -> None:
        """A roll-back: the steps from ``step`` on did not happen."""
        self.summaries.drop_from(step)
        for s in [s for s in self._window if s >= step]:
            del self._window[s]
        self._kept = [m for m in self._kept if m.step < step]
        if self._file is not None:
            self._file.drop_from(step)
        self._newest = max(self._window, default=-1)

    def clear(self) -> None:
        """Empty (a rebuild): the file's rows too."""
        self.drop_from(0)
        self.summaries = StepSummaries()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
