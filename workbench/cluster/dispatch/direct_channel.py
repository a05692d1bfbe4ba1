"""The kernel's end of the direct cell path (``workbench.engine.direct_cells``).

One DEALER socket per engine that opened its loopback cell socket; a cell sent on it
returns a ``DirectReply``, which waits, reports and fails like the ipyparallel
``AsyncResult`` it stands in for (``ready``, ``wait``, ``get``, ``metadata``), so the
dispatcher's waiting, death detection, timeouts and stuck-rank bookkeeping treat both
paths alike. Replies are matched to requests by message id: a late reply of a cell that
was given up never answers a later one. A cell sent with ``live=True`` also streams what
it prints while it runs (``live_inbox.py``); ``DirectReply.partial`` reads it.
"""

from __future__ import annotations

import threading
from typing import Any

import ipyparallel as ipp
import zmq
from jupyter_client.session import Session

from workbench.cluster.dispatch.live_inbox import LiveInbox, capped, signed_messages
from workbench.engine.direct_cells import (
    MAX_CELL_CHARS,
    REPLY_TYPE,
    REQUEST_TYPE,
    TARGET,
    open_if_same_network,
)
from workbench.engine.hosts import net_space
from workbench.engine.wire import json_session

__all__ = ["DirectCells", "DirectReply"]

# A send that cannot be queued (no pipe to the engine) within this long falls back to
# the controller path; connect() creates the pipe at once, so this is a safety net.
_SEND_TIMEOUT_MS = 1000


def _metadata(content: dict[str, Any]) -> dict[str, Any]:
    """The reply's outputs under the keys of ipyparallel's per-request metadata."""
    return {
        "stdout": content.get("stdout", ""),
        "stderr": content.get("stderr", ""),
        "outputs": list(content.get("outputs") or []),
        "execute_result": content.get("execute_result"),
    }


class DirectReply:
    """One cell's pending reply from one engine."""

    def __init__(self, channel: _Channel, msg_id: str, engine_id: int) -> None:
        self._channel = channel
        self.msg_id = msg_id
        self.engine_id = engine_id
        self._content: dict[str, Any] | None = None
        self.metadata = _metadata({})
        self._live = {"stdout": "", "stderr": ""}  # what arrived while the cell runs

    def add_live(self, name: str, text: str) -> None:
        self._live[name] = capped(self._live[name], text)

    def partial(self) -> tuple[str, str]:
        """(stdout, stderr) that streamed so far (the whole text is in the reply)."""
        return self._live["stdout"], self._live["stderr"]

    def _resolve(self, content: dict[str, Any]) -> None:
        self._content = content
        self.metadata = _metadata(content)

    def ready(self) -> bool:
        if self._content is None:
            self._channel.drain(0)
        return self._content is not None

    def wait(self, timeout: float | None = None) -> bool:
        if self._content is None:
            self._channel.drain(timeout)
        return self._content is not None

    def wait_for_output(self, timeout: float | None = None) -> bool:
        """The outputs travel in the reply: nothing more to wait for."""
        return self.ready()

    def get(self, timeout: float | None = None) -> Any:
        if not self.wait(timeout):
            raise ipp.error.TimeoutError("the cell's reply has not arrived")
        content = self._content or {}
        if content.get("status") == "error":
            raise ipp.error.RemoteError(
                content.get("ename", "Error"),
                content.get("evalue", ""),
                "\n".join(content.get("traceback") or []),
                content.get("engine_info") or {},
            )
        return None


class _Channel:
    """The DEALER socket to one engine's cell socket, and the replies it awaits."""

    def __init__(self, context: zmq.Context, session: Session, port: int, lock: Any) -> None:
        self.session = session
        self.port = port
        self.socket = context.socket(zmq.DEALER)
        self.socket.linger = 0
        self.socket.sndtimeo = _SEND_TIMEOUT_MS
        self.socket.connect(f"tcp://127.0.0.1:{port}")
        self.pending: dict[str, DirectReply] = {}
        self._lock = lock

    def send(
        self, code: str, engine_id: int, live_port: int | None, debug: str | None = None
    ) -> DirectReply | None:
        header = self.session.msg_header(REQUEST_TYPE)
        header[TARGET] = engine_id  # signed: the request runs on this engine only
        content: dict[str, Any] = {"code": code}
        if live_port is not None:
            content["live"] = live_port
        if debug is not None:  # the kernel's debug socket (engine/rank_debug.py)
            content["debug"] = debug
        with self._lock:
            if self.socket.closed:  # stopped meanwhile: the controller path says so
                return None
            try:
                msg = self.session.send(self.socket, REQUEST_TYPE, content, header=header)
            except zmq.Again:
                return None
        reply = DirectReply(self, msg["header"]["msg_id"], engine_id)
        self.pending[reply.msg_id] = reply
        return reply

    def drain(self, timeout: float | None) -> None:
        """Read every reply that arrived (waiting up to ``timeout`` seconds for one)."""
        with self._lock:
            if self.socket.closed:  # the cluster stopped: no reply comes any more; the
                return  # dispatcher waiting for one sees the stop and says so
            ms = None if timeout is None else max(0, int(timeout * 1000))
            if not self.socket.poll(ms):
                return
            for msg in signed_messages(self.socket, self.session):
                self._deliver(msg)

    def _deliver(self, msg: dict[str, Any]) -> None:
        if msg["header"].get("msg_type") != REPLY_TYPE:
            return
        reply = self.pending.pop(msg["parent_header"].get("msg_id", ""), None)
        if reply is not None:  # else the reply of a cell given up and forgotten
            reply._resolve(msg["content"])

    def close(self) -> None:
        with self._lock:
            self.socket.close(linger=0)


