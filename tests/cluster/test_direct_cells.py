"""``%%wb`` cells sent straight to local engines (engine/direct_cells.py): the same results
as through the controller, loopback only, signed, and never confused by a late reply."""

from __future__ import annotations

import contextlib
import random
import re
import socket
from typing import Any

import psutil
import pytest
import zmq
from jupyter_client.session import Session

from workbench.cluster import Cluster
from workbench.cluster.dispatch.results import CellResult
from workbench.engine.direct_cells import REPLY_TYPE, REQUEST_TYPE, TARGET, open_if_same_network
from workbench.engine.hosts import net_space

pytestmark = pytest.mark.engines

CELLS = [
    "print('out', rank)\nimport sys\nprint('err', rank, file=sys.stderr)\nrank * 10",
    "from IPython.display import HTML, display\ndisplay(HTML(f'<b>{rank}</b>'))",
    "import torch, torch.distributed as dist\nt = torch.ones(2) * (rank + 1)\n"
    "dist.all_reduce(t)\nprint(t.tolist())",
    "print('before')\nraise KeyError(f'bad {rank}')",
    "def f(:\n    pass",  # a SyntaxError: the cell never starts
]


def _comparable(result: CellResult) -> CellResult:
    # The two runs differ only in the engine's cell number (In[7], Out[7]).
    if result.traceback is not None:
        result.traceback = re.sub(r"In\[\d+\]", "In[n]", result.traceback)
    if result.execute_result is not None:
        result.execute_result.pop("execution_count")
    return result


@pytest.mark.parametrize("code", CELLS)
def test_direct_cell_results_equal_the_controllers(cluster: Cluster, code: str) -> None:
    direct = cluster.execute(code)
    assert all(
        cluster.dispatch.cells.pool.port(r.engine_id) for r in cluster.ranks
    )  # it was direct
    via_controller = cluster.execute(code, direct=False)
    if direct[0].execute_result is not None:  # one history: the next cell's number
        counts = [r.execute_result["execution_count"] for r in (direct[0], via_controller[0])]
        assert counts[1] == counts[0] + 1
    assert [_comparable(r) for r in direct] == [_comparable(r) for r in via_controller]


def test_outputs_and_failures_are_each_ranks_own(cluster: Cluster) -> None:
    ok, failed = cluster.execute(CELLS[0]), cluster.execute(CELLS[3])
    assert [(r.stdout, r.stderr) for r in ok] == [("out 0\n", "err 0\n"), ("out 1\n", "err 1\n")]
    assert [r.execute_result["data"]["text/plain"] for r in ok] == ["0", "10"]
    assert [r.ename for r in failed] == ["KeyError", "KeyError"]
    assert [r.stdout for r in failed] == ["before\n", "before\n"]
    assert "bad 1" in failed[1].traceback and "bad 0" not in failed[1].traceback


def test_state_is_shared_with_the_controller_path(cluster: Cluster) -> None:
    cluster.execute("shared_value = rank + 100")
    assert cluster.execute("shared_value", direct=False)[1].execute_result["data"] == {
        "text/plain": "101"
    }
    cluster.execute("shared_value += 1", direct=False)
    assert cluster.execute("shared_value")[0].execute_result["data"] == {"text/plain": "101"}


def test_cell_sockets_listen_on_loopback_only(cluster: Cluster) -> None:
    cluster.execute("1")
    for r in cluster.ranks:
        port = cluster.dispatch.cells.pool.port(r.engine_id)
        listening = [
            (c.laddr.ip, c.laddr.port)
            for c in psutil.Process(r.pid).net_connections(kind="inet")
            if c.status == "LISTEN"
        ]
        assert ("127.0.0.1", port) in listening, (port, listening)


def test_engines_elsewhere_open_no_socket(cluster: Cluster) -> None:
    assert cluster.run(open_if_same_network, "another-machine/4026531840") == [None, None]
    assert cluster.run(open_if_same_network, None) == [None, None]
    same = cluster.run(open_if_same_network, net_space())
    assert same == [cluster.dispatch.cells.pool.port(r.engine_id) for r in cluster.ranks]


def test_unsigned_or_foreign_cells_are_refused(cluster: Cluster) -> None:
    cluster.execute("forged = False")
    port = cluster.dispatch.cells.pool.port(cluster.ranks[0].engine_id)
    key = cluster.client.session.key
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.linger = 0
    sock.connect(f"tcp://127.0.0.1:{port}")
    try:
        for session in (Session(key=b"not-the-cluster-key"), Session(key=b"")):
            session.send(sock, REQUEST_TYPE, {"code": "forged = True"})
        assert not sock.poll(1000)  # no reply: the engine dropped them
        signed = Session(key=key, signature_scheme=cluster.client.session.signature_scheme)
        header = signed.msg_header(REQUEST_TYPE)
        header[TARGET] = cluster.ranks[0].engine_id  # the engine it is sent to
        sent = signed.send(sock, REQUEST_TYPE, {"code": "'signed'"}, header=header)
        assert sock.poll(30_000)
        _, body = signed.feed_identities(sock.recv_multipart())
        reply = signed.deserialize(body)
        assert reply["header"]["msg_type"] == REPLY_TYPE
        assert reply["parent_header"]["msg_id"] == sent["header"]["msg_id"]
    finally:
        sock.close()
    assert cluster.execute("forged", ranks=[0])[0].execute_result["data"]["text/plain"] == "False"


