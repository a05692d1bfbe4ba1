"""The client side of the step machine on the shared 2-rank cluster."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import pytest

from workbench.cluster import Cluster
from workbench.cluster.engine import engine_state
from workbench.cluster.session import TrainingSession
from workbench.errors import ConfigError, RankError
from workbench.parallel import RunSpec
from workbench.trace import CommEvent, MemorySample, Metric, PhaseSpan


@pytest.fixture
def session(cluster: Cluster) -> Iterator[TrainingSession]:
    s = TrainingSession(cluster, RunSpec(model="mlp-tiny", strategy="dp", batch_size=8))
    s.build()
    yield s
    s.close()


def _break_rank1_data() -> None:
    import torch.distributed as dist

    if dist.get_rank() == 1:
        engine_state()["run"].batches = iter(())


def test_phases_advance_in_order_on_every_rank(session: TrainingSession) -> None:
    assert session.phases == ["data", "forward", "backward", "sync", "optimizer"]
    seen = []
    for expected in session.phases:
        assert [s.next_phase for s in session.status] == [expected, expected]
        new = session.phase()
        spans = [e for e in new if isinstance(e, PhaseSpan)]
        assert sorted((e.rank, e.phase) for e in spans) == [(0, expected), (1, expected)]
        seen.append(expected)
    assert [s.step for s in session.status] == [1, 1]
    assert [s.next_phase for s in session.status] == ["data", "data"]
    losses = {s.loss for s in session.status}
    assert len(losses) == 1 and None not in losses  # both ranks report the same global loss


def test_increments_are_new_events_only(session: TrainingSession) -> None:
    first = session.step()
    second = session.step()
    assert session.events == [*session.events[: -len(first) - len(second)], *first, *second]
    assert {e.step for e in second if isinstance(e, PhaseSpan | Metric)} == {1}
    kinds = Counter(type(e).__name__ for e in second)
    assert kinds["PhaseSpan"] == 10 and kinds["Metric"] >= 2
    assert kinds["MemorySample"] >= 10
    # DP with overlap off: gradients are all-reduced in the sync phase
    grads = [e for e in second if isinstance(e, CommEvent) and e.phase == "sync"]
    assert {e.rank for e in grads} == {0, 1}
    mem = [e for e in second if isinstance(e, MemorySample)]
    assert all(m.params > 0 for m in mem)


def test_losses_match_the_single_device_run(session: TrainingSession) -> None:
    session.step(4)
    losses = [
        e.value
        for e in session.events
        if isinstance(e, Metric) and e.rank == 0 and e.name == "loss"
    ]
    reference = session.reference_losses(4)
    assert len(losses) == 4
    assert max(abs(a - b) for a, b in zip(losses, reference, strict=True)) < 1e-5


def test_reset_and_rebuild(session: TrainingSession) -> None:
    session.step(2)
    session.reset()
    assert [s.step for s in session.status] == [0, 0]
    assert not any(isinstance(e, PhaseSpan) for e in session.events)
    session.build(overlap=True)
    assert session.spec.overlap is True
    new = session.step()
    ddp = [e for e in new if isinstance(e, CommEvent) and e.source == "ddp-bucket"]
    assert ddp and {e.phase for e in ddp} == {"backward"}
    with pytest.raises(ConfigError, match="unknown option"):
        session.build(colour="red")
    with pytest.raises(ConfigError, match="strategy='dpp'"):
        session.build(strategy="dpp")
    with pytest.raises(ConfigError, match=r"microbatches=3 .*choose among \[1, 2, 4, 8\]"):
        TrainingSession(session.cluster, RunSpec(strategy="pp", model="mlp-tiny")).build(
            microbatches=3
        )


def test_failure_on_one_rank_is_reported_and_reset_recovers(
    session: TrainingSession, cluster: Cluster
) -> None:
    cluster.run(_break_rank1_data)
    with pytest.raises(RankError, match=r"rank 1 on \S+ failed in phase 'data' of step 0") as info:
        session.phase()
    assert set(info.value.failures) == {1}
    assert "StopIteration" in str(info.value)
    session.reset()
    session.step()
    assert [s.step for s in session.status] == [1, 1]


def test_export_trace(session: TrainingSession, tmp_path: object) -> None:
    import json
    from pathlib import Path

    session.step()
    path = session.export_trace(Path(str(tmp_path)) / "run.json")
    trace = json.loads(path.read_text())
    pids = {e["pid"] for e in trace["traceEvents"] if e.get("ph") == "X"}
    assert len(pids) == 2
