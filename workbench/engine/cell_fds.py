"""C-level output (file descriptors 1 and 2) of a cell, sent where the cell's Python
output goes.

A C extension's ``printf``, ``NCCL_DEBUG=INFO`` or ``os.write(1, ...)`` writes to the
process's file descriptors, not to ``sys.stdout``: on an engine those lead to its log, and
neither cell path (the controller's IOPub, the direct socket's captured text) saw them.

Installed once per engine (``process_group.setup_rank``): fds 1 and 2 are pointed for
good at two pipes, read by one pump thread. While a cell runs (IPython's
``pre_execute``/``post_execute`` events, which both cell paths go through) what arrives
is written to the ``sys.stdout``/``sys.stderr`` the cell had when it began (the direct
path's capture, or ipykernel's stream, which publishes it on IOPub); it is also echoed
to the original descriptors, so the engine's log keeps everything, as before.

The pipes are never closed while the engine lives: a child process that inherited fd 1
(a DataLoader worker) keeps writing after the cell, into the log, instead of failing
with a broken pipe. A spare of each write end is kept: fds 1 and 2 a cell (a script)
closed or redirected are pointed back at the pipes when the next cell begins and ends.
At ``post_execute`` C's stdio buffers are flushed and what is left in
the pipes is read on the cell's own thread, so a cell's C output is complete in its reply.
"""

from __future__ import annotations

import codecs
import contextlib
import ctypes
import faulthandler
import os
import select
import sys
import threading
from typing import Any, TextIO

from workbench.engine.state import engine_state

__all__ = ["flush_c_stdio", "install", "installed"]

_CHUNK = 65536


def install(shell: Any | None = None) -> bool:
    """Capture fds 1 and 2 for every later cell of this engine's shell (idempotent).
    False when there is no IPython shell to hook (the fds are then left alone)."""
    state = engine_state()
    if state.fd_capture is not None:
        return True
    if shell is None:
        from IPython import get_ipython

        shell = get_ipython()
    if shell is None:
        return False
    capture = FdCapture()
    shell.events.register("pre_execute", capture.begin_cell)
    shell.events.register("post_execute", capture.end_cell)
    state.capture_fds(capture)
    return True


def installed() -> bool:
    return engine_state().fd_capture is not None


def _log_fd(fd: int) -> int:
    """Where ``fd`` wrote before anyone captured it: the engine's log. ipykernel's own
    stream (outside pytest) already points fds 1/2 at a pipe it forwards to IOPub, after
    keeping the original in ``_original_stdstream_copy``; echoing into its pipe would
    show every C line twice through the controller, so the echo bypasses it."""
    stream = sys.stdout if fd == 1 else sys.stderr
    copy = getattr(stream, "_original_stdstream_copy", None)
    watched = getattr(stream, "_should_watch", False)
    if watched and getattr(stream, "_original_stdstream_fd", None) == fd and isinstance(copy, int):
        return copy
    return fd


_LIBC: list[Any] = []  # the C library, loaded once (a dlopen per cell costs ~50 us)


def flush_c_stdio() -> None:
    """``fflush(NULL)``: C's stdout is block-buffered when it is not a terminal."""
    with contextlib.suppress(Exception):
        if not _LIBC:
            _LIBC.append(ctypes.CDLL(None))
        _LIBC[0].fflush(None)


class FdCapture:
    """The two pipes behind fds 1 and 2, their pump thread, and the current cell's streams."""

    def __init__(self) -> None:
        for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
            with contextlib.suppress(Exception):
                stream.flush()  # type: ignore[union-attr]
        flush_c_stdio()
        self._lock = threading.Lock()
        self._targets: dict[int, TextIO] = {}  # read end -> the cell's stream (in a cell)
        self._echo: dict[int, int] = {}  # read end -> the original descriptor (the log)
        self._decoders: dict[int, Any] = {}
        # fd -> a spare of the pipe's write end (not inherited): fd 1 or 2 put back from it
        # when a cell closed or redirected it, and the pipe never reads end-of-file.
        self._spares: dict[int, int] = {}
        for fd in (1, 2):
            read_end, write_end = os.pipe()
            self._echo[read_end] = os.dup(_log_fd(fd))
            os.set_blocking(read_end, False)
            os.dup2(write_end, fd)
            self._spares[fd] = write_end
            self._decoders[read_end] = codecs.getincrementaldecoder("utf-8")("replace")
        self._open = set(self._echo)  # read ends not at end-of-file
        self._names = dict(zip(self._echo, ("stdout", "stderr"), strict=True))
        if faulthandler.is_enabled():  # a crash dump must reach the log, not a pipe
            faulthandler.enable(file=self._echo[self._read_end("stderr")], all_threads=True)
        threading.Thread(target=self._pump, name="wb-cell-fds", daemon=True).start()

    def _read_end(self, name: str) -> int:
        return next(fd for fd, n in self._names.items() if n == name)

    def _put_back_fds(self) -> None:
        """Point fds 1 and 2 at the pipes again where the cell (a script) closed them or
        pointed them elsewhere: the next file a cell opens would get fd 1, and C-level
        output would land in it."""
        for fd, spare in self._spares.items():
            try:
                now, ours = os.fstat(fd), os.fstat(spare)
                same = (now.st_dev, now.st_ino) == (ours.st_dev, ours.st_ino)
            except OSError:  # closed
                same = False
            if not same:
                os.dup2(spare, fd)

    def begin_cell(self) -> None:
        flush_c_stdio()  # what C printed before the cell is not this cell's
        self._put_back_fds()
        with self._lock:
            self._drain()
            self._targets = {
                self._read_end("stdout"): sys.stdout,
                self._read_end("stderr"): sys.stderr,
            }

    def end_cell(self) -> None:
        flush_c_stdio()
        self._put_back_fds()
        with self._lock:
            self._drain()
            self._targets = {}

    def _pump(self) -> None:
        while self._open:
            try:
                ready, _, _ = select.select(list(self._open), [], [])
            except InterruptedError:
                continue
            with self._lock:
                for fd in ready:
                    self._read(fd)

    def _drain(self) -> None:
        for fd in self._echo:
            while self._read(fd):
                pass

    def _read(self, fd: int) -> bool:
        """Read one chunk from ``fd`` (non-blocking) and pass it on; False when empty."""
        try:
            data = os.read(fd, _CHUNK)
        except BlockingIOError:
            return False
        if not data:  # end-of-file (no writer left): never selected again, no busy loop
            self._open.discard(fd)
            return False
        with contextlib.suppress(OSError):
            os.write(self._echo[fd], data)
        target = self._targets.get(fd)
        if target is not None:
            text = self._decoders[fd].decode(data)
            with contextlib.suppress(Exception):  # a closed stream must not kill the pump
                target.write(text)
        return True
