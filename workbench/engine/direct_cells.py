"""A ``%%wb`` cell straight from the kernel to a local engine, without the controller hop.

Through ipyparallel a cell travels kernel -> controller -> engine and its reply and every
output back the same way, with a copy of each message for the hub; on a 2-core laptop
that hop is a third of a small cell's round trip. An engine whose network stack is the
kernel's (same machine, same network namespace: ``net_space``) can instead take cells on
a socket of its own, bound to 127.0.0.1 only:

- every message is signed with the cluster's session key (HMAC, as ipyparallel's own
  messages are; replays are refused by the session) and carries JSON only: the cell's
  source in, its outputs and error text out — nothing is unpickled. A request names its
  engine in its signed header (``TARGET``): each engine remembers only the digests it saw,
  so without it a request taken off the wire for one rank would run on any other;
- a malformed message (any local process can connect) is dropped on its own: the
  socket keeps serving the kernel's cells;
- the cell runs through the engine kernel's own ``do_execute``, on its main thread and
  event loop, so it shares the namespace, history, interrupts (SIGINT) and error replies
  of a cell sent through the controller, and is serialised with the controller's work;
- its stdout / stderr, displays and ``Out`` value are captured on the engine and sent in
  the one reply (a ``%%wb`` cell shows its outputs when every rank has finished anyway),
  so the kernel waits for one message per rank instead of a reply plus an output stream;
- when the request asks for it (``live``: the kernel's loopback port for progress; a
  notebook's ``%%wb``), what the cell prints is also sent while it runs, on a socket of
  its own (``live_output.py``), so each rank's output shows as it is printed.

Not in the reply: what travels only on IOPub, the comm messages of a widget the cell
creates; such a cell can run through the controller (``%%wb --via-controller``,
``Cluster.execute(..., direct=False)``). What C code writes to file descriptors 1 and 2
joins the cell's stdout/stderr on both paths (``cell_fds.py``).
"""

from __future__ import annotations

import asyncio
import io
import logging
import sys
from typing import Any

from workbench.engine.await_cells import execute_cell
from workbench.engine.hosts import net_space
from workbench.engine.live_output import LivePusher, LiveText
from workbench.engine.rank_debug import arm_next_cell
from workbench.engine.state import engine_state
from workbench.engine.wire import json_session, receiving_socket

__all__ = [
    "MAX_CELL_CHARS",
    "REPLY_TYPE",
    "REQUEST_TYPE",
    "TARGET",
    "cell_port",
    "open_direct_cells",
    "open_if_same_network",
]

log = logging.getLogger("workbench.engine")

REQUEST_TYPE = "wb_cell_request"
REPLY_TYPE = "wb_cell_reply"
TARGET = "wb_engine_id"  # the request header's field naming the engine it is for
# What a request frame may be: any local process can connect to the cell socket, and zmq
# would otherwise hold any frame it sends in memory. A cell's source longer than
# ``MAX_CELL_CHARS`` (JSON-escaped, at most 6 bytes a character) goes through the
# controller instead (``DirectCells.send``).
MAX_REQUEST_BYTES = 16 * 1024 * 1024
MAX_CELL_CHARS = (MAX_REQUEST_BYTES - 64 * 1024) // 6
_REQUEST_HWM = 8  # queued requests per connection (the kernel sends one cell at a time)


def open_direct_cells() -> int | None:
    """Open this engine's cell socket on 127.0.0.1 and return its port (runs on the
    engine; opened once, later calls return the same port). None when its kernel cannot
    capture outputs: the kernel then keeps sending cells through the controller. Only
    asked of an engine that shares the kernel's network stack (``hosts.net_space``)."""
    state = engine_state()
    if state.cell_server is not None:
        return state.cell_server.port
    kernel = _engine_kernel()
    if kernel is None:
        return None
    server = DirectCellServer(kernel)
    state.serve_cells(server)
    return server.port


def open_if_same_network(kernel_net_space: str | None) -> int | None:
    """Runs on an engine: open its cell socket when its 127.0.0.1 is the kernel's (same
    machine, same network namespace) and return the port; else None. An engine in another
    namespace or on another host never listens for cells."""
    if kernel_net_space is None or kernel_net_space != net_space():
        return None
    return open_direct_cells()


def cell_port() -> int | None:
    """This engine's cell socket port, if it opened one (``group_sockets`` keeps the
    kernel's connection to it when a recovery cuts the group's connections)."""
    server = engine_state().cell_server
    return server.port if server is not None else None


def _engine_kernel() -> Any:
    try:
        from IPython import get_ipython

        shell = get_ipython()
    except Exception:
        return None
    kernel = getattr(shell, "kernel", None)
    hooks = ("register_hook", "unregister_hook")
    needed = (
        "do_execute",
        "pre_handler_hook",
        "post_handler_hook",
        "set_parent",
        "get_parent",
        "engine_id",  # what a request must name (TARGET)
    )
    if kernel is None or not all(hasattr(kernel, name) for name in needed):
        return None
    for publisher in (shell.displayhook, shell.display_pub):  # ipykernel >= 7's capture hooks
        if not all(hasattr(publisher, h) for h in hooks):
            return None
    return kernel


