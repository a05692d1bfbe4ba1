"""The client side of the step machine on the shared 2-rank cluster."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator

import pytest

from workbench.cluster import Cluster
from workbench.engine.state import engine_state, user_namespace
from workbench.errors import CheckpointError, ClusterError, ConfigError, RankError
from workbench.parallel import RunSpec
from workbench.session.training import TrainingSession
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
        engine_state().run.batches = iter(())


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


# -- a failure on one rank is agreed on by every rank (issue 12, #6) ---------------------
# Each waits at most `timeout`; without the agreement the healthy rank sat in a collective
# until the process-group timeout (60 s here), reported as CollectiveTimeout, not this.
AGREE_TIMEOUT = 45


def _run_fingerprint() -> tuple[float, int, int]:
    """What a half-done load or step would change on this rank."""
    train_step = engine_state().run
    total = sum(float(p.detach().double().sum()) for p in train_step.model.parameters())
    return total, train_step.step, train_step.data_position


def _fail_rank1_saves(on: bool) -> None:
    import torch.distributed as dist

    from workbench.parallel.checkpoint import save_load as checkpoint

    if dist.get_rank() != 1:
        return
    state = user_namespace()  # the engine's own namespace keeps the real function meanwhile
    if on:

        def full_disk() -> None:
            raise OSError("no space left on device (injected)")

        state["real_rng_state"] = checkpoint.rng_state
        checkpoint.rng_state = full_disk  # type: ignore[assignment]
    elif "real_rng_state" in state:
        checkpoint.rng_state = state.pop("real_rng_state")


@pytest.fixture
def saved(cluster: Cluster, tmp_path: object) -> Iterator[TrainingSession]:
    """A session with a checkpoint of step 1, then at step 2."""
    s = TrainingSession(
        cluster,
        RunSpec(model="mlp-tiny", strategy="dp", batch_size=8),
        timeout=AGREE_TIMEOUT,
        checkpoint_dir=str(tmp_path),
    )
    s.build()
    s.step()
    s.save()
    s.step()
    yield s
    s.close()


def test_rank1_failing_mid_step_stops_every_rank_and_recover_resumes(
    saved: TrainingSession, cluster: Cluster
) -> None:
    cluster.run(_break_rank1_data)
    with pytest.raises(RankError) as info:
        saved.step()  # rank 0 would next wait in the gradient all-reduce
    message = str(info.value)
    assert set(info.value.failures) == {0, 1}
    assert re.search(r"rank 1 on \S+ failed in phase 'data' of step 2", message)
    # Rank 0 is freed by rank 1 dropping its group and names it; or, where something still
    # holds that group, it is reported as waiting for rank 1 (and recover() frees it).
    assert re.search(
        r"rank 0 stopped because rank 1 failed \(rank 1: StopIteration"
        r"|rank 0 still waits \(in a collective\) for rank\(s\) \[1\]",
        message,
    ), message
    with pytest.raises(ClusterError, match="closed the process group on every rank"):
        saved.step()
    report = saved.recover()
    assert "rolled back from step 2 to the checkpoint of step 1" in report
    saved.step(2)
    assert [s.step for s in saved.status] == [3, 3]


def test_rank1_failing_a_load_fails_it_on_every_rank_and_keeps_the_run(
    saved: TrainingSession, cluster: Cluster
) -> None:
    from pathlib import Path

    path = Path(saved.checkpoints()[-1]["path"])
    (path / "rng" / "rank-00001.pt").write_bytes(b"only rank 1 reads this file")
    before = cluster.run(_run_fingerprint)
    with pytest.raises(CheckpointError, match=r"failed on rank 1: rng/rank-00001\.pt") as info:
        saved.load()
    assert info.value.ranks == [1]
    assert "(the run is unchanged)" in str(info.value)
    assert cluster.run(_run_fingerprint) == before
    saved.step()  # the same process group, still usable
    assert [s.step for s in saved.status] == [3, 3]


def test_rank1_failing_a_save_fails_it_on_every_rank(
    saved: TrainingSession, cluster: Cluster
) -> None:
    from pathlib import Path

    cluster.run(_fail_rank1_saves, True)
    try:
        with pytest.raises(CheckpointError, match=r"failed on rank 1: OSError: no space") as info:
            saved.save()
    finally:
        cluster.run(_fail_rank1_saves, False)
    assert info.value.ranks == [1]
    assert [m["step"] for m in saved.checkpoints()] == [1]
    assert not list(Path(str(saved.checkpoint_dir)).glob(".wb-tmp-*"))
    saved.step()
    assert saved.save().endswith("step-00000003")


def test_a_key_made_readable_by_others_is_refused_by_the_same_session(
    saved: TrainingSession,
) -> None:
    """The key file's owner and mode are checked at every use, not once per session."""
    from workbench.parallel.checkpoint.trust import key_path

    key = key_path()
    assert saved.checkpoint_key is None  # the per-user key file, as a user runs it
    key.chmod(0o644)
    try:
        with pytest.raises(CheckpointError, match=r"readable or writable by others \(mode 644\)"):
            saved.load()
        with pytest.raises(CheckpointError, match=r"readable or writable by others"):
            saved.save()
    finally:
        key.chmod(0o600)
    assert saved.load()  # the same session loads again once the key is private
