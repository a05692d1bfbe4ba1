"""On the engines: cut the process group's connections from the control thread, while the
main thread is blocked in a collective.

Why: a peer on a host that went down whole sends nothing more, not even a reset, so a rank
blocked in a gloo collective with it waits until the group's timeout, and nothing reaches
its main thread before that (an interrupt does not end a collective, and every request
queues behind the blocked one). ipykernel runs the control channel on a thread of its own:
a handler there can shut the group's sockets down (``group_sockets``), which fails the
blocked collective at once, as a peer's death would. The kernel asks for it with a
``workbench_sever_request`` on the control channel (the nanny of a remote engine relays
message types it does not know to its engine).
"""

from __future__ import annotations

from typing import Any

from workbench.engine import group_sockets

__all__ = ["REQUEST", "install"]

REQUEST = "workbench_sever_request"


def install() -> bool:
    """Register the handler on this engine's kernel (idempotent); False outside one."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    kernel = getattr(get_ipython(), "kernel", None)
    handlers = getattr(kernel, "control_handlers", None)
    if not isinstance(handlers, dict):
        return False
    handlers[REQUEST] = lambda stream, ident, parent: _sever(kernel, stream, ident, parent)
    return True


def _sever(kernel: Any, stream: Any, ident: Any, parent: Any) -> None:
    """On the control thread: cut the group's connections, reply how many were cut."""
    try:
        content: dict[str, Any] = {
            "status": "ok",
            "severed": group_sockets.sever_group_connections(),
        }
    except Exception as exc:  # a reply either way: the kernel waits for one
        content = {"status": "error", "ename": type(exc).__name__, "evalue": str(exc)}
    kernel.session.send(stream, "workbench_sever_reply", content, parent=parent, ident=ident)
