"""The engine's end of the rendezvous check (``workbench.cluster.hosts.rendezvous``): the address
other hosts reach this engine at, rank 0's listening probe, and every rank's connect to it.

These run on engines (shipped by module and function name); the kernel's side, which
sends them and turns a failure into one sentence, stays in the cluster package.
"""

from __future__ import annotations

import os
import socket
from typing import Any

import psutil

from workbench.engine import hosts
from workbench.engine.state import engine_state

__all__ = ["close_probe", "engine_address", "open_probe", "reach"]


def engine_address(probe: str | None, interface: str | None) -> dict[str, Any]:
    """(On an engine.) The address other hosts reach this engine at, and its pid space.

    ``interface`` (the user's choice) wins; otherwise the address of the interface that
    routes to ``probe`` (the controller's address, which every engine reaches); otherwise
    what the hostname resolves to (single-host runs, external clusters).
    """
    if interface:
        address = hosts.interface_address(interface)
    elif probe and not hosts.is_loopback(probe):
        address = hosts.route_source(probe)
    else:
        try:
            address = socket.gethostbyname(socket.gethostname())
        except OSError:
            address = "127.0.0.1"
    return {
        # ipyparallel's nanny, this engine's child: ended by pid on this host at stop
        "nanny_pids": [c.pid for c in psutil.Process().children()],
        "address": address,
        "pid_space": hosts.pid_space(),
        # the launcher's name for this engine's host (ssh: the entry of hosts=...)
        "launch_host": os.environ.get("WB_LAUNCH_HOST", ""),
    }


def open_probe(address: str) -> int:
    """(On rank 0.) Listen on ``address`` until ``close_probe``; returns the port."""
    close_probe()
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind((address, 0))
        s.listen(64)  # the kernel completes the handshakes; nothing needs to accept
    except OSError:
        s.close()
        raise
    engine_state().open_probe(s)
    return int(s.getsockname()[1])


def close_probe() -> None:
    s = engine_state().take_probe()
    if s is not None:
        s.close()


def reach(address: str, port: int, timeout: float) -> str | None:
    """(On a rank.) Connect to rank 0's probe; None when it worked, else the error. Also
    points gloo/NCCL at the interface this rank's own traffic to ``address`` leaves by."""
    try:
        with socket.create_connection((address, port), timeout=timeout):
            pass
    except OSError as exc:
        return f"{type(exc).__name__}: {exc}"
    if not hosts.is_loopback(address):
        hosts.use_interface(hosts.route_source(address))
    return None
