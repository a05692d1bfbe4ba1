"""Rendezvous across hosts: a check before the group that every rank reaches rank 0.

``init_process_group`` on an unreachable ``MASTER_ADDR`` fails only after its timeout with
``DistStoreError: wait timeout``. Here rank 0 listens on ``MASTER_ADDR`` and every other rank
connects to it first: a failure names the address, the ranks that could not reach it and
the fix, within seconds. The listening port is then handed to the process group. What runs
on the engines (each one's reachable address, the probe, the connect) is
``workbench.engine.rendezvous_probe``.
"""

from __future__ import annotations

import asyncio
from typing import Any

from workbench.engine import hosts
from workbench.engine.rendezvous_probe import close_probe, open_probe, reach
from workbench.errors import ClusterError

__all__ = ["check_reachable"]


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
