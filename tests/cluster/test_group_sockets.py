"""``group_sockets``: recovery cuts the process group's connections, and only those.

Run in this process, on loopback connections made here: the ones made before
``remember_engine_connections`` stand for the engine's connections to its controller,
the ones made after for a process group's."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest

from workbench.engine import group_sockets
from workbench.engine.state import engine_state


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[socket.socket]]:
    """A process with no group joined yet; closes the sockets a test opens."""
    monkeypatch.setattr(engine_state(), "before_first_group", None)
    monkeypatch.delenv("MASTER_PORT", raising=False)
    opened: list[socket.socket] = []
    yield opened
    for sock in opened:
        sock.close()


def _pair(opened: list[socket.socket]) -> tuple[socket.socket, socket.socket, int]:
    """A loopback TCP connection (client end, server end) and the listener's port."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port), timeout=10)
    server, _ = listener.accept()
    server.settimeout(10)
    opened += [listener, client, server]
    return client, server, port


def test_nothing_is_cut_before_a_group_was_joined(fresh: list[socket.socket]) -> None:
    client, server, _ = _pair(fresh)
    assert group_sockets.sever_group_connections() == 0
    client.sendall(b"x")
    assert server.recv(1) == b"x"


def test_the_groups_connections_are_cut_and_the_engines_own_kept(
    fresh: list[socket.socket],
) -> None:
    ctl_client, ctl_server, ctl_port = _pair(fresh)  # "the controller", before the group
    group_sockets.remember_engine_connections(set())
    peer_client, peer_server, _ = _pair(fresh)  # "a gloo pair", made by the group
    # a later connection to the controller (a reconnect; the controller is another process,
    # so its end is left in the listener's queue)
    reconnect = socket.create_connection(("127.0.0.1", ctl_port), timeout=10)
    fresh.append(reconnect)
    # both ends of the group's connection live in this process: both are cut
    assert group_sockets.sever_group_connections() == 2
    # the peer's blocked read ends at once: end of stream, not a timeout
    assert peer_server.recv(1) == b""
    with pytest.raises(OSError):
        peer_client.sendall(b"x")
    # the engine's connections to the controller still carry data
    ctl_client.sendall(b"y")
    assert ctl_server.recv(1) == b"y"
    reconnect.sendall(b"w")


def test_the_rendezvous_store_connection_is_kept(
    fresh: list[socket.socket], monkeypatch: pytest.MonkeyPatch
) -> None:
    group_sockets.remember_engine_connections(set())
    client, server, port = _pair(fresh)
    monkeypatch.setenv("MASTER_PORT", str(port))
    assert group_sockets.sever_group_connections() == 0
    client.sendall(b"z")
    assert server.recv(1) == b"z"


def test_connections_to_a_new_store_are_not_taken_for_the_engines_own(
    fresh: list[socket.socket],
) -> None:
    """On rank 0 a peer may reach the new store before rank 0 notes its own connections:
    that connection is left out of the record, so a later one on the same endpoints is
    not protected by it."""
    _client, server, port = _pair(fresh)
    group_sockets.remember_engine_connections({port})
    assert group_sockets.sever_group_connections() == 2
    assert server.recv(1) == b""


def _connected_from_another_process(
    listener: socket.socket, opened: list[socket.socket]
) -> tuple[socket.socket, subprocess.Popen[bytes]]:
    """A connection from a child process (an echo client: the kernel, say) accepted here."""
    port = listener.getsockname()[1]
    child = subprocess.Popen([sys.executable, "-c", _ECHO, str(port)], stdin=subprocess.DEVNULL)
    server, _ = listener.accept()
    server.settimeout(30)
    opened.append(server)
    return server, child


_ECHO = """
import socket, sys
conn = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=60)
while (data := conn.recv(1)):
    conn.sendall(data)
"""


@pytest.mark.engines  # a child process connects to the listener
@pytest.mark.parametrize("when", ["before the first group", "the cell socket, opened later"])
def test_connections_accepted_on_a_listener_no_group_opened_are_kept(
    fresh: list[socket.socket], monkeypatch: pytest.MonkeyPatch, when: str
) -> None:
    from workbench.engine import direct_cells

    if when == "before the first group":
        listener = socket.create_server(("127.0.0.1", 0))
        group_sockets.remember_engine_connections(set())
    else:  # a replacement engine opens its cell socket after its first group
        group_sockets.remember_engine_connections(set())
        listener = socket.create_server(("127.0.0.1", 0))
        port = listener.getsockname()[1]
        monkeypatch.setattr(direct_cells, "cell_port", lambda: port)
    fresh.append(listener)
    server, child = _connected_from_another_process(listener, fresh)
    try:
        assert group_sockets.sever_group_connections() == 0
        server.sendall(b"k")
        assert server.recv(1) == b"k"  # still connected, both ways
    finally:
        child.kill()
        child.wait(30)


@pytest.mark.engines  # a child process connects to the listener
def test_connections_accepted_on_a_listener_opened_since_are_cut(
    fresh: list[socket.socket],
) -> None:
    group_sockets.remember_engine_connections(set())
    listener = socket.create_server(("127.0.0.1", 0))  # as gloo's, made by the group
    fresh.append(listener)
    server, child = _connected_from_another_process(listener, fresh)
    try:
        assert group_sockets.sever_group_connections() == 1
        assert server.recv(1) == b""
    finally:
        child.kill()
        child.wait(30)