def test_a_late_reply_never_answers_a_later_cell(cluster: Cluster) -> None:
    # rank 1 sleeps in Python past the timeout: the dispatcher interrupts it, and its
    # (KeyboardInterrupt) reply must not be taken for the next cell's.
    from workbench.errors import CollectiveTimeout

    with pytest.raises(CollectiveTimeout):
        cluster.execute("import time\nif rank == 1: time.sleep(60)\nrank", timeout=1.0)
    results = cluster.execute("'next', rank")
    assert [r.execute_result["data"]["text/plain"] for r in results] == [
        "('next', 0)",
        "('next', 1)",
    ]
    assert cluster.dispatch.cells.pool.busy() == set()


def test_an_engine_killed_mid_cell_is_reported_and_replaced(own_cluster: Cluster) -> None:
    # A direct cell's reply never comes from a dead engine: the death (seen by the
    # kernel's engine watch) ends the wait, names the rank, and the replacement engine
    # gets a channel of its own.
    from workbench.errors import EngineDied

    own_cluster.execute("1")  # the channels are open
    # Starting and the direct path ran only engine code on the engines: no module of the
    # kernel-side cluster package was loaded there (its engine functions live in engine/).
    # (a cell, not a function of this module: importing it on an engine would load it)
    loaded = own_cluster.execute(
        "import sys\nsorted(m for m in sys.modules if m.startswith('workbench.cluster'))"
    )
    assert [r.execute_result["data"]["text/plain"] for r in loaded] == ["[]"] * 2
    old = own_cluster.ranks[1].engine_id
    with pytest.raises(EngineDied, match=r"rank 1"):
        own_cluster.execute(
            "import os, signal, time\n"
            "if rank == 1: os.kill(os.getpid(), signal.SIGKILL)\n"
            "time.sleep(0.5)",
            timeout=120,
        )
    own_cluster.recover_sync()
    assert own_cluster.ranks[1].engine_id != old
    results = own_cluster.execute(
        "import torch, torch.distributed as dist\nt = torch.ones(1)\ndist.all_reduce(t)\nt.item()"
    )
    assert [r.execute_result["data"]["text/plain"] for r in results] == ["2.0", "2.0"]
    assert own_cluster.dispatch.cells.pool.port(own_cluster.ranks[1].engine_id) is not None
    assert not own_cluster.dispatch.cells.pool.known(old)


def test_status_shows_a_rank_busy_with_a_direct_cell(cluster: Cluster, tmp_path: Any) -> None:
    import threading
    import time

    release = tmp_path / "release"
    cell = (
        "import os, time\nend = time.monotonic() + 60\n"
        f"while not os.path.exists({str(release)!r}) and time.monotonic() < end:\n"
        "    time.sleep(0.01)"
    )
    cluster.execute("1")  # the channels are open
    runner = threading.Thread(target=cluster.execute, args=(cell,), kwargs={"ranks": [1]})
    runner.start()
    try:
        deadline = time.monotonic() + 60
        while not cluster.dispatch.cells.pool.busy() and time.monotonic() < deadline:
            time.sleep(0.01)
        states = {row["rank"]: row["state"] for row in cluster.status()}
        assert states[1] == "busy"
    finally:
        release.touch()
        runner.join(90)
    assert not runner.is_alive()
    assert cluster.dispatch.cells.pool.busy() == set()


AWAITING = "import asyncio\nawait asyncio.sleep(0.01)\nprint('awaited', rank)\nrank + 1"


def test_a_top_level_await_cell_runs_on_the_direct_path(cluster: Cluster) -> None:
    results = cluster.execute(AWAITING, timeout=60)
    assert [(r.ename, r.stdout) for r in results] == [(None, "awaited 0\n"), (None, "awaited 1\n")]
    assert [r.execute_result["data"]["text/plain"] for r in results] == ["1", "2"]
    failed = cluster.execute("import asyncio\nawait asyncio.sleep(0)\nraise KeyError(rank)")
    assert [r.ename for r in failed] == ["KeyError", "KeyError"]
    assert "KeyError" in failed[0].traceback


def test_an_awaiting_cell_is_interrupted_at_the_timeout(cluster: Cluster) -> None:
    from workbench.errors import CollectiveTimeout

    with pytest.raises(CollectiveTimeout, match="were interrupted"):
        cluster.execute("import asyncio\nawait asyncio.sleep(600)", timeout=1.0)
    assert cluster.execute("'free', rank")[1].execute_result["data"]["text/plain"] == "('free', 1)"


def test_a_top_level_await_cell_is_refused_before_the_controller_path(cluster: Cluster) -> None:
    # through the controller the engines' kernel would never answer it (a hang)
    from workbench.errors import ConfigError

    with pytest.raises(ConfigError, match=r"top-level `await`, which ranks \[0, 1\]"):
        cluster.execute(AWAITING, direct=False)
    assert cluster.execute("await_test = 1", direct=False)[0].ok  # others still go


