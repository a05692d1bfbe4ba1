"""Engine side of the out-of-band status channel: where is this rank, what does it wait for.

An engine blocked in a collective cannot answer ipyparallel requests, so each engine runs a
small daemon thread that copies its recorders' ``snapshot()`` (step, phase, in-flight
collectives) to ``<run_dir>/rank-00001.json`` whenever it changes, checking every
``INTERVAL_S`` (so a status is at most that old: an engine killed right after a change
shows the state just before it). gloo and NCCL release the GIL while they wait, so the
thread keeps running while the main thread is stuck. The collectives themselves pay nothing
extra: they already register with ``recorder.begin_flight``; the thread only reads that
dict (a status write costs ~0.2 ms, at most 20 per second).

For plain ``%%wb`` cells a *cell tracer* (a ``CommTracer`` on a recorder that keeps no
events, only the in-flight record) stays active on every engine, so a user's own
``dist.all_reduce`` shows up in a hang report too. While a traced training run exists its
own ``CommTracer`` records instead (two stacked tracers would double the per-op cost).

The cell recorder also keeps this rank's ``Ledger`` of collectives issued (per cell: how
many of each op; the last one's op, bytes and state), written with one ``pwrite`` before
each collective reaches the backend (µs: ``benchmarks/autopsy_bench.py``). It outlives
an engine that gloo aborts (a collective whose sizes differ kills the rank that reads too
much), so the kernel can say why it died (``cluster/dispatch/autopsy.py``).
"""

from __future__ import annotations

import enum
import json
import os
import threading
import weakref
from pathlib import Path
from typing import Any

from workbench.engine.state import engine_state
from workbench.trace.events import Event
from workbench.trace.recorder import Recorder

__all__ = [
    "INTERVAL_S",
    "FlightRecorder",
    "Ledger",
    "LedgerState",
    "ledger",
    "ledger_path",
    "pause_cell_tracer",
    "read_ledger",
    "resume_cell_tracer",
    "start_monitor",
    "status_path",
    "stop_monitor",
    "unwatch",
    "watch",
]

INTERVAL_S = 0.05


def ledger_path(run_dir: str | os.PathLike[str], rank: int) -> Path:
    return Path(run_dir) / f"ledger-{rank:05d}.json"


_RECORD = 2048  # the ledger's fixed record size: a shorter write leaves no stale tail
_STATE = 10  # its first bytes: the state as last written (a collective's end is not)


class LedgerState(enum.Enum):
    IN = "in"  # a collective issued, not returned
    DONE = "done"
    FAILED = "failed"
    IDLE = "idle"  # no collective yet in this cell
    UNTRACKED = "untracked"  # the cell tracer is off (a training run's tracer records)


def read_ledger(run_dir: str | os.PathLike[str], rank: int) -> dict[str, Any] | None:
    """A rank's ledger file as its ``Ledger.record()`` (None: none, or unreadable); its
    state "in" means "the last collective begun", which may have returned since."""
    try:
        text = ledger_path(run_dir, rank).read_text()
        record = json.loads(text[_STATE:])
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict):
        return None
    record["state"] = text[:_STATE].strip()
    return record


