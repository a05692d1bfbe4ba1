"""Every pipeline schedule torch ships equals one device, on built-in models and a user model
split at named points; the bubble is measured from the trace beside its formula.

One forked 2-rank gloo launch runs every case (the costly part is the start, not the
steps). SGD: AdamW turns micro-batch summation-order rounding of near-zero gradients into
lr-sized steps (GPipe with 4 micro-batches shows it as much as the new schedules do), so
it would measure Adam, not the schedule.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.harness import run_ranks
from tests.parallel import _user_models as um
from tests.parallel._equivalence import assert_equivalent, compare_cases
from workbench.errors import ConfigError
from workbench.parallel.pp_schedules import (
    SCHEDULES,
    analytic_bubble,
    check_schedule,
    measured_bubble,
    stage_indices,
)
from workbench.parallel.run_spec import RunSpec

STEPS = 4
# ZB-V and DualPipeV need at least 2 micro-batches per stage (pp * 2 stages): 4.
BUILTIN = [
    {"model": m, "strategy": "pp", "schedule": s, "microbatches": 4, "optimizer": "sgd"}
    for m in ("gpt-small", "mlp-small")
    for s in SCHEDULES
]
# TinyLM's units: embed, blocks.0, blocks.1, norm, head -> 2 or 4 stages.
USER_SPLIT = {1: ["blocks.1"], 2: ["blocks.0", "blocks.1", "norm"]}


def _user_cases(rank: int) -> dict[str, Any]:
    from workbench.parallel.build import full_state_dict
    from workbench.parallel.parallelize import Layout
    from workbench.parallel.user_model import (
        UserRun,
        build_user_model,
        build_user_train_step,
        user_reference,
    )

    base = {"model": um.make_model, "data": um.make_data, "loss": um.lm_loss}
    single = UserRun(**base, optimizer=um.sgd, trace=False)
    ref_losses, ref_params = user_reference(single, STEPS)
    start = {n: p.detach().clone() for n, p in build_user_model(single).named_parameters()}
    out = {}
    for schedule in SCHEDULES:
        v = check_schedule(schedule, None, 4, 2)
        run = UserRun(
            **base,
            optimizer=um.sgd,
            layout=Layout(dp=1, pp=2, pp_split=tuple(USER_SPLIT[v])),
            schedule=schedule,
            microbatches=4,
            trace=False,
        )
        step = build_user_train_step(run)
        losses = [step.run_step() for _ in range(STEPS)]
        params = full_state_dict(step)
        if rank == 0:
            assert params is not None and sorted(params) == sorted(ref_params), schedule
            out[f"user/{schedule}"] = {
                "loss": max(abs(a - b) for a, b in zip(losses, ref_losses, strict=True)),
                "param": max(float((params[n] - ref_params[n]).abs().max()) for n in params),
                "moved": max(float((ref_params[n] - start[n]).abs().max()) for n in start),
            }
    return out


def _traced(rank: int, schedule: str) -> list[dict[str, Any]]:
    """Phase spans of 3 traced steps of gpt-small under ``schedule`` (every rank's)."""
    from workbench.parallel import build_train_step
    from workbench.parallel.collectives import gather_objects

    spec = RunSpec(model="gpt-small", strategy="pp", schedule=schedule, microbatches=4)
    step = build_train_step(spec)
    for _ in range(3):
        step.run_step()
    step.close()
    mine = [
        {"kind": "phase", "rank": e.rank, "step": e.step, "phase": e.phase}
        | {"start": e.start, "end": e.end}
        for e in step.recorder.events
        if getattr(e, "kind", "") == "phase"
    ]
    parts = gather_objects(mine, dst=0)
    return [e for part in parts or [] for e in part]


def _all(rank: int, world: int) -> dict[str, Any]:
    out = compare_cases(rank, world, BUILTIN)
    out.update(_user_cases(rank))
    out["traces"] = {s: _traced(rank, s) for s in ("gpipe", "zero_bubble")}
    return out


@pytest.fixture(scope="module")
def results() -> dict[str, Any]:
    return run_ranks(_all, timeout=400)[0]


@pytest.mark.engines
def test_every_schedule_equals_one_device(results: dict[str, Any]) -> None:
    assert_equivalent({k: v for k, v in results.items() if k != "traces"}, 3 * len(SCHEDULES))


@pytest.mark.engines
def test_bubble_is_measured_from_the_trace(results: dict[str, Any]) -> None:
    gpipe = results["traces"]["gpipe"]
    names = {e["phase"] for e in gpipe}
    # every micro-batch's F and B on each rank, as the papers draw them
    assert {f"forward[mb={i}]" for i in range(4)} <= names
    assert {f"backward[mb={i}]" for i in range(4)} <= names
    rows = measured_bubble(gpipe, range(2), analytic_bubble("gpipe", 2, 4, 1))
    for row in rows:
        print(row)
        assert row.analytic == pytest.approx(1 / 5)
        assert row.steps == 2 and 0.0 < row.measured < 1.0
        assert 0 < row.busy_ms < row.span_ms
    zb = {e["phase"] for e in results["traces"]["zero_bubble"]}
    # the split backward: B (input) and W (weight) per micro-batch and virtual stage
    assert "backward_input[mb=0,stage=3]" in zb and "backward_weight[mb=3,stage=0]" in zb
    assert not any(n.startswith("backward[") for n in zb)


def test_analytic_bubbles_follow_the_formulas() -> None:
    assert analytic_bubble("gpipe", 4, 8, 1) == pytest.approx(3 / 11)
    assert analytic_bubble("1f1b", 4, 8, 1) == pytest.approx(3 / 11)
    assert analytic_bubble("interleaved_1f1b", 4, 8, 2) == pytest.approx(3 / 19)
    assert analytic_bubble("zero_bubble", 4, 8, 2) == pytest.approx(3 / 51)
    assert analytic_bubble("zbv", 4, 8, 2) == 0.0
    assert stage_indices("zbv", 0, 2, 2) == [0, 3]
    assert stage_indices("interleaved_1f1b", 1, 2, 2) == [1, 3]


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"schedule": "interleaved_1f1b", "model": "gpt-tiny"}, "n_layers=2"),
        ({"schedule": "zbv", "stages_per_rank": 3, "model": "gpt-small"}, "exactly two"),
        ({"schedule": "gpipe", "stages_per_rank": 2, "model": "gpt-small"}, "one stage per"),
        ({"schedule": "dualpipe_v", "microbatches": 2, "model": "gpt-small"}, "at least 4"),
        ({"schedule": "gpipe", "microbatches": 3, "model": "gpt-small"}, "does not divide"),
    ],
)
def test_impossible_schedules_fail_before_any_rank(kwargs: dict[str, Any], words: str) -> None:
    from workbench.session.training import validate_layout

    with pytest.raises(ConfigError, match=words):
        validate_layout(RunSpec(strategy="pp", **kwargs), 2)
