"""On the engines: what the kernel's autopsy of a hung cell (and ``cluster.stacks()``) asks.

Three pieces, none of which needs the engine's main thread (it may be blocked in a
collective, or busy in the user's code):

- a **handler on the control thread** (``REQUEST``): ipykernel serves the control channel on
  a thread of its own (as ``host_loss`` uses), so the handler reads every thread's
  Python stack (``sys._current_frames()``) and torch's flight recorder
  (``_dump_fr_trace_json()``, ~0.2 ms) while the cell goes on. The request travels the
  channel the cluster already has to every engine (through the controller; a remote
  engine's nanny relays it), so it works for engines on other hosts too;
- the **flight recorder** itself: ``enable_flight_recorder`` sets ``TORCH_FR_BUFFER_SIZE``
  before the process group exists (torch 2.13 records gloo as well as NCCL). Its pickled
  dump (``_dump_fr_trace()``) takes seconds to symbolize here, so the JSON one is sent and
  the kernel writes the file ``fr_trace`` reads;
- the rank's **ledger** of collectives issued (``hang.Ledger``), sent with the stacks.
"""

from __future__ import annotations

import json
import linecache
import os
import sys
import sysconfig
import threading
import traceback
from collections.abc import Mapping
from types import FrameType
from typing import Any

from workbench.engine import hang

__all__ = [
    "FR_BUFFER_SIZE",
    "REPLY",
    "REQUEST",
    "enable_flight_recorder",
    "flight_entries",
    "format_stack",
    "install",
]

REQUEST = "workbench_autopsy_request"
REPLY = "workbench_autopsy_reply"
FR_BUFFER_SIZE = "512"  # entries torch's flight recorder keeps (a ring: the latest ones)

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
    f"{os.sep}workbench{os.sep}",
    "<frozen runpy>",
    f"{os.sep}threading.py",
)


def enable_flight_recorder() -> None:
    """Turn torch's flight recorder on for the process group about to be created (a
    user's own ``TORCH_FR_BUFFER_SIZE``, 0 included, is kept)."""
    os.environ.setdefault("TORCH_FR_BUFFER_SIZE", FR_BUFFER_SIZE)


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


_LIBRARIES = tuple(
    {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")}
)


def _user_file(filename: str) -> bool:
    """The user's own code: a script, a module of theirs (cells are told apart by name):
    not the standard library, an installed package, the kernel or the workbench."""
    return not (filename.startswith(_LIBRARIES) or filename.startswith("<") or _machinery(filename))


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
    kernel); ``where`` is the innermost frame of the user's own code (a cell, a script run
    by ``%wb run``, a module of theirs), else the innermost one that is not the kernel's or
    the workbench's (a collective's torch frames are shown, but the rank *is* at the line
    of the user's that called it)."""
    cells = _cell_files() if cells is None else cells
    frames = traceback.extract_stack(frame)
    first_cell = next((i for i, f in enumerate(frames) if f.filename in cells), None)
    if first_cell is not None:
        shown = frames[first_cell:]
    else:
        outer = next((i for i, f in enumerate(frames) if not _machinery(f.filename)), 0)
        shown = frames[outer:]
    lines = [_frame_line(f, cells) for f in shown]
    user = [f for f in shown if f.filename in cells or _user_file(f.filename)]
    other = [f for f in shown if not _machinery(f.filename)]
    anchor = (user or other or shown or [None])[-1]
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
def install() -> bool:
    """Register the handler on this engine's kernel (idempotent); False outside one."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    kernel = getattr(shell, "kernel", None)
    handlers = getattr(kernel, "control_handlers", None)
    if not isinstance(handlers, dict):
        return False
    handlers[REQUEST] = lambda stream, ident, parent: _answer(kernel, stream, ident, parent)
    return True


def answer(content: Mapping[str, Any]) -> dict[str, Any]:
    """The reply to an autopsy request: stacks always, the flight recorder with ``fr``."""
    from workbench.engine.state import engine_state

    assignment = engine_state().assignment or {}
    reply: dict[str, Any] = {"status": "ok", "pid": os.getpid(), "rank": assignment.get("rank")}
    reply.update(stacks(exclude=threading.get_ident()))
    current = hang.ledger()
    reply["ledger"] = None if current is None else current.record()
    if content.get("fr"):
        reply["fr"] = flight_entries()
    return reply


def _answer(kernel: Any, stream: Any, ident: Any, parent: Any) -> None:
    """On the control thread: a reply either way (the kernel waits for one)."""
    try:
        content = answer(parent.get("content") or {})
    except Exception as exc:
        content = {"status": "error", "ename": type(exc).__name__, "evalue": str(exc)}
    kernel.session.send(stream, REPLY, content, parent=parent, ident=ident)
