"""``ClusterState``: where a cluster is in its life, and the moves between states it allows.

``Cluster`` is the only writer of its state (``Cluster._set_state``); every move goes through
``checked_move``, so a move the lifecycle does not allow (``broken`` -> ``running`` without a
restart, say) is a ``ClusterError`` naming both states and the allowed ones, not a silent
overwrite. Collaborators (the dispatch, the recovery) read the state through what the cluster
hands them and report what they saw (an engine died: ``Cluster`` degrades itself).

The values are the strings the cluster always showed (``cluster.state``, ``%wb status``,
``repr``): a ``StrEnum`` compares equal to them, so kept clusters and printed outputs read the
same as before.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

from workbench.errors import ClusterError

__all__ = ["ALLOWED", "CURRENT", "LIVE", "ClusterState", "StateLink", "checked_move"]


class ClusterState(StrEnum):
    """``stopped``, ``starting``, ``running``, ``degraded`` (a dead or stuck engine:
    ``recover``), ``broken`` (the controller died: ``restart``), ``stopping``."""

    STOPPED = "stopped"
    STARTING = "starting"
    RUNNING = "running"
    DEGRADED = "degraded"
    BROKEN = "broken"
    STOPPING = "stopping"

    def __repr__(self) -> str:
        # what a notebook shows for `cluster.state` stays what it showed: 'running'
        return repr(self.value)


S = ClusterState
# Work can be sent to its engines (a degraded cluster answers with what was lost).
LIVE = frozenset({S.RUNNING, S.DEGRADED})
# Still the current cluster (``Cluster.latest``): a broken one says what happened when used.
CURRENT = LIVE | {S.BROKEN}

# state -> the states it may move to. Moves to the same state are listed where they happen:
# a recovery of a healthy cluster re-creates its group (running -> running), a second death
# seen while degraded stays degraded.
ALLOWED: dict[ClusterState, frozenset[ClusterState]] = {
    # start; attach a kept cluster (running, or degraded if an engine died meanwhile); the
    # stop of what a failed start left
    S.STOPPED: frozenset({S.STARTING, S.RUNNING, S.DEGRADED, S.STOPPING}),
    S.STARTING: frozenset({S.RUNNING, S.STOPPED}),
    # -> stopped: a detach (the processes run on, no longer this kernel's)
    S.RUNNING: frozenset({S.RUNNING, S.DEGRADED, S.BROKEN, S.STOPPING, S.STOPPED}),
    S.DEGRADED: frozenset({S.RUNNING, S.DEGRADED, S.BROKEN, S.STOPPING, S.STOPPED}),
    # only a stop (or a restart, which stops first) leaves a dead controller behind
    S.BROKEN: frozenset({S.STOPPING, S.STOPPED}),
    S.STOPPING: frozenset({S.STOPPED}),
}


def checked_move(old: ClusterState, new: ClusterState | str) -> ClusterState:
    """``new`` as a ``ClusterState`` when the lifecycle allows ``old`` -> ``new``; else a
    ``ClusterError`` naming both and what ``old`` may move to."""
    try:
        target = ClusterState(new)
    except ValueError:
        choices = ", ".join(s.value for s in ClusterState)
        raise ClusterError(f"unknown cluster state {new!r}; the states are {choices}") from None
    if target not in ALLOWED[old]:
        allowed = ", ".join(s.value for s in ClusterState if s in ALLOWED[old])
        raise ClusterError(
            f"a cluster cannot move from {old.value!r} to {target.value!r}; "
            f"from {old.value!r} it can move to: {allowed}"
        )
    return target


@dataclass(frozen=True)
class StateLink:
    """What ``Cluster`` hands a collaborator about its state: read it, and report back.

    ``last``: the state as last set (cheap: a waiting loop reads it at every poll);
    ``check``: raise the controller's death when it died (marks the cluster ``broken``);
    ``degrade``: an engine died or a rank is stuck (a live cluster becomes ``degraded``).
    """

    last: Callable[[], ClusterState]
    check: Callable[[], None]
    degrade: Callable[[], None]
