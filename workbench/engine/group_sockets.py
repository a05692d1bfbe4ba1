"""On the engines: cut the process group's TCP connections at the socket itself.

Why: destroying a gloo process group closes its connections only when nothing holds the
group any more, and on torch 2.13 a ``DistributedDataParallel`` model keeps its group alive
in C++ after the model, the run and the group are gone from Python (measured: with DDP,
``destroy_process_group`` + ``gc.collect()`` leaves every gloo connection open, and
``ProcessGroup.shutdown()`` does not close them either). A peer blocked in a collective
with this rank then waits until the group's timeout. ``socket.shutdown(SHUT_RDWR)`` acts on
the connection whoever holds the descriptor: the peer's blocked read ends at once
("Connection closed by peer"), and this rank's own gloo threads see the same error they
see when a peer dies (Python ignores SIGPIPE, so a write to the cut socket is an error,
not a signal). The descriptors themselves stay with their owner; only the connection ends.

Which connections: every TCP connection of this engine process except those it had when it
first joined a group (its connections to the controller, made at boot), any later one to
the same endpoints (a reconnect to the controller), the rendezvous store's (which
``fail_together`` reads after a failure), and those accepted on a port this engine listens
on that no group opened: its direct cell socket (``direct_cells.py``; the kernel's
connection to it carries the next cell's request and reply) and any listener it had before
its first group. So a connection a user's cell opened after the first group was made, to
a server anywhere (the kernel's process too), is cut: what a process group's connection
looks like from here (a TCP connection to some port, made after the group) is all the
engine sees of it. README ("Survive faults") tells users to reopen such connections.
"""

from __future__ import annotations

import os
import socket

from workbench.engine.state import EngineConnections, engine_state

__all__ = ["remember_engine_connections", "sever_group_connections"]


def _inode(fd: int) -> int | None:
    try:
        return os.fstat(fd).st_ino
    except OSError:  # closed since it was listed
        return None


def _tcp_connections() -> list[tuple[int, tuple[str, int], tuple[str, int], str]]:
    """(fd, local, remote, status) of this process's connected TCP sockets."""
    import psutil

    out = []
    for c in psutil.Process().net_connections(kind="tcp"):
        if c.fd is None or c.fd < 0 or not c.raddr or c.status == psutil.CONN_LISTEN:
            continue
        out.append((c.fd, (c.laddr.ip, c.laddr.port), (c.raddr.ip, c.raddr.port), c.status))
    return out


def _listening_ports() -> set[int]:
    import psutil

    conns = psutil.Process().net_connections(kind="tcp")
    return {c.laddr.port for c in conns if c.status == psutil.CONN_LISTEN}


def _kept_listeners(own: EngineConnections) -> set[int]:
    """Ports whose accepted connections are never a group's: the listeners this engine had
    before its first group, and its cell socket (opened later on a replacement engine)."""
    from workbench.engine.direct_cells import cell_port

    port = cell_port()
    return own.listening | ({port} if port is not None else set())


def remember_engine_connections(store_ports: set[int]) -> None:
    """Before the first ``init_process_group`` of this engine: note what is not the group's
    (leaving out connections to ``store_ports``: peers that already reached rank 0's new
    store). Later calls (re-created groups) keep the first record."""
    state = engine_state()
    if state.before_first_group is not None:
        return
    own = EngineConnections()
    for fd, local, remote, _status in _tcp_connections():
        if store_ports & {local[1], remote[1]}:
            continue
        inode = _inode(fd)
        if inode is not None:
            own.inodes.add(inode)
        own.remotes.add(remote)
    own.listening = _listening_ports() - store_ports
    state.remember_connections(own)


def _store_ports() -> set[int]:
    """Ports of the rendezvous store this rank uses or serves (left open: see above)."""
    ports = set()
    if (port := os.environ.get("MASTER_PORT", "")).isdigit():
        ports.add(int(port))
    return ports


def sever_group_connections() -> int:
    """Shut down (both directions) every connection of the process group(s) this engine
    joined; returns how many. Nothing before the first group was joined."""
    own = engine_state().before_first_group
    if own is None:
        return 0
    keep_ports = _store_ports()
    listeners = _kept_listeners(own)
    cut = 0
    for fd, local, remote, _status in _tcp_connections():
        if remote in own.remotes or keep_ports & {local[1], remote[1]} or local[1] in listeners:
            continue
        inode = _inode(fd)
        if inode is None or inode in own.inodes:
            continue
        try:
            dup = os.dup(fd)
        except OSError:
            continue
        # A private duplicate: closing it below leaves the owner's descriptor as it was.
        with socket.socket(fileno=dup) as sock:
            if _inode(dup) != inode:  # the number was reused meanwhile: not ours to cut
                continue
            try:
                sock.shutdown(socket.SHUT_RDWR)
                cut += 1
            except OSError:  # already shut down or reset by the peer
                continue
    return cut