class Ledger:
    """This rank's record of the collectives it issued since its group was created, and in
    the current cell. One owner (the engine's cell recorder, ``hang.FlightRecorder``)
    calls ``begin`` / ``end`` around each collective and ``new_cell`` as a cell starts."""

    def __init__(self, run_dir: str | os.PathLike[str], rank: int) -> None:
        self.rank = rank
        self.cell = 0  # cells started since the group was created
        self.issued = 0  # collectives since then (the same count on every rank in step)
        self.in_cell = 0  # collectives in this cell
        self.counts: dict[str, int] = {}  # op -> issued in this cell
        self.last: dict[str, Any] = {}  # the latest collective: op, bytes, group_size
        self.state = LedgerState.IDLE
        self._lock = threading.Lock()
        path = ledger_path(run_dir, rank)
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        self._write()

    def record(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "cell": self.cell,
            "issued": self.issued,
            "in_cell": self.in_cell,
            "counts": dict(self.counts),
            "last": dict(self.last),
            "state": self.state.value,
        }

    def new_cell(self) -> None:
        with self._lock:
            self.cell += 1
            self.in_cell = 0
            self.counts = {}
            if self.state is not LedgerState.UNTRACKED:  # (stays so while a run records)
                self.state = LedgerState.IDLE
            self._write()

    def tracked(self) -> None:
        """The cell tracer is on again: counting starts afresh."""
        with self._lock:
            self.counts = {}
            self.state = LedgerState.IDLE
            self._write()

    def untracked(self) -> None:
        """The cell tracer is off (a training run's own tracer records): counts unknown."""
        with self._lock:
            self.counts = {}
            self.state = LedgerState.UNTRACKED
            self._write()

    def begin(self, op: str, nbytes: int, group_size: int) -> None:
        with self._lock:
            self.issued += 1
            self.in_cell += 1
            self.counts[op] = self.counts.get(op, 0) + 1
            self.last = {
                "op": op,
                "bytes": int(nbytes),
                "group_size": int(group_size),
                "issued": self.issued,
                "in_cell": self.in_cell,
                "nth": self.counts[op],
            }
            self.state = LedgerState.IN
            self._write()

    def end(self, failed: bool = False) -> None:
        """In memory only (what the engine answers the kernel with): the file keeps the
        last collective *begun*, all a dead rank's explanation needs, at one write each."""
        with self._lock:
            if self.state is LedgerState.IN:
                self.state = LedgerState.FAILED if failed else LedgerState.DONE

    def _write(self) -> None:
        """The file: ``_STATE`` bytes of state, then the rank, cell and last collective as
        JSON (the per-op counts are answered from memory: the file is for a dead rank),
        padded to ``_RECORD`` so that a shorter record leaves no stale tail. Formatted by
        hand: ``json.dumps`` of the record was most of the per-collective cost."""
        last = self.last
        text = (
            f'{self.state.value:<{_STATE}}{{"rank":{self.rank},"cell":{self.cell},'
            f'"issued":{self.issued},"in_cell":{self.in_cell},"last":'
        )
        if last:
            text += (
                f'{{"op":{json.dumps(last["op"])},"bytes":{last["bytes"]},'
                f'"group_size":{last["group_size"]},"issued":{last["issued"]},'
                f'"in_cell":{last["in_cell"]},"nth":{last["nth"]}}}}}'
            )
        else:
            text += "{}}"
        try:  # one syscall, no fsync: the page cache outlives an aborted process
            os.pwrite(self._fd, text.encode()[:_RECORD].ljust(_RECORD, b" "), 0)
        except OSError:
            return

    def close(self) -> None:
        try:
            os.close(self._fd)
        except OSError:
            return


def status_path(run_dir: str | os.PathLike[str], rank: int) -> Path:
    return Path(run_dir) / f"rank-{rank:05d}.json"


class FlightRecorder(Recorder):
    """A recorder that keeps only the in-flight record (no event log that would grow), and
    this rank's ledger of collectives issued (``autopsy.Ledger``, written before each one
    reaches the backend: it survives an engine the backend aborts)."""

    def __init__(self, rank: int = 0) -> None:
        super().__init__(rank)
        self.ledger: Ledger | None = None

    def keep_ledger(self, run_dir: str, rank: int) -> None:
        """A fresh ledger for this rank's new process group (the old one is closed)."""
        if self.ledger is not None:
            self.ledger.close()
        self.rank = rank
        self.ledger = Ledger(run_dir, rank)

    def emit(self, event: Event) -> None:
        return None

    def begin_flight(self, **info: Any) -> int:
        token = super().begin_flight(**info)
        if self.ledger is not None:
            op, size = str(info.get("op", "?")), int(info.get("group_size") or 0)
            self.ledger.begin(op, int(info.get("bytes") or 0), size)
        return token

    def end_flight(self, token: int) -> None:
        super().end_flight(token)
        if self.ledger is not None:
            self.ledger.end()

    def fail_flight(self, token: int) -> None:
        super().fail_flight(token)
        if self.ledger is not None:
            self.ledger.end(failed=True)


