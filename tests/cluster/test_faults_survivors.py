"""With more than two ranks, a killed engine costs only that engine.

4 ranks, DDP, one engine SIGKILLed mid-step: a survivor is left blocked in the all-reduce
(its ring neighbour failed out of the collective, but DDP keeps that neighbour's group and
its connections alive), and recovery must free it instead of killing and replacing it after
``FREE_GRACE_S``. The test starts its own cluster and always stops it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from workbench.cluster import Cluster
from workbench.errors import EngineDied
from workbench.parallel import RunSpec
from workbench.session.training import TrainingSession
from workbench.trace import Metric

pytestmark = pytest.mark.engines

STEPS = 6
VICTIM = 3


def _die_in_forward() -> None:
    """Arm this engine to SIGKILL itself when the next forward phase starts."""
    import os
    import signal

    from workbench.engine.state import engine_state

    def forward(index: int) -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    engine_state()["run"]._forward = forward


def _losses(session: TrainingSession) -> list[float]:
    return [
        e.value
        for e in session.events
        if isinstance(e, Metric) and e.rank == 0 and e.name == "loss"
    ]


@pytest.fixture
def four_ranks() -> Iterator[Cluster]:
    cluster = Cluster(n=4, backend="gloo", init_timeout=60)
    cluster.start_sync()
    try:
        yield cluster
    finally:
        cluster.stop_sync()


def test_a_survivor_blocked_by_the_death_is_freed_not_replaced(
    four_ranks: Cluster, tmp_path: Path
) -> None:
    spec = RunSpec(model="mlp-tiny", strategy="dp", batch_size=8)
    session = TrainingSession(four_ranks, spec, timeout=120)
    session.run(STEPS)
    expected = _losses(session)
    session.close()

    session = TrainingSession(
        four_ranks, spec, timeout=120, checkpoint_dir=tmp_path, checkpoint_every=3
    )
    session.run(3)
    before = [(r.engine_id, r.pid) for r in four_ranks.ranks]
    four_ranks.run(_die_in_forward, ranks=[VICTIM])
    with pytest.raises(EngineDied) as info:
        session.step()
    assert info.value.ranks == [VICTIM]
    # the case this test is about: a survivor still waits in the all-reduce
    assert four_ranks.stuck_ranks, "no survivor was left blocked: the scenario did not occur"
    report = session.recover()
    assert "were stuck" not in report, report
    after = [(r.engine_id, r.pid) for r in four_ranks.ranks]
    replaced = [rank for rank in range(4) if after[rank] != before[rank]]
    assert replaced == [VICTIM], report
    session.run(STEPS - 3)
    losses = _losses(session)
    assert len(losses) == STEPS
    assert max(abs(a - b) for a, b in zip(losses, expected, strict=True)) <= 1e-6
    session.close()
