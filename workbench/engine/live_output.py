"""A direct-path cell's output, sent to the kernel while the cell runs.

The final reply still carries the cell's whole stdout/stderr (``direct_cells``); these
progress messages only let the notebook show each rank's output as it is printed. They
are sent by one thread per engine on a PUSH socket of its own, connected to the kernel's
loopback PULL socket (``cluster/dispatch/live_inbox.py``): the cell socket belongs to the kernel's
event loop, which a running cell blocks, and a zmq socket is never shared across threads.

Each message is signed with the cluster's key and carries JSON only (``OUTPUT_TYPE``,
content ``{"name": "stdout" | "stderr", "text": ...}``), with the request as its parent:
the kernel matches it to the cell by request id and drops it once the cell was answered
or given up. The first text of a burst goes at once, the rest at most ``_INTERVAL_S``
apart, at most ``_MAX_CHARS`` per message
(a chatty loop loses the excess live, never in the final reply); a cell that prints
nothing sends nothing.
"""

from __future__ import annotations

import contextlib
import io
import threading
import time
from typing import Any

__all__ = ["MAX_MESSAGE_BYTES", "OUTPUT_TYPE", "LivePusher", "LiveText"]

OUTPUT_TYPE = "wb_cell_output"
_INTERVAL_S = 0.1
_MAX_CHARS = 256 * 1024  # per stream and message; the rest is counted, not sent
# The largest frame a real progress message has: its text JSON-escaped (at most 6 bytes a
# character, ``\u001b``) plus headers. The kernel's inbox drops larger frames unread.
MAX_MESSAGE_BYTES = 6 * _MAX_CHARS + 64 * 1024


class LiveText(io.StringIO):
    """A cell's captured stream that also keeps what was written since the last send."""

    def __init__(self, wake: threading.Event | None = None) -> None:
        super().__init__()
        self._lock = threading.Lock()  # the pump thread of cell_fds writes here too
        self._pending: list[str] = []
        self._size = 0
        self._dropped = 0
        self.wake = wake  # set when text waits to be sent (the sender sleeps until then)

    def write(self, text: str) -> int:
        with self._lock:
            n = super().write(text)
            if text and self.wake is not None and not (self._pending or self._dropped):
                self.wake.set()
            if self._size + len(text) <= _MAX_CHARS:
                self._pending.append(text)
                self._size += len(text)
            else:
                self._dropped += len(text)
        return n

    def take(self) -> str:
        """What was written since the last call (and a note of what was left out)."""
        with self._lock:
            text = "".join(self._pending)
            if self._dropped:
                text += f"\n[{self._dropped} characters not shown live]\n"
            self._pending, self._size, self._dropped = [], 0, 0
        return text


class LivePusher:
    """The engine's sending thread; ``begin``/``end`` bracket one cell."""

    def __init__(self, session: Any, engine_id: int) -> None:
        self.session = session
        self.engine_id = engine_id
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._cell: tuple[int, dict[str, Any], dict[str, LiveText]] | None = None
        threading.Thread(target=self._loop, name="wb-live-output", daemon=True).start()

    def begin(self, port: int, request: dict[str, Any], streams: dict[str, LiveText]) -> None:
        """Send what ``streams`` get written, until ``end``. A cell that prints nothing
        never wakes the thread."""
        with self._lock:
            self._cell = (port, request, streams)
        for stream in streams.values():
            stream.wake = self._wake
            if stream.getvalue():  # written before this (the streams were swapped in first)
                self._wake.set()

    def end(self) -> None:
        with self._lock:
            self._cell = None

    def _loop(self) -> None:
        import zmq

        socket: Any = None
        port_now = None
        while True:
            self._wake.wait()  # text was written (LiveText.write)
            self._wake.clear()
            with self._lock:
                cell = self._cell
            if cell is None:
                continue
            port, request, streams = cell
            if port != port_now:
                if socket is not None:
                    socket.close(linger=0)
                socket = zmq.Context.instance().socket(zmq.PUSH)
                socket.linger = 0
                socket.sndtimeo = 0  # never block the thread: drop instead (zmq.Again)
                socket.sndhwm = 64
                socket.connect(f"tcp://127.0.0.1:{port}")
                port_now = port
            for name, stream in streams.items():
                text = stream.take()
                if text:
                    self._send(socket, request, name, text)
            time.sleep(_INTERVAL_S)  # at most ten messages a second; later text waits

    def _send(self, socket: Any, request: dict[str, Any], name: str, text: str) -> None:
        import zmq

        header = self.session.msg_header(OUTPUT_TYPE)
        header["wb_engine_id"] = self.engine_id  # signed: which engine's output this is
        content = {"name": name, "text": text}
        # zmq.Again: the kernel is not reading; live output is best effort (the final
        # reply has it all)
        with contextlib.suppress(zmq.ZMQError):
            self.session.send(socket, OUTPUT_TYPE, content, parent=request, header=header)
