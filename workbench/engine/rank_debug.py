"""On the engines: pdb on one rank, its prompts answered in the notebook (issue 45).

A rank's main thread is the engine kernel's: while a cell runs, nothing else on the
engine reads a socket, so pdb cannot be driven through the engine's own channels. Instead
``RankPdb`` (a ``pdb.Pdb``) reads and writes ``KernelLine``, a DEALER socket this thread
connects to the kernel's debug socket (``cluster/dispatch/debug_inbox.py``; 127.0.0.1, or the
controller's address for engines on other hosts). Every message is signed with the
cluster's key and carries JSON only, as the direct cell path's do:

- ``open``: may this rank stop? The kernel says no when no one can type (no stdin:
  nbclient, nbval) and the rank raises ``DebuggerUnavailable`` saying how to debug;
- ``prompt``: pdb's output since the last prompt and the prompt itself; the answer is the
  line the person typed;
- ``resume``: pdb's output after a command that lets the rank run on (``c``, ``n``, ``q``):
  nothing to answer.

Where a cell can be debugged is said by the kernel per cell: the direct path's request
carries the address (``arm_next_cell``), a cell through the controller carries it as its
execute request's label (``debug_label``: ipyparallel hands the label to the engine in the
request's metadata, so no extra message travels); ``post_run_cell`` disarms. Code that
was not armed (a function run by ``Cluster.run``, a cell from ``Cluster.execute`` in a
script) raises ``DebuggerUnavailable`` at ``breakpoint()``: never skipped without a word.
``PYTHONBREAKPOINT=0`` on the engines still skips breakpoints, as Python documents.

Post-mortem: the exception of the last cell that failed on this rank (a ``%%wb`` cell or a
``%wb run`` script) is kept until the next cell starts; ``post_mortem`` opens pdb at its
failing frame (``%wb debug``).
"""

from __future__ import annotations

import os
import pdb
import sys
import time
from types import FrameType, TracebackType
from typing import Any

from workbench.errors import DebuggerQuit, DebuggerUnavailable

__all__ = [
    "ANSWER_TYPE",
    "RANK_FIELD",
    "REQUEST_TYPE",
    "EngineDebug",
    "KernelLine",
    "RankPdb",
    "arm_next_cell",
    "debug_label",
    "debug_state",
    "failed_cell",
    "install",
    "post_mortem",
]

REQUEST_TYPE = "wb_debug_request"  # engine -> kernel: content {"kind", "text"}
ANSWER_TYPE = "wb_debug_answer"  # kernel -> engine: {"line": ...} or {"refused": why}
RANK_FIELD = "wb_rank"  # the request header's field naming the rank (signed)
_POLL_MS = 100  # how often a wait for the person's line looks for SIGINT
_LABEL = "wb-debug "  # an execute request's label that carries the kernel's debug address
_CONNECT_S = 10  # a kernel's debug socket that no TCP connection reaches in this long


def _rank() -> int:
    from workbench.engine.state import engine_state

    return engine_state().rank


def _how_to_debug(rank: int, why: str) -> str:
    return (
        f"breakpoint() on rank {rank} cannot stop: {why}. To debug this rank, run the cell "
        "in JupyterLab or Jupyter Notebook with %%wb (or %wb run for a script), where pdb's "
        f"prompts are typed into the notebook, labelled [rank {rank}] (Pdb); or let the cell "
        f"fail and type `%wb debug --rank {rank}` there (post-mortem at the failing frame). "
        "To skip breakpoints, set PYTHONBREAKPOINT=0 in the engines' environment."
    )


