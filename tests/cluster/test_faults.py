"""Faults with real engines: a killed engine mid-step and mid-save, recovered and resumed to
the same losses and parameters as an uninterrupted run, and with 4 ranks a death that
leaves a survivor blocked costs only the dead engine. Every test that kills an engine
starts its own cluster (never the shared session fixture) and always stops it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from workbench.cluster import Cluster
from workbench.errors import EngineDied
from workbench.parallel import RunSpec
from workbench.session.training import TrainingSession
from workbench.trace import Metric

pytestmark = pytest.mark.engines

STEPS = 6


def _die_in_forward() -> None:
    """Arm this engine to SIGKILL itself when the next forward phase starts."""
    import os
    import signal

    from workbench.engine.state import engine_state

    def forward(index: int) -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    engine_state().run._forward = forward


def _die_while_writing_shards() -> None:
    """Arm this engine to SIGKILL itself in the middle of DCP's shard writes."""
    import os
    import signal

    from torch.distributed.checkpoint import filesystem

    def write_data(self: Any, plan: Any, planner: Any) -> Any:
        os.kill(os.getpid(), signal.SIGKILL)

    filesystem.FileSystemWriter.write_data = write_data  # type: ignore[method-assign]


def _params() -> dict[str, torch.Tensor] | None:
    from workbench.engine.state import engine_state
    from workbench.parallel import full_state_dict

    return full_state_dict(engine_state().run)


def _losses(session: TrainingSession) -> list[float]:
    return [
        e.value
        for e in session.events
        if isinstance(e, Metric) and e.rank == 0 and e.name == "loss"
    ]


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def _uninterrupted(cluster: Cluster, spec: RunSpec) -> tuple[list[float], dict[str, Any]]:
    session = TrainingSession(cluster, spec, timeout=60)
    session.run(STEPS)
    losses, params = _losses(session), cluster.run(_params)[0]
    session.close()
    return losses, params


def test_kill_mid_step_recover_and_resume_equals_uninterrupted(
    own_cluster: Cluster, tmp_path: Path
) -> None:
    for strategy in ("dp", "tp"):
        spec = RunSpec(model="gpt-tiny", strategy=strategy, batch_size=8)
        expected_losses, expected_params = _uninterrupted(own_cluster, spec)
        session = TrainingSession(
            own_cluster,
            spec,
            timeout=60,
            checkpoint_dir=tmp_path / strategy,
            checkpoint_every=3,
        )
        session.run(3)
        assert [m["step"] for m in session.checkpoints()] == [3]
        old_engine = own_cluster.ranks[1].engine_id
        survivor = own_cluster.ranks[0].pid
        own_cluster.run(_die_in_forward, ranks=[1])
        if strategy == "dp":  # by hand: the error, then recover()
            # The step reports the death (it does not wait out the session's 60 s timeout:
            # that would raise CollectiveTimeout instead); how fast lives in benchmarks/.
            with pytest.raises(EngineDied) as info:
                session.step()
            message = str(info.value)
            assert info.value.ranks == [1]
            assert "rank 1 (engine" in message and own_cluster.ranks[1].host in message
            assert "had completed 3 step(s)" in message and "last checkpoint: step 3" in message
            assert own_cluster.state == "degraded"
            report = session.recover()
            assert "rolled back from step 3 to the checkpoint of step 3" in report
            session.run(STEPS - 3)
        else:  # automatically, inside Run N
            assert session.run(STEPS - 3, recover=True) == STEPS - 3
            assert "checkpoint of step 3" in (session.last_recovery or "")
        assert own_cluster.state == "running"
        assert own_cluster.ranks[1].engine_id != old_engine  # replaced, same rank number
        assert own_cluster.ranks[0].pid == survivor  # the survivor kept its engine
        losses = _losses(session)
        assert len(losses) == STEPS
        assert max(abs(a - b) for a, b in zip(losses, expected_losses, strict=True)) <= 1e-6
        assert _max_diff(own_cluster.run(_params)[0], expected_params) <= 1e-6
        session.close()


