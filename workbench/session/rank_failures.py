"""When a rank fails part-way through a session's call: what the session says about it.

The waiting itself (a short grace for the failed rank's peers, a dead engine told from a
failed rank) is the cluster's: ``RankDispatch.wait_unless_a_rank_failed``, which
``run_each(..., fail_together=True)`` runs. Here the ``RankError`` it raises is headed by
where each failing rank was, and read for whether the failure closed the process group.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from workbench.errors import CollectiveTimeout, EngineDied, HostLost, RankError
from workbench.session.run_state import RankStatus

if TYPE_CHECKING:
    from workbench.cluster.cluster import Cluster

__all__ = ["closed_group", "error_fields", "rank_failure"]


def error_fields(exc: Exception) -> dict[str, Any]:
    if isinstance(exc, HostLost):  # re-raised with more words: still naming its host
        return {"ranks": exc.ranks, "host": exc.host}
    if isinstance(exc, EngineDied):
        return {"ranks": exc.ranks}
    if isinstance(exc, CollectiveTimeout):
        return {"report": exc.report, "autopsy": exc.autopsy}
    return {}


def closed_group(exc: RankError) -> bool:
    """Whether a rank's failure closed the process group (``fail_together`` raises these
    two on every rank); a plain error on every rank leaves the group as it was."""
    return (
        any("RankFailed" in text or "PeerFailed" in text for text in (exc.failures or {}).values())
        or "RankFailed" in str(exc)
        or "PeerFailed" in str(exc)
    )


def rank_failure(exc: RankError, statuses: dict[int, RankStatus], cluster: Cluster) -> RankError:
    """The ranks' exceptions, headed by where each failing rank was (host, step, phase)."""
    heads = []
    for rank in sorted(exc.failures):
        status = statuses.get(rank, RankStatus(rank=rank))
        host = cluster.ranks[rank].host if rank < cluster.world_size else "?"
        what = "stopped (a peer failed)" if "PeerFailed" in exc.failures[rank] else "failed"
        heads.append(
            f"rank {rank} on {host} {what} in phase {status.next_phase!r} of step {status.step}"
        )
    error = RankError.from_failures(exc.failures)
    error.args = ("; ".join(heads) + "\n" + str(error.args[0]),)
    return error
