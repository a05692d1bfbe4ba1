"""Engines started on named hosts after the start: ``grow(n, hosts=[...])`` (a host back,
or a new one) and a lost host's ranks on a spare (``spare_hosts.py``).

Only the launchers that place engines per host can do it: ``ssh`` (one ssh per host) and
``slurm`` (a job on that node). A named host that does not answer is refused at once
(``elastic.probe_host``), not after ``start_timeout``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from workbench import validate
from workbench.cluster.launch.launchers import engines_per_host
from workbench.cluster.lifecycle.elastic import probe_host
from workbench.config import parse_hosts
from workbench.errors import ClusterError

__all__ = ["PLACING_LAUNCHERS", "check_hosts", "placed", "start_on"]

PLACING_LAUNCHERS = ("ssh", "slurm")


def check_hosts(name: str, hosts: object, launcher: str) -> tuple[str, ...]:
    """``hosts`` as a tuple of names, or a clear error naming the bad value (no engines yet)."""
    found = parse_hosts(name, hosts)
    if not found:
        raise validate.invalid(name, hosts, "no host given", "name one host or more")
    if launcher not in PLACING_LAUNCHERS:
        raise validate.invalid(
            name,
            hosts,
            f"launcher={launcher!r} does not place engines on named hosts",
            "use it with launcher='ssh' or 'slurm', or leave it out",
        )
    return found


def placed(hosts: Sequence[str], count: int) -> dict[str, int]:
    """``count`` engines round-robin over ``hosts``, each of which must answer now."""
    silent = [h for h in dict.fromkeys(hosts) if not probe_host(h)]
    if silent:
        raise ClusterError(
            f"hosts {silent} do not answer (no connection to their sshd); bring them up or "
            "name hosts that answer"
        )
    return engines_per_host(list(hosts), count)


async def start_on(ipp_cluster: Any, per_host: dict[str, int]) -> None:
    """Start ``per_host[h]`` engines on each host ``h`` through the cluster's launcher."""
    await asyncio.gather(
        *(ipp_cluster.start_engines(k, engines={host: k}) for host, k in per_host.items())
    )