class DirectCells:
    """Every engine's direct channel, keyed by engine id (None: that engine has none)."""

    def __init__(self, client: Any) -> None:
        self.client = client  # whose session key signs the messages (the cluster's)
        self.session = json_session(client.session)
        self._context = zmq.Context.instance()
        self._lock = threading.Lock()  # one socket is never used by two threads at once
        self._channels: dict[int, _Channel | None] = {}
        # engine id -> its pending port (open_if_same_network), asked as it registered
        self._port_requests: dict[int, Any] = {}
        self._inbox: LiveInbox | None = None  # opened by the first live cell

    def _pending(self, msg_id: str) -> DirectReply | None:
        for channel in self._channels.values():
            if channel is not None and msg_id in channel.pending:
                return channel.pending[msg_id]
        return None

    def drain_live(self) -> None:
        """Read the progress output that arrived for pending cells (never waits)."""
        if self._inbox is not None:
            with self._lock:
                self._inbox.drain()

    def live_port(self) -> int | None:
        """The loopback port progress output arrives on (None until a live cell)."""
        return None if self._inbox is None else self._inbox.port

    def known(self, engine_id: int) -> bool:
        return engine_id in self._channels

    def ask_port(self, engine_id: int) -> None:
        """Ask the engine to open its cell socket now (it registered); ``add`` the port
        its ``port_request`` answers."""
        self._port_requests[engine_id] = self.client[engine_id].apply_async(
            open_if_same_network, net_space()
        )

    def port_request(self, engine_id: int, view: Any) -> Any:
        """The pending answer with the engine's port: the one asked at registration, else
        asked now through ``view`` (an engine started by a recovery)."""
        future = self._port_requests.pop(engine_id, None)
        if future is None:
            future = view.apply_async(open_if_same_network, net_space())
        return future

    def add(self, engine_id: int, port: int | None) -> None:
        old = self._channels.pop(engine_id, None)
        if old is not None:
            old.close()
        self._channels[engine_id] = (
            None if port is None else _Channel(self._context, self.session, port, self._lock)
        )

    def port(self, engine_id: int) -> int | None:
        """The loopback port of the engine's cell socket (None: it has none)."""
        channel = self._channels.get(engine_id)
        return None if channel is None else channel.port

    def send(
        self, engine_id: int, code: str, *, live: bool = False, debug: str | None = None
    ) -> DirectReply | None:
        """Send ``code``; None when this engine has no direct channel (use the controller).
        With ``live`` the engine also sends what the cell prints while it runs; ``debug``:
        where its pdb prompts go (None: ``breakpoint()`` raises there)."""
        channel = self._channels.get(engine_id)
        if channel is None or len(code) > MAX_CELL_CHARS:  # the engine would drop it unread
            return None
        if live and self._inbox is None:
            with self._lock:
                self._inbox = LiveInbox(self._context, self.session, self._pending)
        port = self._inbox.port if live and self._inbox is not None else None
        return channel.send(code, engine_id, port, debug)

    def keep_only(self, engine_ids: set[int]) -> None:
        """Close the channels of engines that left (replaced, stopped)."""
        for eid in [e for e in self._channels if e not in engine_ids]:
            channel = self._channels.pop(eid)
            if channel is not None:
                channel.close()
        self._port_requests = {e: f for e, f in self._port_requests.items() if e in engine_ids}

    def busy(self) -> set[int]:
        """Engines with a cell sent on their channel and not answered yet (replies that
        arrived since anyone looked are read first: a cell given up may have ended)."""
        channels = [(eid, ch) for eid, ch in self._channels.items() if ch is not None]
        for _, channel in channels:
            if channel.pending:
                channel.drain(0)
        return {eid for eid, ch in channels if ch.pending}

    def close(self) -> None:
        self.keep_only(set())
        if self._inbox is not None:
            with self._lock:
                self._inbox.close()
