"""Lose a rank and keep training on the ones left, then grow back, with real engines: a
3-rank run shrinks to 2 ranks after an engine is SIGKILLed mid-step and grows back to 3,
and its losses equal the uninterrupted 3-rank run's within 1e-5, with the same samples in
every step and none skipped or repeated (each rank records the dataset indices it took)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.session.run_faults import die_in_forward, rank0_losses
from workbench.cluster import Cluster
from workbench.engine import train_run
from workbench.errors import EngineDied
from workbench.parallel import RunSpec
from workbench.session.training import TrainingSession

pytestmark = [pytest.mark.engines, pytest.mark.slow]

SPEC = RunSpec(model="gpt-tiny", strategy="dp", batch_size=6)


def _samples(cluster: Cluster, steps: range) -> dict[int, list[int]]:
    """Step -> every rank's dataset indices of that step, sorted (the global batch)."""
    out: dict[int, list[int]] = {s: [] for s in steps}
    for per_rank in cluster.run(train_run.sample_ids):
        for step, ids in per_rank.items():
            if step in out:
                out[step].extend(ids)
    return {s: sorted(ids) for s, ids in out.items()}


@pytest.fixture
def three_ranks() -> Cluster:
    cluster = Cluster(n=3, backend="gloo")
    cluster.start_sync()
    try:
        yield cluster
    finally:
        cluster.stop_sync()


def test_shrink_after_a_kill_and_grow_back_equal_the_uninterrupted_run(
    three_ranks: Cluster, tmp_path: Path
) -> None:
    cluster = three_ranks
    plain = TrainingSession(cluster, SPEC, timeout=120)
    plain.run(9)
    expected, expected_ids = rank0_losses(plain), _samples(cluster, range(9))
    plain.close()

    session = TrainingSession(
        cluster, SPEC, timeout=120, checkpoint_dir=tmp_path, checkpoint_every=3, elastic=True
    )
    session.run(3)
    ids = _samples(cluster, range(3))
    survivors = [r.engine_id for r in cluster.ranks[:2]]
    cluster.run(die_in_forward, ranks=[2])
    with pytest.raises(EngineDied):
        session.step()
    report = session.recover()
    assert "shrunk from 3 to 2 ranks" in report and "global batch 6 kept" in report
    assert "checkpoint of step 3" in report
    assert cluster.world_size == 2 and [r.rank for r in cluster.ranks] == [0, 1]
    assert [r.engine_id for r in cluster.ranks] == survivors
    assert (session.spec.batch_size, session.spec.grad_accum) == (6, 3)
    session.run(3)  # steps 3..5 on 2 ranks, checkpointed at 6
    ids.update(_samples(cluster, range(3, 6)))

    report = session.grow(1)
    assert "grown from 2 to 3 ranks" in report and "checkpoint of step 6" in report
    assert cluster.world_size == 3 and session.spec == SPEC
    session.run(3)
    ids.update(_samples(cluster, range(6, 9)))

    losses = rank0_losses(session)
    assert len(losses) == 9
    assert max(abs(a - b) for a, b in zip(losses, expected, strict=True)) <= 1e-5
    assert ids == expected_ids  # every step took the uninterrupted run's samples
    taken = [i for step in sorted(ids) for i in ids[step]]
    assert len(taken) == len(set(taken)) == 9 * SPEC.batch_size  # none repeated
    session.close()


@pytest.fixture
def four_ranks() -> Cluster:
    cluster = Cluster(n=4, backend="gloo")
    cluster.start_sync()
    try:
        yield cluster
    finally:
        cluster.stop_sync()


def test_dp_tp_loses_a_whole_pair_and_keeps_the_curve(four_ranks: Cluster, tmp_path: Path) -> None:
    """dp=2 x tp=2: rank 3 dies, so its TP partner rank 2 leaves too; the run goes on as
    dp=1 x tp=2 on ranks 0-1 with the global batch kept."""
    cluster = four_ranks
    spec = RunSpec(model="gpt-tiny", strategy="dp_tp", batch_size=4)
    plain = TrainingSession(cluster, spec, timeout=120)
    plain.run(4)
    expected = rank0_losses(plain)
    plain.close()

    session = TrainingSession(
        cluster, spec, timeout=120, checkpoint_dir=tmp_path, checkpoint_every=2, elastic=True
    )
    session.run(2)
    kept = [r.engine_id for r in cluster.ranks[:2]]
    cluster.run(die_in_forward, ranks=[3])
    assert session.run(2, recover=True) == 2  # Run N recovers by itself: a shrink
    assert "shrunk from 4 to 2 ranks" in (session.last_recovery or "")
    assert "ranks [2, 3] dropped" in (session.last_recovery or "")
    assert [r.engine_id for r in cluster.ranks] == kept
    assert (session.spec.batch_size, session.spec.grad_accum) == (4, 2)
    losses = rank0_losses(session)
    assert max(abs(a - b) for a, b in zip(losses, expected, strict=True)) <= 1e-5
    session.close()
