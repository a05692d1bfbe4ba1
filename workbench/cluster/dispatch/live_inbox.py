"""The kernel's end of a direct cell's progress output (``engine/live_output.py``).

One PULL socket, bound to 127.0.0.1 only, opened the first time a cell asks for live
output. Any local process can connect to it, so every message is checked as the cell
socket's replies are: signed with the cluster's key (replays refused by the session),
JSON only, of ``OUTPUT_TYPE``, from the engine the cell was sent to, and answering a
request still waiting (``pending``): a late message of a cell that was answered or given
up is dropped, never shown in a later cell.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import zmq

from workbench.engine.live_output import MAX_MESSAGE_BYTES, OUTPUT_TYPE
from workbench.engine.wire import receiving_socket

__all__ = ["BATCH", "LiveInbox", "capped", "signed_messages"]

_ENGINE = "wb_engine_id"  # the output header's field naming the engine it came from
_MAX_CHARS = 8 * 1024 * 1024  # per cell and stream; the final reply has the whole text
# Messages read per call of ``signed_messages``: a flood (any local process can connect)
# never keeps a reader, and the lock the replies also need, in a loop. A real engine
# sends at most two output messages per 0.1 s, and replies come one per cell.
BATCH = 64
_LIVE_HWM = 16  # queued messages per connection the kernel holds before zmq stops reading


class LiveInbox:
    """Where the engines' progress messages arrive; ``find`` maps a request id to its
    still-pending reply (or None)."""

    def __init__(self, context: zmq.Context, session: Any, find: Callable[[str], Any]) -> None:
        self.session = session
        self._find = find
        self.socket = receiving_socket(context, zmq.PULL, MAX_MESSAGE_BYTES, _LIVE_HWM)
        self.port = self.socket.bind_to_random_port("tcp://127.0.0.1")

    def drain(self) -> None:
        """Deliver what arrived, at most ``BATCH`` messages (never waits: the caller's
        wait loop calls again, so a cell's timeout holds under any flood)."""
        if self.socket.closed:
            return
        for msg in signed_messages(self.socket, self.session):
            self._deliver(msg)

    def _deliver(self, msg: dict[str, Any]) -> None:
        try:
            header, content = msg["header"], msg["content"]
            name, text = content["name"], content["text"]
        except Exception:  # well signed but not an output message's shape
            return
        if header.get("msg_type") != OUTPUT_TYPE or name not in ("stdout", "stderr"):
            return
        if not isinstance(text, str):
            return
        reply = self._find(msg["parent_header"].get("msg_id", ""))
        if reply is None or header.get(_ENGINE) != reply.engine_id:
            return  # a cell already answered or given up, or another engine's claim
        reply.add_live(name, text)

    def close(self) -> None:
        self.socket.close(linger=0)


def signed_messages(socket: zmq.Socket, session: Any) -> Iterator[dict[str, Any]]:
    """The messages waiting on ``socket``, at most ``BATCH`` read (never waits), that are
    signed with ``session``'s key and well formed; anything else (malformed, a replay,
    another key) is dropped: any local process can connect to these loopback sockets."""
    for _ in range(BATCH):
        try:
            frames = socket.recv_multipart(zmq.NOBLOCK)
        except zmq.Again:
            return
        try:
            idents, body = session.feed_identities(frames)
            msg = session.deserialize(body, content=True)
        except Exception:  # malformed or not signed with our key: not from our engine
            continue
        msg["idents"] = idents  # where a ROUTER socket sends its answer (debug_inbox)
        yield msg


def capped(old: str, text: str) -> str:
    """``old + text``, unless that passes the cap (then ``old``: the rest waits for the
    final reply)."""
    return old + text if len(old) + len(text) <= _MAX_CHARS else old