class KernelLine:
    """pdb's stdin and stdout: what pdb writes is kept until it reads a line; reading sends
    it with the prompt to the kernel and waits for the line the person typed."""

    def __init__(self, address: str, rank: int) -> None:
        import zmq

        from workbench.engine.wire import json_session

        kernel = _kernel()
        self.session = json_session(kernel.session)
        self.rank = rank
        self.socket = zmq.Context.instance().socket(zmq.DEALER)
        self.socket.linger = 1000  # a last ``resume`` still goes out after close
        # The kernel may be waiting for a person at another rank's prompt, so an answer can
        # take any time; whether its socket is reachable at all is known at once.
        monitor = self.socket.get_monitor_socket(zmq.EVENT_CONNECTED)
        self.socket.connect(address)
        reached = monitor.poll(_CONNECT_S * 1000)
        self.socket.disable_monitor()
        monitor.close(linger=0)
        if not reached:
            self.socket.close(linger=0)
            raise DebuggerUnavailable(
                _how_to_debug(
                    rank,
                    f"the kernel's debug socket at {address} cannot be reached from this "
                    f"host within {_CONNECT_S} s",
                )
            )
        self._out: list[str] = []
        self.interrupted = False

    # pdb's stdout
    def write(self, text: str) -> int:
        self._out.append(text)
        return len(text)

    def flush(self) -> None:
        """Output goes with the next prompt (or ``resume``)."""

    def _taken(self) -> str:
        text, self._out = "".join(self._out), []
        return text

    def _send(self, kind: str, text: str = "") -> None:
        header = self.session.msg_header(REQUEST_TYPE)
        header[RANK_FIELD] = self.rank
        self.session.send(self.socket, REQUEST_TYPE, {"kind": kind, "text": text}, header=header)

    def _answer(self) -> dict[str, Any]:
        """The kernel's answer; SIGINT (the kernel gave up on the cell) interrupts it."""
        import zmq

        while True:
            if self.socket.poll(_POLL_MS, zmq.POLLIN):
                frames = self.socket.recv_multipart()
                try:
                    _, body = self.session.feed_identities(frames)
                    msg = self.session.deserialize(body, content=True)
                except Exception:  # not signed with the cluster's key: not our kernel
                    continue
                if msg["header"].get("msg_type") == ANSWER_TYPE:
                    return dict(msg["content"])

    def open(self) -> str | None:
        """Ask whether this rank may stop; None: yes, else why not."""
        self._send("open")
        answer = self._answer()
        refused = answer.get("refused")
        return None if refused is None else str(refused)

    # pdb's stdin
    def readline(self) -> str:
        prompt_output = self._taken()
        self._send("prompt", prompt_output)
        try:
            answer = self._answer()
        except KeyboardInterrupt:  # the kernel interrupted the cell: leave pdb at once
            self.interrupted = True
            return "q\n"
        if answer.get("refused") is not None:  # stdin went away (the front end closed)
            self.interrupted = True
            return "q\n"
        return str(answer.get("line", "")) + "\n"

    def resume(self) -> None:
        """pdb lets the rank run on: send what it printed since the last prompt."""
        self._send("resume", self._taken())

    def close(self) -> None:
        self.socket.close()


class RankPdb(pdb.Pdb):
    """pdb whose prompt is labelled with the rank and whose ``q`` stops the cell with
    ``DebuggerQuit`` (an interrupt from the kernel: ``KeyboardInterrupt``)."""

    def __init__(self, line: KernelLine) -> None:
        super().__init__(stdin=line, stdout=line, nosigint=True, readrc=False)  # type: ignore[arg-type]
        self.line = line
        self.use_rawinput = False
        self.prompt = f"[rank {line.rank}] (Pdb) "

    def interaction(self, frame: Any, traceback: Any) -> None:
        super().interaction(frame, traceback)
        self.line.resume()  # the command let the rank run on (c, n, s, r, q)

    def trace_dispatch(self, frame: FrameType, event: str, arg: Any) -> Any:
        try:
            return super().trace_dispatch(frame, event, arg)
        except DebuggerQuit:
            raise
        except Exception as exc:  # bdb.BdbQuit: ``q`` at the prompt
            import bdb

            if not isinstance(exc, bdb.BdbQuit):
                raise
            if self.line.interrupted:
                raise KeyboardInterrupt from None
            raise DebuggerQuit(
                f"rank {self.line.rank} stopped at the debugger: `q` was typed at its "
                "(Pdb) prompt, which ends this rank's cell"
            ) from None


