"""On the engines: what the kernel's autopsy of a hung cell (and ``cluster.stacks()``) asks.

Three pieces, none of which needs the engine's main thread (it may be blocked in a
collective, or busy in the user's code):

- a **handler on the control thread** (``REQUEST``): ipykernel serves the control channel on
  a thread of its own (as ``control_sever`` uses), so the handler reads every thread's
  Python stack (``sys._current_frames()``) and torch's flight recorder
  (``_dump_fr_trace_json()``, ~0.2 ms) while the cell goes on. The request travels the
  channel the cluster already has to every engine (through the controller; a remote
  engine's nanny relays it), so it works for engines on other hosts too;
- the **flight recorder** itself: ``enable_flight_recorder`` sets ``TORCH_FR_BUFFER_SIZE``
  before the process group exists (torch 2.13 records gloo as well as NCCL). Its pickled
  dump (``_dump_fr_trace()``) takes seconds to symbolize here, so the JSON one is sent and
  the kernel writes the file ``fr_trace`` reads;
- a **ledger** of the collectives this rank issued (per cell: how many of each op, and the
  last one's op, bytes and state), written with one ``pwrite`` before each collective
  reaches gloo (~10 µs, see ``benchmarks/autopsy_bench.py``). It outlives an engine that
  gloo aborts (a collective whose sizes differ kills the rank that reads too much), so the
  kernel can say why the engine died: ``cluster/autopsy.py`` compares the ranks' ledgers.
"""

from __future__ import annotations

import json
import linecache
import os
import sys
import threading
import traceback
from collections.abc import Mapping
from pathlib import Path
from types import FrameType
from typing import Any

__all__ = [
    "FR_BUFFER_SIZE",
    "REPLY",
    "REQUEST",
    "Ledger",
    "enable_flight_recorder",
    "flight_entries",
    "format_stack",
    "install",
    "ledger_path",
]

REQUEST = "workbench_autopsy_request"
REPLY = "workbench_autopsy_reply"
FR_BUFFER_SIZE = "512"  # entries torch's flight recorder keeps (a ring: the latest ones)
_RECORD = 2048  # the ledger's fixed record size: a shorter write leaves no stale tail

# Frames of the machinery a cell runs under (kernel, event loop, ipyparallel, workbench's
# own dispatch and tracing): dropped from a stack that has no cell frame, so it starts at
# the user's function.
_MACHINERY = (
    f"{os.sep}ipykernel{os.sep}",
    f"{os.sep}ipyparallel{os.sep}",
    f"{os.sep}IPython{os.sep}",
    f"{os.sep}tornado{os.sep}",
    f"{os.sep}asyncio{os.sep}",
    f"{os.sep}zmq{os.sep}",
    f"{os.sep}traitlets{os.sep}",
    f"{os.sep}workbench{os.sep}engine{os.sep}",
    f"{os.sep}workbench{os.sep}trace{os.sep}",
    "<frozen runpy>",
    f"{os.sep}threading.py",
)


def ledger_path(run_dir: str | os.PathLike[str], rank: int) -> Path:
    return Path(run_dir) / f"ledger-{rank:05d}.json"


def enable_flight_recorder() -> None:
    """Turn torch's flight recorder on for the process group about to be created (a
    user's own ``TORCH_FR_BUFFER_SIZE``, 0 included, is kept)."""
    os.environ.setdefault("TORCH_FR_BUFFER_SIZE", FR_BUFFER_SIZE)


class Ledger:
    """This rank's record of the collectives it issued since its group was created, and in
    the current cell. One owner (the engine's cell recorder, ``flight.FlightRecorder``)
    calls ``begin`` / ``end`` around each collective and ``new_cell`` as a cell starts."""

    def __init__(self, run_dir: str | os.PathLike[str], rank: int) -> None:
        self.rank = rank
        self.cell = 0  # cells started since the group was created
        self.issued = 0  # collectives since then (the same count on every rank in step)
        self.in_cell = 0  # collectives in this cell
        self.counts: dict[str, int] = {}  # op -> issued in this cell
        self.last: dict[str, Any] = {}  # the latest collective: op, bytes, group_size
        self.state = "idle"  # "in" (issued, not returned), "done", "failed", "idle"
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
            "state": self.state,
        }

    def new_cell(self) -> None:
        with self._lock:
            self.cell += 1
            self.in_cell = 0
            self.counts = {}
            self.state = "idle"
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
            self.state = "in"
            self._write()

    def end(self, failed: bool = False) -> None:
        with self._lock:
            if self.state == "in":
                self.state = "failed" if failed else "done"
                self._write()

    def _write(self) -> None:
        data = json.dumps(self.record(), separators=(",", ":")).encode()
        if len(data) > _RECORD:  # hundreds of distinct ops: keep the record readable
            self.counts = {self.last.get("op", "?"): self.last.get("nth", 0)}
            data = json.dumps(self.record(), separators=(",", ":")).encode()
        try:
            os.pwrite(self._fd, data.ljust(_RECORD, b" "), 0)  # one syscall, no fsync:
        except OSError:  # the page cache outlives an aborted process; the run dir may not
            return

    def close(self) -> None:
        try:
            os.close(self._fd)
        except OSError:
            return