@pytest.mark.parametrize(
    ("code", "awaits"),
    [
        ("await x()", True),
        ("async with lock:\n    pass", True),
        ("async def f():\n    await g()", False),
        ("%time x = 1\nawait y()", True),
        ("print(1)", False),
        ("def broken(:", False),
    ],
)
def test_top_level_await_is_told_from_the_source(code: str, awaits: bool) -> None:
    from workbench.cluster.dispatch.cell_routes import top_level_await

    assert top_level_await(code) is awaits


def _send_frames(port: int, messages: list[list[bytes]]) -> zmq.Socket:
    """A DEALER that sends ``messages`` (each a list of frames) to a cell port and stays
    connected (the caller closes it)."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.linger = 0
    sock.connect(f"tcp://127.0.0.1:{port}")
    for frames in messages:
        sock.send_multipart(frames)
    return sock


def _assert_rank0_answers(cluster: Cluster) -> None:
    # bounded generously: on a loaded machine a healthy cell takes well under a second
    results = cluster.execute("print('ok')", ranks=[0], timeout=60)
    assert [r.stdout for r in results] == ["ok\n"]
    assert cluster.dispatch.cells.pool.port(cluster.ranks[0].engine_id) is not None  # it was direct


@pytest.mark.parametrize(
    "messages",
    [
        [[b"x"], [b"y"]],  # two one-frame messages, no <IDS|MSG> delimiter
        [[b"x", b"y"]],  # one two-frame message, no delimiter
        [[random.Random(seed).randbytes(64) for _ in range(5)] for seed in range(4)],
        [[b"<IDS|MSG>"], [b"<IDS|MSG>", b"sig", b"{", b"", b"", b""]],  # torn after it
        [[b"<IDS|MSG>", b"", b"not json", b"{}", b"{}", b"{}"]],
    ],
    ids=["x-then-y", "x-y", "random-frames", "truncated", "unsigned-garbage"],
)
def test_malformed_frames_leave_the_cell_socket_readable(
    cluster: Cluster, messages: list[list[bytes]]
) -> None:
    cluster.execute("1")  # the channels are open
    port = cluster.dispatch.cells.pool.port(cluster.ranks[0].engine_id)
    assert port is not None
    sock = _send_frames(port, messages)
    try:  # the sender stays connected while the kernel's next cell runs
        assert not sock.poll(500)  # and gets no answer
        _assert_rank0_answers(cluster)
        _assert_rank0_answers(cluster)
    finally:
        sock.close()


def test_random_bytes_over_plain_tcp_leave_the_cell_socket_readable(cluster: Cluster) -> None:
    # Not ZMTP at all: libzmq may read such bytes as ZMTP 1.0 frames and hand them on.
    cluster.execute("1")
    port = cluster.dispatch.cells.pool.port(cluster.ranks[0].engine_id)
    assert port is not None
    connections = []
    try:
        for seed in range(6):
            conn = socket.create_connection(("127.0.0.1", port), timeout=10)
            connections.append(conn)
            with contextlib.suppress(OSError):  # the engine's zmq may close it: fine
                conn.sendall(random.Random(seed).randbytes(4096))
        _assert_rank0_answers(cluster)
    finally:
        for conn in connections:
            conn.close()
    _assert_rank0_answers(cluster)


class _Recorder:
    """Stands in for a channel's socket and keeps a copy of every frame set sent on it:
    what a local process could read off the loopback interface."""

    def __init__(self, socket: zmq.Socket) -> None:
        self.socket = socket
        self.sent: list[list[bytes]] = []

    def send_multipart(self, frames: list[Any], *args: Any, **kwargs: Any) -> Any:
        self.sent.append([bytes(f) for f in frames])
        return self.socket.send_multipart(frames, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.socket, name)


def test_a_cell_signed_for_one_rank_does_not_run_on_another(cluster: Cluster) -> None:
    cluster.execute("1")  # the channels are open
    channel = cluster.dispatch.cells.pool._channels[cluster.ranks[0].engine_id]
    recorder = _Recorder(channel.socket)
    channel.socket = recorder  # type: ignore[assignment]
    try:
        first = cluster.execute("hits = globals().get('hits', 0) + 1\nhits", ranks=[0])
    finally:
        channel.socket = recorder.socket
    assert first[0].execute_result["data"]["text/plain"] == "1"
    [frames] = recorder.sent
    port1 = cluster.dispatch.cells.pool.port(cluster.ranks[1].engine_id)
    assert port1 is not None
    sock = _send_frames(port1, [frames])  # replayed, byte for byte, to rank 1's cell port
    try:
        assert not sock.poll(3000)  # no reply: rank 1 dropped it
    finally:
        sock.close()
    # it did not run there either (a later cell on rank 1 runs after anything queued)
    counts = cluster.execute("globals().get('hits', 0)")
    assert [r.execute_result["data"]["text/plain"] for r in counts] == ["1", "0"]
