"""Back to the last checkpoint after a failure: rebuild the run on every rank and load it,
and say where the run was when it failed (appended to a dead engine's or a hang's error)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from workbench.cluster.state import ClusterState
from workbench.errors import HostLost

if TYPE_CHECKING:
    from workbench.session.training import TrainingSession

__all__ = ["recover_and_roll_back", "roll_back", "where_the_run_was"]


def roll_back(session: TrainingSession) -> str:
    """Rebuild the run on every rank and load the last checkpoint (fresh weights
    without one); says what was rolled back to where."""
    statuses = session.status
    before = max((st.step for st in statuses), default=0)
    first = session.phases[0] if session.phases else "data"
    # Read now: rebuilding below resets every rank's status.
    partial = any(st.next_phase != first for st in statuses)
    session.build_remote(session.spec, keep_events=False)
    available = session.checkpoints() if session.checkpoint_dir is not None else []
    if available:
        meta = session.load()
        to = f"the checkpoint of step {meta['step']}"
        step = int(meta["step"])
    else:
        session.drop_events_from(0)
        to = "step 0 (no checkpoint: fresh weights)"
        step = 0
    lost = max(before - step, 0)
    redone = f"{lost} completed step(s)" + (" and the step in progress" if partial else "")
    return f"rolled back from step {before} to {to}; {redone} will be redone"


def where_the_run_was(session: TrainingSession, error: BaseException | None = None) -> str:
    """Where every rank was and the last checkpoint: the context of a dead engine or a hang
    (``error``). The checkpoints are listed by rank 0 unless it stays blocked in a
    collective (on a lost host's ranks it waits until the group's timeout)."""
    statuses = session.status
    where = ", ".join(f"rank {s.rank} at step {s.step} (next {s.next_phase})" for s in statuses)
    saved = ""
    grace = 0.0 if isinstance(error, HostLost) else 2.0
    if 0 in session.cluster.dispatch.stuck.still_pending(grace):
        saved = "; checkpoints not listed (rank 0 is still blocked in a collective)"
    elif session.checkpoint_dir is not None:
        try:
            found = session.checkpoints()
        except Exception:
            found = None
        if found:
            saved = f"; last checkpoint: step {found[-1]['step']}"
        elif found is not None:
            saved = "; no checkpoint yet"
    return (
        f"The run had completed {session.step_index} step(s) ({where}){saved}. Resume with "
        "`%wb restart` or session.recover(): it rolls back to the last checkpoint."
    )


def recover_and_roll_back(session: TrainingSession, shrink: bool | None = None) -> str:
    """``session.recover()``: recover the cluster when it needs it (dead or stuck engines,
    a process group closed by a failing rank), then roll the run back; says what was done."""
    import time

    from workbench import validate

    cluster = session.cluster
    shrink = session.elastic if shrink is None else validate.boolean("shrink", shrink)
    started = time.perf_counter()
    if shrink and cluster.state == ClusterState.DEGRADED:  # go on with the ranks left
        from workbench.session.elastic_run import shrink_and_roll_back

        message = shrink_and_roll_back(session)
    else:
        cluster_report = ""
        if cluster.state == ClusterState.DEGRADED or cluster.stuck_ranks or cluster.group_closed:
            cluster_report = str(cluster.recover_sync())  # also re-opens the process group
        message = roll_back(session) + (f"; {cluster_report}" if cluster_report else "")
    # the whole way back to training, checkpoint loaded: what a fault's cost counts
    cluster.timings["recover_and_roll_back_s"] = time.perf_counter() - started
    return message
