"""The loopback wire between the kernel and its engines, beside ipyparallel's own: the
direct cell socket (``direct_cells``), live output (``live_output``) and pdb's prompts
(``rank_debug``), with their kernel ends in ``cluster/``.

Both ends make their sessions and receiving sockets here, so the rules hold on every path:
each message is signed with the cluster's key and packs JSON only (nothing on these paths
is ever unpickled), and what any connection can make a process hold is bounded.
"""

from __future__ import annotations

from typing import Any

__all__ = ["json_session", "receiving_socket"]


def json_session(cluster_session: Any) -> Any:
    """A session signing with the cluster's key that packs JSON in both directions,
    whatever the cluster's own packer: nothing on this path is ever unpickled."""
    from jupyter_client.session import Session

    return Session(
        key=cluster_session.key,
        signature_scheme=cluster_session.signature_scheme,
        packer="json",
        unpacker="json",
        username="workbench",
    )


def receiving_socket(context: Any, kind: int, max_bytes: int, hwm: int) -> Any:
    """A new zmq socket of ``kind`` (not yet bound: the caps apply to every connection it
    takes), closed without lingering, that bounds what any connection can make this process
    hold: a frame over ``max_bytes`` makes zmq drop the connection unread (``MAXMSGSIZE``),
    and at most ``hwm`` messages per connection wait in its queue (``RCVHWM``: zmq stops
    reading that peer, TCP pushes back)."""
    import zmq

    socket = context.socket(kind)
    socket.linger = 0
    socket.setsockopt(zmq.MAXMSGSIZE, max_bytes)
    socket.rcvhwm = hwm
    return socket
