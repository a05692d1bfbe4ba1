"""``Stepper(elastic=True)``: a lost rank is dropped instead of replaced, the run goes on
with the same global batch, and ``grow`` brings it back — through the stepper, as a
notebook drives it. Losses are compared with an uninterrupted stepper run on the same
cluster (computed here, not written down)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.session.run_faults import die_in_forward, rank0_losses
from workbench.cluster import Cluster
from workbench.errors import EngineDied
from workbench.ui.stepper import Stepper

pytestmark = [pytest.mark.engines, pytest.mark.slow]

OPTIONS = {"model": "gpt-tiny", "strategy": "dp", "batch_size": 4}


@pytest.fixture
def two_ranks() -> Cluster:
    cluster = Cluster(n=2, backend="gloo")
    cluster.start_sync()
    try:
        yield cluster
    finally:
        cluster.stop_sync()


def test_an_elastic_stepper_shrinks_on_recover_and_grows_back(
    two_ranks: Cluster, tmp_path: Path
) -> None:
    cluster = two_ranks
    plain = Stepper(**OPTIONS, cluster=cluster, timeout=120)
    assert plain.elastic is False
    plain.run(6)
    expected = rank0_losses(plain)
    plain.close()

    stepper = Stepper(
        **OPTIONS,
        cluster=cluster,
        timeout=120,
        checkpoint_dir=tmp_path,
        checkpoint_every=2,
        elastic=True,
    )
    assert stepper.elastic is True
    stepper.run(2)
    cluster.run(die_in_forward, ranks=[1])
    with pytest.raises(EngineDied):
        stepper.step()
    report = stepper.recover()  # elastic: the default is a shrink, not a replacement
    assert "shrunk from 2 to 1 ranks" in report and "global batch 4 kept" in report
    assert cluster.world_size == 1
    assert (stepper.spec.batch_size, stepper.spec.grad_accum) == (4, 2)
    stepper.run(2)

    report = stepper.grow(1)
    assert "grown from 1 to 2 ranks" in report
    assert cluster.world_size == 2 and stepper.spec.grad_accum == 1
    stepper.run(2)

    losses = rank0_losses(stepper)
    assert len(losses) == 6
    assert max(abs(a - b) for a, b in zip(losses, expected, strict=True)) <= 1e-5
    assert set(stepper.figures()) == {"memory", "comm", "loss"}  # still drawable
    stepper.close()