class EngineDebug:
    """This engine's debugging state: the cell's kernel address (armed) and the last
    failed cell's exception (kept for ``post_mortem``)."""

    def __init__(self) -> None:
        self.address: str | None = None  # where this cell's prompts go; None: not armed
        self.armed_next: str | None = None  # armed by arm_next_cell for the next cell
        self.failure: BaseException | None = None
        self.failed_at = 0.0  # wall clock when that cell ended: which rank failed first
        self.installed = False  # install() ran: the hooks and cell events are in place
        self.line: KernelLine | None = None  # this cell's connection to the kernel, if opened

    def watch_cells(self, shell: Any) -> None:
        """Follow ``shell``'s cells (once): each cell's failure is kept, and let go when
        the next cell starts."""
        if self.installed:
            return
        shell.events.register("pre_run_cell", self.before_cell)
        shell.events.register("post_run_cell", self.after_cell)
        self.installed = True

    def before_cell(self, info: Any = None) -> None:
        self.failure = None  # a new cell: the old failed frame is let go
        self.address, self.armed_next = self.armed_next or _labelled_address(), None

    def after_cell(self, result: Any) -> None:
        error = getattr(result, "error_in_exec", None)
        debugger_ended = isinstance(error, (DebuggerQuit, DebuggerUnavailable))
        if error is not None and error.__traceback__ is not None and not debugger_ended:
            self.failure, self.failed_at = error, time.time()
        self.address = None
        if self.line is not None:  # every breakpoint of the cell used it; the cell is over
            self.line.close()
            self.line = None

    def stop_here(self, frame: FrameType) -> None:
        """``breakpoint()``: pdb at ``frame`` with the kernel answering, or one clear
        error saying how to debug."""
        rank = _rank()
        if self.address is None:
            raise DebuggerUnavailable(
                _how_to_debug(
                    rank,
                    "this code was not sent by a notebook that answers prompts (a "
                    "Cluster.execute / run_script call from a script, or a function run by "
                    "Cluster.run)",
                )
            )
        if self.line is None:  # the cell's first breakpoint: may this rank stop at all?
            line = KernelLine(self.address, rank)
            why = line.open()
            if why is not None:
                line.close()
                raise DebuggerUnavailable(_how_to_debug(rank, why))
            self.line = line
        RankPdb(self.line).set_trace(frame)


def debug_state() -> EngineDebug:
    """This engine's debugger (the engine state holds it; made on first use)."""
    from workbench.engine.state import engine_state

    state = engine_state()
    if not isinstance(state.debugger, EngineDebug):
        state.debug_with(EngineDebug())
    return state.debugger  # type: ignore[return-value]


def _kernel() -> Any:
    from IPython import get_ipython

    return get_ipython().kernel


def _breakpointhook(*args: Any, **kwargs: Any) -> None:
    if os.environ.get("PYTHONBREAKPOINT") == "0":  # Python's documented off switch
        return
    debug_state().stop_here(sys._getframe(1))


def _set_trace(*, header: str | None = None) -> None:
    if header is not None:
        print(header)
    debug_state().stop_here(sys._getframe(1))


def install() -> None:
    """Runs on an engine (once; later calls do nothing): ``breakpoint()`` and
    ``pdb.set_trace()`` stop through the kernel, and each cell's failure is kept."""
    from IPython import get_ipython

    state = debug_state()
    shell = get_ipython()
    if shell is None or state.installed:
        return
    sys.breakpointhook = _breakpointhook
    pdb.set_trace = _set_trace
    state.watch_cells(shell)


def debug_label(address: str) -> str:
    """The execute request's label that arms a cell sent through the controller."""
    return _LABEL + address


def _labelled_address() -> str | None:
    """The address a controller's execute request carries in its label, if any."""
    try:
        parent = _kernel().get_parent("shell") or {}
    except Exception:  # no kernel (a plain IPython): nothing was sent through the controller
        return None
    label = (parent.get("metadata") or {}).get("label")
    if isinstance(label, str) and label.startswith(_LABEL):
        return label[len(_LABEL) :]
    return None


def arm_next_cell(address: str | None) -> None:
    """Runs on an engine before a direct path's cell: that cell's breakpoints stop with
    the kernel at ``address`` answering (None: they raise ``DebuggerUnavailable``)."""
    install()
    debug_state().armed_next = address


def failed_cell() -> tuple[str, float] | None:
    """Runs on an engine: (``"ValueError: ..."``, when that cell ended: wall clock) when
    this rank's last cell failed and its frame is kept for ``post_mortem``; else None."""
    state = debug_state()
    error = state.failure
    return None if error is None else (f"{type(error).__name__}: {error}", state.failed_at)


def post_mortem(address: str) -> str:
    """Runs on an engine: pdb at the failing frame of this rank's last failed cell, its
    prompts answered by the kernel at ``address``; returns when the person types ``q``
    (or ``c``)."""
    rank = _rank()
    error = debug_state().failure
    if error is None:
        raise DebuggerUnavailable(f"rank {rank}'s last cell did not fail: nothing to debug")
    line = KernelLine(address, rank)
    why = line.open()
    if why is not None:
        line.close()
        raise DebuggerUnavailable(f"%wb debug cannot prompt on rank {rank}: {why}")
    debugger = RankPdb(line)
    debugger.reset()
    tb: TracebackType | None = error.__traceback__
    try:
        debugger.interaction(None, tb)
    finally:
        line.close()
    return f"left the debugger on rank {rank}"
