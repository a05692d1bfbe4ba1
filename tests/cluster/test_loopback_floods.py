"""Any local process can connect to the kernel's live-output socket and to each engine's
cell socket, with no key: what it sends must neither hold a cell past its timeout nor
make the receiving process hold it in memory."""

from __future__ import annotations

import threading
from typing import Any

import psutil
import pytest
import zmq

from workbench.cluster import Cluster
from workbench.cluster.dispatch.live_inbox import BATCH, signed_messages
from workbench.engine.wire import json_session

pytestmark = pytest.mark.engines

_FAKE = [b"<IDS|MSG>", b"0" * 64, b"{}", b"{}", b"{}"]  # signed with no key we know


class _EndlessSocket:
    """A socket that always has one more message waiting (a flood faster than reading)."""

    closed = False

    def __init__(self) -> None:
        self.reads = 0

    def recv_multipart(self, flags: int = 0) -> list[bytes]:
        self.reads += 1
        if self.reads > 100 * BATCH:  # the test fails below instead of hanging
            raise zmq.Again
        return [*_FAKE, b"x" * 1024]


def test_a_reader_takes_a_bounded_batch_from_an_endless_flood() -> None:
    from jupyter_client.session import Session

    socket = _EndlessSocket()
    assert list(signed_messages(socket, json_session(Session(key=b"k")))) == []
    assert socket.reads <= BATCH


def _live_port(cluster: Cluster) -> int:
    cluster.execute("1", on_output=lambda chunks: None)  # the live inbox is open
    port = cluster.dispatch.cells.pool.live_port()
    assert port is not None
    return port


def _send_big_frames(port: int, kind: int, frames: int, big: zmq.Frame) -> bool:
    """Send ``big`` ``frames`` times on one connection (one buffer, zero copy); True
    once the receiver dropped the connection, False when it took them all (in 30 s)."""
    context = zmq.Context.instance()
    sock = context.socket(kind)
    sock.linger = 0
    monitor = sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
    sock.connect(f"tcp://127.0.0.1:{port}")
    try:
        for _ in range(frames):
            sock.send_multipart([*_FAKE, big], copy=False)
        return bool(monitor.poll(30_000))
    finally:
        sock.disable_monitor()
        monitor.close()
        sock.close()


def _rss(pid: int) -> int:
    return int(psutil.Process(pid).memory_info().rss)


_BIG = 64 * 2**20


def test_big_frames_to_the_idle_live_inbox_are_refused_unread(cluster: Cluster) -> None:
    import os

    port = _live_port(cluster)
    big = zmq.Frame(b"\0" * _BIG)  # made before measuring: the sender is this process
    before = _rss(os.getpid())
    dropped = _send_big_frames(port, zmq.PUSH, 4, big)
    grown = _rss(os.getpid()) - before
    assert dropped
    assert grown < _BIG, f"the kernel grew by {grown >> 20} MiB"
    cluster.dispatch.cells.pool.drain_live()
    assert [r.stdout for r in cluster.execute("print('ok')", on_output=lambda c: None)] == [
        "ok\n",
        "ok\n",
    ]


def test_big_frames_to_a_busy_engines_cell_socket_are_refused_unread(cluster: Cluster) -> None:
    cluster.execute("1")
    pid = int(cluster.execute("import os\nprint(os.getpid())", ranks=[0])[0].stdout)
    port = cluster.dispatch.cells.pool.port(cluster.ranks[0].engine_id)
    assert port is not None
    answers: list[Any] = []
    cell = "import time\ntime.sleep(4)\nprint('answered')"
    busy = threading.Thread(
        target=lambda: answers.extend(cluster.execute(cell, ranks=[0], timeout=60))
    )
    busy.start()
    before = _rss(pid)
    dropped = _send_big_frames(port, zmq.DEALER, 4, zmq.Frame(b"\0" * _BIG))
    grown = _rss(pid) - before
    busy.join()
    assert [r.stdout for r in answers] == ["answered\n"]
    assert dropped
    assert grown < _BIG, f"the engine grew by {grown >> 20} MiB"


def test_a_cell_too_long_for_the_cell_socket_goes_through_the_controller(
    cluster: Cluster,
) -> None:
    from workbench.engine.direct_cells import MAX_CELL_CHARS

    cluster.execute("1")
    pool, engine_id = cluster.dispatch.cells.pool, cluster.ranks[0].engine_id
    assert pool.send(engine_id, "x" * (MAX_CELL_CHARS + 1)) is None  # not sent: the controller
    assert pool.port(engine_id) is not None  # while shorter cells still go direct