# ------------------------------------------------------------------------------- stacks
def _cell_files() -> Mapping[str, int]:
    """Cell file name -> how many lines to add to its line numbers to make them the
    cell's own: IPython drops a cell's leading blank lines before compiling it."""
    try:
        from IPython import get_ipython

        shell = get_ipython()
    except Exception:
        return {}
    names = getattr(getattr(shell, "compile", None), "_filename_map", None) or {}
    raw = getattr(getattr(shell, "history_manager", None), "input_hist_raw", None) or []
    offsets = {}
    for name, number in names.items():
        cell = raw[number] if isinstance(number, int) and 0 <= number < len(raw) else ""
        offsets[name] = cell[: len(cell) - len(cell.lstrip())].count("\n")
    return offsets


def _machinery(filename: str) -> bool:
    return any(part in filename for part in _MACHINERY)


def _frame_line(frame: traceback.FrameSummary, cells: Mapping[str, int]) -> str:
    """``cell line 4, in load_batch`` for cell code, else ``file:line in function``."""
    if frame.filename in cells:
        where = f"cell line {(frame.lineno or 0) + cells[frame.filename]}, in {frame.name}"
    else:
        where = f"{frame.filename}:{frame.lineno} in {frame.name}"
    text = (frame.line or linecache.getline(frame.filename, frame.lineno or 0)).strip()
    return f"{where}: {text}" if text else where


def format_stack(frame: FrameType, cells: Mapping[str, int] | None = None) -> tuple[list[str], str]:
    """(the stack's lines, outermost first; where it is) for one thread's ``frame``.

    With cell frames, the stack starts at the outermost one (what is below it is the
    kernel); ``where`` is the innermost cell frame, else the innermost frame that is not
    the kernel's or the workbench's own (a collective's torch frames are shown, but the
    rank *is* at the cell line that called it)."""
    cells = _cell_files() if cells is None else cells
    frames = traceback.extract_stack(frame)
    first_cell = next((i for i, f in enumerate(frames) if f.filename in cells), None)
    if first_cell is not None:
        shown = frames[first_cell:]
    else:
        outer = next((i for i, f in enumerate(frames) if not _machinery(f.filename)), 0)
        shown = frames[outer:]
    lines = [_frame_line(f, cells) for f in shown]
    in_cell = [f for f in shown if f.filename in cells]
    user = [f for f in shown if not _machinery(f.filename)]
    anchor = in_cell[-1] if in_cell else user[-1] if user else shown[-1] if shown else None
    where = _frame_line(anchor, cells).split(": ", 1)[0] if anchor is not None else "?"
    return lines, where


def stacks(
    frames: Mapping[int, FrameType] | None = None, exclude: int | None = None
) -> dict[str, Any]:
    """Every thread's stack: the main thread's whole (``main``, ``where``), the others
    folded to one line each (``threads``). ``exclude``: the asking thread's own id."""
    frames = sys._current_frames() if frames is None else frames
    cells = _cell_files()
    names = {t.ident: t.name for t in threading.enumerate()}
    main_id = threading.main_thread().ident
    main: list[str] = []
    where = "?"
    threads: list[str] = []
    for ident, frame in frames.items():
        if ident == exclude:
            continue
        if ident == main_id:
            main, where = format_stack(frame, cells)
            continue
        summary = traceback.extract_stack(frame)
        top = summary[-1] if summary else None
        line = _frame_line(top, cells) if top is not None else "?"
        threads.append(f"thread {names.get(ident, ident)!s}: {line}")
    return {"main": main, "where": where, "threads": sorted(threads)}


# ----------------------------------------------------------------------- flight recorder
def flight_entries() -> dict[str, Any] | None:
    """torch's flight-recorder dump (JSON form) of this process, or None where there is
    none (no torch.distributed, or a build without it)."""
    try:
        from torch._C import _distributed_c10d as c10d

        return dict(json.loads(c10d._dump_fr_trace_json()))
    except Exception:
        return None


# ------------------------------------------------------------------------ control thread
def install(ledger: Any = None) -> bool:
    """Register the handler on this engine's kernel (idempotent); False outside one.
    ``ledger``: a callable giving this rank's current ``Ledger`` (or None)."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    kernel = getattr(shell, "kernel", None)
    handlers = getattr(kernel, "control_handlers", None)
    if not isinstance(handlers, dict):
        return False
    handlers[REQUEST] = lambda stream, ident, parent: _answer(kernel, stream, ident, parent, ledger)
    return True


def answer(content: Mapping[str, Any], ledger: Any = None) -> dict[str, Any]:
    """The reply to an autopsy request: stacks always, the flight recorder with ``fr``."""
    from workbench.engine.state import engine_state

    assignment = engine_state().get("assignment") or {}
    reply: dict[str, Any] = {"status": "ok", "pid": os.getpid(), "rank": assignment.get("rank")}
    reply.update(stacks(exclude=threading.get_ident()))
    current = ledger() if callable(ledger) else None
    reply["ledger"] = None if current is None else current.record()
    if content.get("fr"):
        reply["fr"] = flight_entries()
    return reply


def _answer(kernel: Any, stream: Any, ident: Any, parent: Any, ledger: Any) -> None:
    """On the control thread: a reply either way (the kernel waits for one)."""
    try:
        content = answer(parent.get("content") or {}, ledger)
    except Exception as exc:
        content = {"status": "error", "ename": type(exc).__name__, "evalue": str(exc)}
    kernel.session.send(stream, REPLY, content, parent=parent, ident=ident)