class _Monitor(threading.Thread):
    def __init__(self, run_dir: str, rank: int) -> None:
        super().__init__(name="workbench-flight-monitor", daemon=True)
        self.run_dir = run_dir
        self.rank = rank
        self.recorders: list[weakref.ref[Recorder]] = []
        self.stopped = threading.Event()
        self.lock = threading.Lock()
        self.last = ""

    def retarget(self, run_dir: str, rank: int) -> None:
        """A new group's run directory and rank (the thread lives as long as the engine)."""
        self.run_dir, self.rank, self.last = run_dir, rank, ""

    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            recorders = [r for ref in self.recorders if (r := ref()) is not None]
        step, phase, flights = 0, "", []
        failed_at = max((r.failed_at for r in recorders), default=0.0)
        for recorder in recorders:
            snap = recorder.snapshot()
            if not isinstance(recorder, FlightRecorder):  # a training run: it knows where
                step, phase = snap["step"], snap["phase"]
            flights += snap["in_flight"]
        for flight in flights:  # a cell tracer's flights take the run's position
            if not flight.get("phase"):
                flight["step"], flight["phase"] = step, phase
        return {
            "rank": self.rank,
            "pid": os.getpid(),
            "step": step,
            "phase": phase,
            "in_flight": flights,
            "failed_at": failed_at,
        }

    def write(self) -> None:
        text = json.dumps(self.snapshot(), sort_keys=True, default=str)
        if text == self.last:
            return
        path = status_path(self.run_dir, self.rank)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(text)
        os.replace(tmp, path)  # readers never see half a file
        self.last = text

    def run(self) -> None:
        while not self.stopped.wait(INTERVAL_S):
            try:
                self.write()
            except Exception:  # e.g. the run directory went away: never end the thread
                continue


def _monitor() -> _Monitor | None:
    """This engine's status thread (the engine state holds it), if one was started."""
    monitor = engine_state().status_thread
    return monitor if isinstance(monitor, _Monitor) else None


def start_monitor(run_dir: str, rank: int) -> None:
    """Start (or retarget) this engine's status thread and its cell tracer."""
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    state = engine_state()
    monitor = _monitor()
    if monitor is not None and monitor.is_alive():
        monitor.retarget(run_dir, rank)
    else:
        monitor = _Monitor(run_dir, rank)
        state.start_status_thread(monitor)
        monitor.start()
    recorder = state.cell_recorder
    if not isinstance(recorder, FlightRecorder):
        recorder = FlightRecorder(rank)
        state.record_cells(recorder)
        watch(recorder)
        _count_cells()
    recorder.keep_ledger(run_dir, rank)
    resume_cell_tracer()


def ledger() -> Ledger | None:
    """This rank's ledger of collectives (None before its first group with a run dir)."""
    recorder = engine_state().cell_recorder
    return recorder.ledger if isinstance(recorder, FlightRecorder) else None


def _count_cells() -> None:
    """Start the ledger's per-cell count as each cell starts (both cell paths run it
    through the shell, which fires ``pre_run_cell``); registered once per engine."""
    try:
        from IPython import get_ipython

        shell = get_ipython()
    except ImportError:
        return
    if shell is None:
        return

    def new_cell(*_: Any) -> None:
        current = ledger()
        if current is not None:
            current.new_cell()

    shell.events.register("pre_run_cell", new_cell)


def stop_monitor() -> None:
    pause_cell_tracer()
    # Tracing is off for good on this engine: hand the dispatcher back (the collective
    # kernels stay parked between traced blocks, see trace/intercept.py).
    from workbench.trace.intercept import release

    release()
    monitor = engine_state().stop_status_thread()
    if isinstance(monitor, _Monitor):
        monitor.stopped.set()


def watch(recorder: Recorder) -> None:
    """Include ``recorder`` (a training run's) in this engine's status file."""
    monitor = _monitor()
    if monitor is None:
        return
    with monitor.lock:
        monitor.recorders = [ref for ref in monitor.recorders if ref() is not None]
        if all(ref() is not recorder for ref in monitor.recorders):
            monitor.recorders.append(weakref.ref(recorder))


def unwatch(recorder: Recorder) -> None:
    monitor = _monitor()
    if monitor is None:
        return
    with monitor.lock:
        monitor.recorders = [
            ref for ref in monitor.recorders if ref() is not None and ref() is not recorder
        ]


def pause_cell_tracer() -> None:
    """Stop the cell tracer (a traced training run records its own collectives)."""
    state = engine_state()
    tracer = state.cell_tracer
    state.trace_cells(None)
    current = ledger()
    if current is not None:  # what it counted is not this run's: say so (autopsy)
        current.untracked()
    if tracer is not None:
        try:
            tracer.stop()
        except Exception:  # another dispatch mode on top: leave it rather than fail
            state.trace_cells(tracer)


def resume_cell_tracer() -> None:
    state = engine_state()
    recorder = state.cell_recorder
    if recorder is None or state.cell_tracer is not None:
        return
    if isinstance(recorder, FlightRecorder) and recorder.ledger is not None:
        recorder.ledger.tracked()
    from workbench.trace.comm import CommTracer

    state.trace_cells(CommTracer(recorder).start())