class DirectCellServer:
    """The engine's loopback ROUTER socket, served on the kernel's event loop."""

    def __init__(self, kernel: Any) -> None:
        import zmq
        from zmq.eventloop.zmqstream import ZMQStream

        self.kernel = kernel
        self.session = json_session(kernel.session)
        socket = receiving_socket(
            zmq.Context.instance(), zmq.ROUTER, MAX_REQUEST_BYTES, _REQUEST_HWM
        )
        self.port = socket.bind_to_random_port("tcp://127.0.0.1")
        self.stream = ZMQStream(socket)  # the current (kernel's) event loop: we run on it
        self.stream.on_recv(self._on_recv, copy=True)
        self._busy = asyncio.Lock()
        self._tasks: set[asyncio.Future[None]] = set()  # held: the loop keeps weak references
        self._pusher: LivePusher | None = None  # started at the first cell that asks for it

    def _on_recv(self, frames: list[bytes]) -> None:
        # Anything on 127.0.0.1 can connect and send any frames. Whatever fails here is
        # caught: an exception escaping a ZMQStream callback leaves the stream's poll state
        # unrebuilt, and the socket would never be read again (every later cell hangs).
        try:
            idents, body = self.session.feed_identities(frames, copy=True)
            msg = self.session.deserialize(body, content=True, copy=True)
            header = msg["header"]
            wanted = header.get("msg_type") == REQUEST_TYPE
            ours = header.get(TARGET) == self.kernel.engine_id
        except Exception as exc:  # malformed, a bad signature or a replay: not our kernel's
            log.warning("refused a direct cell message: %s", exc)
            return
        if not wanted:
            return
        if not ours:  # signed, but for another engine: replayed here by someone else
            log.warning("refused a direct cell message for engine %r", header.get(TARGET))
            return
        task = asyncio.ensure_future(self._run(idents, msg))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _live(self, msg: dict[str, Any]) -> tuple[LivePusher, int] | None:
        """The progress sender and the kernel's port, when the request asks for them."""
        port = msg["content"].get("live")
        if not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
            return None
        if self._pusher is None:
            self._pusher = LivePusher(json_session(self.kernel.session), self.kernel.engine_id)
        return self._pusher, port

    async def _run(self, idents: list[bytes], msg: dict[str, Any]) -> None:
        async with self._busy:  # one cell at a time, like the kernel's own shell queue
            try:
                content = await run_captured(self.kernel, idents, msg, self._live(msg))
            except BaseException as exc:  # the kernel waits for one reply whatever happened
                content = {
                    "status": "error",
                    "ename": type(exc).__name__,
                    "evalue": str(exc),
                    "traceback": [f"{type(exc).__name__}: {exc}"],
                }
            self.session.send(self.stream, REPLY_TYPE, content, parent=msg, ident=idents)


async def run_captured(
    kernel: Any,
    idents: list[bytes],
    msg: dict[str, Any],
    live: tuple[LivePusher, int] | None = None,
) -> dict[str, Any]:
    """Run ``msg``'s cell as the engine kernel does (``await_cells.execute_cell``) with
    its outputs captured; the reply content: do_execute's (status, ename, evalue,
    traceback, engine_info) plus stdout, stderr, outputs (display_data contents) and
    execute_result. The socket lives as long as the engine process. With ``live``, the
    captured text is also sent as it is written (``live_output``)."""
    shell = kernel.shell
    code = msg["content"]["code"]
    outputs: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []

    # The messages' contents, as ipyparallel would have collected them from IOPub; the
    # hooks return None, so nothing goes out on IOPub: it is all in the reply.
    def display_hook(out: dict[str, Any]) -> None:
        outputs.append(dict(out["content"]))

    def result_hook(out: dict[str, Any]) -> None:
        results.append(dict(out["content"]))

    old_ident = kernel._parent_ident.get("shell", b"")  # restored: the controller's next
    old_parent = kernel.get_parent("shell")  # request sets its own anyway
    kernel.set_parent(idents, msg, channel="shell")
    for stream in (sys.stdout, sys.stderr):
        stream.flush()  # what earlier work printed goes out as before, not into this cell
    saved = sys.stdout, sys.stderr
    out, err = (LiveText(), LiveText()) if live else (io.StringIO(), io.StringIO())
    shell.display_pub.register_hook(display_hook)
    shell.displayhook.register_hook(result_hook)
    sys.stdout, sys.stderr = out, err
    if live is not None:
        live[0].begin(live[1], msg, {"stdout": out, "stderr": err})  # type: ignore[dict-item]
    debug = msg["content"].get("debug")  # where this cell's pdb prompts go (rank_debug)
    arm_next_cell(debug if isinstance(debug, str) else None)
    kernel.pre_handler_hook()  # SIGINT interrupts the cell (the kernel ignores it in between)
    try:
        reply = await execute_cell(kernel, code)
    finally:
        kernel.post_handler_hook()
        if live is not None:
            live[0].end()
        sys.stdout, sys.stderr = saved
        shell.display_pub.unregister_hook(display_hook)
        shell.displayhook.unregister_hook(result_hook)
        kernel.set_parent(old_ident, old_parent, channel="shell")
    reply.update(
        stdout=out.getvalue(),
        stderr=err.getvalue(),
        outputs=outputs,
        execute_result=results[-1] if results else None,
    )
    return reply
