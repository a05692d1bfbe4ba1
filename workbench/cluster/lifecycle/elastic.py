"""Fewer or more ranks than the run started with: the decisions, kept free of engines.

- ``decide_loss``: a dead process or a lost host. On a host that still answers, a dead
  engine is a dead process (replace it in place, or drop it when shrinking); when every
  engine of a host is gone *and* the host does not answer a probe, the host is lost and
  nothing can be started there: ``HostLost`` names it and its ranks.
- ``shrunk_ranks`` / ``grown_ranks``: the survivors renumbered contiguously in their old
  order (rank 0 stays rank 0 when it survives), ``WORLD_SIZE`` and the per-host numbering
  (``LOCAL_RANK``, ``GROUP_RANK``) recomputed; new engines join after the last rank.

The training side (``workbench.session.elastic_run``) decides which survivors a layout can
use (whole TP/PP groups only) and how the global batch is kept.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from dataclasses import replace

from workbench.cluster.processes import is_local
from workbench.cluster.ranks import RankAssignment, relocalize
from workbench.errors import HostLost

__all__ = ["PROBE_TIMEOUT_S", "decide_loss", "grown_ranks", "probe_host", "shrunk_ranks"]

# A host that answers answers fast (a SYN in milliseconds); a powered-off one never does.
# Short enough that telling a lost host from a dead process stays inside the 15 s the issue
# allows: after the controller's ~5 s heartbeat window, with 3 s here the bed measured 12.5 s
# on a loaded 2-core machine (tests/multinode/test_spare_host.py).
PROBE_TIMEOUT_S = 2.0


def probe_host(host: str, port: int = 22) -> bool:
    """True when ``host`` is this machine or accepts a TCP connection on ``port`` (sshd):
    a refused connection also proves the host is up (its kernel answered)."""
    if is_local(host):
        return True
    try:
        with socket.create_connection((host, port), timeout=PROBE_TIMEOUT_S):
            return True
    except ConnectionRefusedError:
        return True
    except OSError:
        return False


def decide_loss(
    ranks: list[RankAssignment], dead: list[int], probe: Callable[[str], bool] = probe_host
) -> None:
    """Raise ``HostLost`` for the first host whose engines are all dead and that does not
    answer ``probe``; return None when every loss is a dead process on a live host."""
    dead_set = set(dead)
    by_host: dict[str, list[int]] = {}
    for r in ranks:
        by_host.setdefault(r.host, []).append(r.rank)
    for host, on_host in by_host.items():
        if dead_set.issuperset(on_host) and not probe(host):
            raise HostLost.of(host, sorted(on_host))


def shrunk_ranks(ranks: list[RankAssignment], drop: list[int]) -> list[RankAssignment]:
    """The ranks left after dropping ``drop``, renumbered 0..n-1 in their old order."""
    kept = [r for r in sorted(ranks, key=lambda r: r.rank) if r.rank not in set(drop)]
    if not kept:
        raise HostLost.of("every host", sorted(drop))
    world = len(kept)
    return relocalize([replace(r, rank=i, world_size=world) for i, r in enumerate(kept)])


def grown_ranks(ranks: list[RankAssignment], new: list[RankAssignment]) -> list[RankAssignment]:
    """``ranks`` followed by ``new`` (numbered after them), every rank's world size the sum."""
    world = len(ranks) + len(new)
    ordered = sorted(ranks, key=lambda r: r.rank) + list(new)
    return relocalize([replace(r, rank=i, world_size=world) for i, r in enumerate(ordered)])
