"""session/fault_times.py: the step, save and recovery times a run measured, for the
planner's fault cost (notebook 06's last section runs the same path)."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from workbench.errors import ConfigError, RankError
from workbench.session.fault_times import FaultTimes, fault_times, save_seconds, step_seconds
from workbench.trace import Metric, PhaseSpan


def _span(rank: int, step: int, phase: str, start_s: float, end_s: float) -> PhaseSpan:
    return PhaseSpan(
        rank=rank, step=step, phase=phase, start=int(start_s * 1e9), end=int(end_s * 1e9)
    )


def test_step_time_is_the_median_whole_step_of_rank_0() -> None:
    events = [
        _span(0, 0, "data", 0.0, 0.1),
        _span(0, 0, "optimizer", 0.1, 1.0),  # 1.0 s
        _span(0, 1, "data", 1.0, 1.1),
        _span(0, 1, "optimizer", 1.1, 3.0),  # 2.0 s
        _span(0, 2, "data", 3.0, 3.1),
        _span(0, 2, "optimizer", 3.1, 7.0),  # 4.0 s
        _span(0, 3, "data", 7.0, 9.0),  # a part step: left out
        _span(1, 0, "data", 0.0, 50.0),
        _span(1, 0, "optimizer", 50, 99),  # rank 1: not read
    ]
    assert step_seconds(events) == pytest.approx(2.0)
    assert step_seconds([]) is None


def test_save_time_is_the_slowest_rank_median_over_saves() -> None:
    events = [
        Metric(rank=0, step=2, name="checkpoint_s", value=1.0),
        Metric(rank=1, step=2, name="checkpoint_s", value=3.0),
        Metric(rank=0, step=5, name="checkpoint_s", value=5.0),
        Metric(rank=1, step=5, name="checkpoint_s", value=4.0),
        Metric(rank=0, step=5, name="loss", value=99.0),
    ]
    assert save_seconds(events) == pytest.approx(4.0)  # median of 3 and 5
    assert save_seconds(events[-1:]) is None


def test_missing_measurements_are_named() -> None:
    fake = SimpleNamespace(events=[], cluster=SimpleNamespace(timings={}))
    with pytest.raises(ConfigError, match="a whole step, a checkpoint, a recovery"):
        fault_times(fake, detect_s=0.1)
    with pytest.raises(ConfigError, match="detect_s=-1 is not valid"):
        fault_times(fake, detect_s=-1)


def test_times_feed_the_planner() -> None:
    times = FaultTimes(step_s=0.5, save_s=2.0, detect_s=0.1, recover_s=3.0)
    cost = times.cost(checkpoint_every=20, mtbf_node_h=10.0, nodes=4)
    assert cost.interval_s == 10.0
    assert cost.downtime_s == pytest.approx(0.4 * 3.1)


def _break_rank1_data() -> None:
    import torch.distributed as dist

    from workbench.engine.state import engine_state

    if dist.get_rank() == 1:
        engine_state().run.batches = iter(())


@pytest.mark.engines
def test_a_real_fault_and_recovery_measure_every_time(cluster: object, tmp_path: Path) -> None:
    from workbench.parallel import RunSpec
    from workbench.session.training import TrainingSession

    session = TrainingSession(
        cluster,
        RunSpec(model="mlp-tiny", strategy="dp", batch_size=8),
        timeout=120,
        checkpoint_dir=str(tmp_path),
        checkpoint_every=2,
    )
    try:
        session.run(4)  # checkpoints after steps 2 and 4, timed on each rank
        saves = [e for e in session.events if e.kind == "metric" and e.name == "checkpoint_s"]
        assert sorted((e.step, e.rank) for e in saves) == [(1, 0), (1, 1), (3, 0), (3, 1)]
        assert all(e.value > 0 for e in saves)
        cluster.run(_break_rank1_data)
        started = time.monotonic()
        with pytest.raises(RankError):
            session.step()
        detect = time.monotonic() - started
        session.recover()  # back to the checkpoint of step 4
        times = fault_times(session, detect_s=detect)
        assert times.recover_s == cluster.timings["recover_and_roll_back_s"] > 0
        assert times.save_s == save_seconds(session.events) > 0
        assert times.step_s > 0 and times.detect_s == detect
        assert times.cost(checkpoint_every=2, mtbf_node_h=1.0).total_s > 0
    finally:
        session.close()