def test_kill_during_checkpoint_save_keeps_the_previous_one(
    own_cluster: Cluster, tmp_path: Path
) -> None:
    spec = RunSpec(model="mlp-tiny", strategy="dp", batch_size=8, trace=False)
    session = TrainingSession(own_cluster, spec, timeout=60, checkpoint_dir=tmp_path)
    session.run(2)
    session.save()
    session.run(1)
    expected_step3 = _losses(session)[-1]
    own_cluster.run(_die_while_writing_shards, ranks=[1])
    with pytest.raises(EngineDied):
        session.save()
    # the half-written save is not listed; the previous checkpoint still is
    assert [m["step"] for m in session.checkpoints()] == [2]
    report = session.recover()
    assert "rolled back from step 3 to the checkpoint of step 2" in report
    session.run(1)
    assert session.step_index == 3
    assert abs(_losses(session)[-1] - expected_step3) <= 1e-6
    session.close()


def test_a_survivor_blocked_by_the_death_is_freed_not_replaced(
    own_four_ranks: Cluster, tmp_path: Path
) -> None:
    """4 ranks, DDP, rank 3 killed mid-step: a survivor is left blocked in the all-reduce
    (its ring neighbour failed out of the collective, but DDP keeps that neighbour's group
    and connections alive); recovery must free it, not replace it after ``FREE_GRACE_S``."""
    victim = 3
    spec = RunSpec(model="mlp-tiny", strategy="dp", batch_size=8)
    expected, _ = _uninterrupted(own_four_ranks, spec)
    session = TrainingSession(
        own_four_ranks, spec, timeout=60, checkpoint_dir=tmp_path, checkpoint_every=3
    )
    session.run(3)
    before = [(r.engine_id, r.pid) for r in own_four_ranks.ranks]
    own_four_ranks.run(_die_in_forward, ranks=[victim])
    with pytest.raises(EngineDied) as info:
        session.step()
    assert info.value.ranks == [victim]
    # the case this test is about: a survivor still waits in the all-reduce
    assert own_four_ranks.stuck_ranks, "no survivor was left blocked: the case did not occur"
    report = session.recover()
    assert "were stuck" not in report, report
    after = [(r.engine_id, r.pid) for r in own_four_ranks.ranks]
    assert [rank for rank in range(4) if after[rank] != before[rank]] == [victim], report
    session.run(STEPS - 3)
    losses = _losses(session)
    assert max(abs(a - b) for a, b in zip(losses, expected, strict=True)) <= 1e-6
    session.close()


def test_a_failed_load_during_recovery_leaves_nothing_running_after_stop(
    tmp_path: Path,
) -> None:
    """Recovery whose rollback load fails: the load's error, the cluster still stoppable,
    and after stop nothing it started is alive (no engine, no defunct child)."""
    import psutil

    from workbench.errors import CheckpointError

    cluster = Cluster(n=2, backend="gloo")
    try:
        cluster.start_sync()
        spec = RunSpec(model="mlp-tiny", strategy="dp", batch_size=8, trace=False)
        session = TrainingSession(
            cluster, spec, timeout=60, checkpoint_dir=tmp_path, checkpoint_every=2
        )
        session.run(2)
        cluster.run(_die_in_forward, ranks=[1])
        with pytest.raises(EngineDied):
            session.step()
        newest = Path(session.checkpoints()[-1]["path"])
        (newest / "rng" / "rank-00000.pt").write_bytes(b"changed after the save")
        with pytest.raises(CheckpointError, match=r"rng/rank-00000\.pt"):
            session.recover()
        started = cluster.pids()
        children = [
            c.pid for p in started if psutil.pid_exists(p) for c in psutil.Process(p).children(True)
        ]
    finally:
        cluster.stop_sync()
    alive = [
        p
        for p in {*started, *children}
        if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
    ]
    zombies = [c.pid for c in psutil.Process().children() if c.status() == psutil.STATUS_ZOMBIE]
    assert alive == [] and zombies == [], (alive, zombies)
