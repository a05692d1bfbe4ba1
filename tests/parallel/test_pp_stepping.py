"""Stepping a pipeline one schedule action at a time, on the shared 2-rank cluster.

A phase step of a ``pp`` run is one action per rank (``parallel/pp_stepping.py``): the
ranks' rows differ (1F1B: rank 0 runs its second forward while rank 1 already runs its
first backward), gradients appear in the memory samples at the first backward (at the
first backward-weight in a zero-bubble schedule), and the losses equal one device's, also
when a stepped step is finished by Step / Run N. A reset mid-schedule leaves no thread.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from workbench.cluster import Cluster
from workbench.engine.run_slot import current_run
from workbench.trace import MemorySample
from workbench.ui.stepper import Stepper


def _schedule_threads() -> int:
    return sum(t.name == "wb-pipeline-schedule" and t.is_alive() for t in threading.enumerate())


def _schedule_thread_alive() -> bool:
    return bool(current_run().pipeline.gate.active)


def _walk(stepper: Stepper, phases: int) -> list[list[str]]:
    """``phases`` single phase steps; each rank's next phase before each."""
    rows = []
    for _ in range(phases):
        rows.append([s.next_phase for s in stepper.status])
        stepper.phase()
    return rows


def _grads_by_phase(stepper: Stepper, step: int) -> dict[int, list[tuple[str, int]]]:
    out: dict[int, list[tuple[str, int]]] = {0: [], 1: []}
    for e in stepper.events:
        if isinstance(e, MemorySample) and e.step == step and e.label not in ("peak", "start"):
            out[e.rank].append((e.label, e.grads))
    return out


@pytest.fixture(scope="module")
def one_f_one_b(cluster: Cluster) -> Iterator[dict[str, Any]]:
    stepper = Stepper(
        "gpt-tiny",
        "pp",
        schedule="1f1b",
        microbatches=4,
        optimizer="sgd",
        cluster=cluster,
    )
    try:
        stepper.phase()  # builds, runs "data"
        plan = stepper.session.phases
        rows = _walk(stepper, len(plan) - 1)  # the rest of step 0, action by action
        grads = _grads_by_phase(stepper, 0)
        # step 1: two actions, then Step finishes it (the schedule runs to its end), then
        # Run 2 more whole steps: every path adds up to one device's losses
        _walk(stepper, 3)
        stepper.step()
        stepper.run(2)
        out = {
            "rows": rows,
            "grads": grads,
            "ranks_losses": _rank_losses(stepper),
            "reference": stepper.reference_losses(),
            "steps": [s.step for s in stepper.status],
        }
        # a reset mid-schedule: the schedule's thread finishes, nothing is left waiting
        _walk(stepper, 4)
        out["alive_mid"] = cluster.run(_schedule_thread_alive)
        stepper.reset()
        out["threads_after_reset"] = cluster.run(_schedule_threads)
        stepper.step()
        out["after_reset"] = [s.step for s in stepper.status]
        yield out
    finally:
        stepper.close()


def _rank_losses(stepper: Stepper) -> dict[int, list[float]]:
    out: dict[int, list[float]] = {}
    for e in stepper.events:
        if e.kind == "metric" and getattr(e, "name", "") == "loss":
            out.setdefault(e.rank, []).append(e.value)
    return out


def test_a_phase_step_is_one_action_per_rank_in_its_own_order(one_f_one_b: dict) -> None:
    rows = one_f_one_b["rows"]
    actions = [r for r in rows if r[0] not in ("sync", "optimizer")]
    # 1F1B on 2 stages, 4 micro-batches: stage 0 warms up with 2 forwards, stage 1 with 1
    assert [r[0] for r in actions] == [
        "forward[mb=0]",
        "forward[mb=1]",
        "backward[mb=0]",
        "forward[mb=2]",
        "backward[mb=1]",
        "forward[mb=3]",
        "backward[mb=2]",
        "backward[mb=3]",
    ]
    assert [r[1] for r in actions] == [
        f"{k}[mb={i}]" for i in range(4) for k in ("forward", "backward")
    ]
    # the ranks stand at different actions: stage 0 in F1 while stage 1 is in B0
    assert ["forward[mb=1]", "backward[mb=0]"] in rows
    assert rows[-2:] == [["sync", "sync"], ["optimizer", "optimizer"]]


def test_gradients_appear_at_the_first_backward(one_f_one_b: dict) -> None:
    for rank, samples in one_f_one_b["grads"].items():
        labels = [label for label, _ in samples]
        first = next(i for i, (_, g) in enumerate(samples) if g > 0)
        # one memory sample after every action, none with gradients before a backward ran
        assert labels[first] == "backward[mb=0]", (rank, samples)
        assert all(label.startswith(("data", "forward")) for label in labels[:first])
        assert {f"forward[mb={i}]" for i in range(4)} <= set(labels)


def test_stepped_and_run_steps_equal_one_device(one_f_one_b: dict) -> None:
    assert one_f_one_b["steps"] == [4, 4]
    reference = one_f_one_b["reference"][:4]
    for rank, losses in one_f_one_b["ranks_losses"].items():
        assert len(losses) == 4
        diff = max(abs(a - b) for a, b in zip(losses, reference, strict=True))
        print(f"rank {rank}: max |loss - one device| over 4 steps = {diff:.2e}")
        assert diff <= 1e-5


def test_a_reset_mid_schedule_leaves_no_thread(one_f_one_b: dict) -> None:
    assert one_f_one_b["alive_mid"] == [True, True]  # the reset came mid-schedule
    assert one_f_one_b["threads_after_reset"] == [0, 0]
    assert one_f_one_b["after_reset"] == [1, 1]


def test_zero_bubble_steps_split_backwards(cluster: Cluster) -> None:
    """ZB-V: B (input gradient) and W (weight gradient) are actions of their own, and the
    weights' gradients appear at the first W."""
    stepper = Stepper(
        "gpt-small", "pp", schedule="zbv", microbatches=4, optimizer="sgd", cluster=cluster
    )
    try:
        stepper.phase()
        plan = stepper.session.phases
        rows = _walk(stepper, len(plan) - 1)
        names = {n for row in rows for n in row}
        assert "backward_input[mb=0,stage=3]" in names
        assert "backward_weight[mb=0,stage=2]" in names
        assert any(a != b for a, b in rows)
        for rank, samples in _grads_by_phase(stepper, 0).items():
            first = next(label for label, g in samples if g > 0)
            assert first.startswith("backward_weight["), (rank, samples)
        diff = abs(stepper.status[0].loss - stepper.reference_losses()[0])
        assert diff <= 1e-5
    finally:
        stepper.close()
