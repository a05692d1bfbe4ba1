"""Rendezvous across hosts: each engine's reachable address, and a check before the group.

``init_process_group`` on an unreachable ``MASTER_ADDR`` fails only after its timeout with
``DistStoreError: wait timeout``. Here rank 0 listens on ``MASTER_ADDR`` and every other rank
connects to it first: a failure names the address, the ranks that could not reach it and
the fix, within seconds. The listening port is then handed to the process group.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any

from workbench.cluster import hosts
from workbench.errors import ClusterError

__all__ = ["check_reachable", "close_probe", "engine_address", "open_probe", "reach"]

_PROBE_KEY = "rendezvous_probe"


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
    import os

    import psutil

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
    from workbench.engine.state import engine_state

    close_probe()
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind((address, 0))
        s.listen(64)  # the kernel completes the handshakes; nothing needs to accept
    except OSError:
        s.close()
        raise
    engine_state()[_PROBE_KEY] = s
    return int(s.getsockname()[1])


def close_probe() -> None:
    from workbench.engine.state import engine_state

    s = engine_state().pop(_PROBE_KEY, None)
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


def _fix(address: str) -> str:
    if hosts.is_loopback(address):
        why = (
            f"{address} is a loopback address (stock Debian/Ubuntu map the hostname to "
            "127.0.1.1 in /etc/hosts)"
        )
    else:
        why = f"{address} is not reachable from every host (a firewall, or another network)"
    return (
        f"{why}. Fix: name the interface of the network that joins the hosts, e.g. "
        "launcher_options={'network_interface': 'eth0'} (`%wb start --network-interface "
        "eth0`), or map each hostname to its cluster address in /etc/hosts"
    )


async def check_reachable(client: Any, ranks: list[Any], timeout: float = 10.0) -> int:
    """Check that every rank reaches rank 0's ``MASTER_ADDR``; return a free port there."""
    r0 = ranks[0]
    address = r0.master_addr
    others = sorted({r.host for r in ranks} - {r0.host})
    if hosts.is_loopback(address) and others:
        # a loopback address "works" on every host: each would reach only itself
        raise ClusterError(
            f"MASTER_ADDR {address} (rank 0 on {r0.host}) cannot be reached from {others}: "
            + _fix(address)
        )
    try:
        port = await asyncio.wrap_future(client[r0.engine_id].apply_async(open_probe, address))
    except Exception as exc:
        raise ClusterError(
            f"MASTER_ADDR {address} cannot be bound on rank 0's host {r0.host}: {exc}. "
            + _fix(address)
        ) from None
    try:
        errors = await asyncio.gather(
            *(
                asyncio.wrap_future(client[r.engine_id].apply_async(reach, address, port, timeout))
                for r in ranks
            )
        )
    finally:
        await asyncio.wrap_future(client[r0.engine_id].apply_async(close_probe))
    failed = [(r, e) for r, e in zip(ranks, errors, strict=True) if e is not None]
    if failed:
        who = "; ".join(f"rank {r.rank} on {r.host}: {e}" for r, e in failed)
        raise ClusterError(
            f"MASTER_ADDR {address} (rank 0 on {r0.host}) cannot be reached ({who}); "
            + _fix(address)
        )
    return int(port)
