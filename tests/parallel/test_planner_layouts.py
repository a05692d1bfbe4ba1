"""The planner against the tracer for every built-in strategy at 2 and 4 ranks, and for a
user's model under every layout: model state per category to the byte on every rank,
activations within 10% (issue 32: the planner models the layouts the workbench builds).

Each rank runs the real strategy for two traced steps; the plan is ``strategy_plan`` /
``run_plan`` with the model module, i.e. the placement derived from the same Layout, TP plan
and split points that ``parallelize`` applied. Losses are not compared (the equivalence
tests do that), so nothing here depends on seeds or loss values.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch
from torch import nn

from tests.harness import run_ranks
from tests.parallel import _user_models as um
from workbench.parallel.parallelize import PRESET_LAYOUTS, Layout
from workbench.parallel.planning.run_plan import run_plan, strategy_plan
from workbench.parallel.planning.spec_from_model import planner_optimizer, user_model_spec
from workbench.parallel.run_spec import STRATEGIES, RunSpec
from workbench.planner import validate

pytestmark = pytest.mark.engines

STEPS = 2
STATE = ("weights", "grads", "optimizer", "model state")
# Every strategy at both sizes, except 'single' at 4: one device whatever the world size
# (RunSpec.dims), so its 4-rank run would repeat the 2-rank one. gpt-tiny has 2 blocks: a
# 4-stage pipeline runs gpt-small (4 blocks). dp_tp on 2 ranks is tp=2 on a dp=1 mesh.
# Expert parallel needs experts: its case runs the mixture-of-experts preset.
_MODEL: dict[str, dict[str, str]] = {s: {"model": "moe-tiny"} for s in ("ep", "dp_ep")}
CASES: dict[int, list[dict[str, Any]]] = {
    2: [{"strategy": s, **_MODEL.get(s, {})} for s in STRATEGIES]
    + [{"strategy": "pp", "schedule": "1f1b", "microbatches": 4}],
    4: [{"strategy": s, **_MODEL.get(s, {})} for s in STRATEGIES if s not in ("single", "pp")]
    + [{"strategy": "pp", "model": "gpt-small"}],
}


def _key(case: dict[str, Any]) -> str:
    return json.dumps(case, sort_keys=True)


def _traced(rank: int, world: int, cases: list[dict[str, Any]]) -> dict[str, Any]:
    from workbench.parallel import build_train_step

    out = {}
    for case in cases:
        step = build_train_step(RunSpec(**{"model": "gpt-tiny", **case}))
        for _ in range(STEPS):
            step.run_step()
        for tracer in (step.memory_tracer, step.comm_tracer):
            tracer.stop()
        out[_key(case)] = step.recorder.to_records()
    return out


@pytest.fixture(scope="module", params=[2, 4], ids=["2 ranks", "4 ranks"])
def runs(request: pytest.FixtureRequest) -> tuple[int, list[dict[str, Any]]]:
    world = request.param
    return world, run_ranks(_traced, CASES[world], world_size=world, timeout=900)


def _reports(world: int, per_rank: list[dict[str, Any]]):
    for case in CASES[world]:
        spec = RunSpec(**{"model": "gpt-tiny", **case})
        plan = strategy_plan(spec, world)
        for rank in range(world):
            # A single-device run records itself as rank 0 on every process.
            seen = 0 if spec.strategy == "single" else rank
            yield spec, rank, validate(per_rank[rank][_key(case)], plan, rank=seen)


def test_every_builtin_strategy_is_in_the_cases() -> None:
    assert (
        {c["strategy"] for c in CASES[2]} == set(STRATEGIES) == set(PRESET_LAYOUTS) | {"megatron"}
    )
    assert {c["strategy"] for c in CASES[4]} == set(STRATEGIES) - {"single"}
    assert RunSpec(model="gpt-tiny", strategy="single").dims(4).world_size == 1


def test_model_state_is_the_tracers_to_the_byte(runs) -> None:
    world, per_rank = runs
    for spec, rank, report in _reports(world, per_rank):
        for category in STATE:
            row = report.row(category)
            assert row.measured == row.predicted, f"{spec.strategy} rank {rank}: {row}"
            assert row.measured > 0, f"{spec.strategy} rank {rank} {category}"


def test_activations_within_ten_percent(runs) -> None:
    world, per_rank = runs
    for spec, rank, report in _reports(world, per_rank):
        row = report.row("activations")
        if spec.strategy in ("ep", "dp_ep"):
            # The planner's experts (planner.activations.moe_bytes) take every rank's
            # experts to receive the mean, k rows per token; the routing sends more to some
            # ranks than to others: moe-tiny measured ep=2 +13% / -6%, ep=4 -18% to +33%,
            # dp_ep (4 ranks) -6% to +15% (before the experts were planned: +107% / +72%).
            # Without expert parallel (dp on moe-tiny) it is within 0.1%.
            assert abs(row.measured / row.predicted - 1) <= 0.35, f"rank {rank}: {row}"
            continue
        assert row.ok, f"{spec.strategy} rank {rank}: {row}"
        if spec.strategy in ("cp", "dp_cp"):
            # Ring attention per ring position (planner.activations.ring_attention_bytes):
            # measured within 1.2% on every rank at cp=2 and cp=4 (it was +18% / +55% on
            # the ring's last rank before the ring was planned).
            assert abs(row.measured / row.predicted - 1) <= 0.02, f"rank {rank}: {row}"


def test_expert_all_to_alls_are_planned(runs) -> None:
    """A rank's dispatch all-to-all sends every row of its tokens (k per token), as the
    planner's ``ep_exchange_bytes`` plans, to the byte; combine and backward follow the
    routing (their mean is the same)."""
    from workbench.planner.comm_time import ep_exchange_bytes
    from workbench.planner.specs import StepInputs

    world, per_rank = runs
    for case in CASES[world]:
        spec = RunSpec(**{"model": "gpt-tiny", **case})
        if spec.strategy not in ("ep", "dp_ep"):
            continue
        plan = strategy_plan(spec, world)
        inputs = StepInputs(
            plan.model, plan.training, plan.parallel, plan.hardware, plan.seq, plan.micro_batches
        )
        planned = plan.model.layers * plan.micro_batches * ep_exchange_bytes(inputs)
        for rank in range(world):
            sent: dict[int, int] = {}
            for e in per_rank[rank][_key(case)]:
                if e.get("kind") == "comm" and str(e["source"]).startswith("ep-dispatch"):
                    sent[e["step"]] = sent.get(e["step"], 0) + e["bytes"]
            assert sent and set(sent.values()) == {planned}, (spec.strategy, rank, sent)
        assert plan.time.ep_comm > 0


# -- the user's model: uneven shards and stages ------------------------------------------


class Gain(nn.Module):
    """Three gains: a parameter whose first dimension no dp degree here divides (FSDP
    pads it), and one ZeRO-1 cannot split evenly."""

    def __init__(self) -> None:
        super().__init__()
        self.g = nn.Parameter(torch.ones(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.g.mean()


class OddLM(um.TinyLM):
    def __init__(self) -> None:
        super().__init__(blocks=3)
        self.gain = Gain()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        for block in self.blocks:
            h = block(h)
        return self.head(self.norm(self.gain(h)))


USER_LAYOUTS: dict[str, dict[str, Any]] = {
    "ddp": {"zero": 0},
    "zero1": {"zero": 1},
    "zero2": {"zero": 2},
    "fsdp": {"zero": 3},
    "tp": {"tp": 2, "dp": 1, "tp_plan": um.TP_PLAN},
    "pp uneven": {"pp": 2, "dp": 1, "pp_split": ["blocks.1"]},  # 1 block, then 2 + ends
}


def _user_runs(rank: int, world: int) -> dict[str, Any]:
    from workbench.parallel.user_model import UserRun, build_user_train_step

    out = {}
    for name, kwargs in USER_LAYOUTS.items():
        run = UserRun(
            model=OddLM, data=um.make_data, loss=um.lm_loss, layout=Layout(**kwargs), batch_size=8
        )
        step = build_user_train_step(run)
        for _ in range(STEPS):
            step.run_step()
        for tracer in (step.memory_tracer, step.comm_tracer):
            tracer.stop()
        out[name] = (step.recorder.to_records(), planner_optimizer(step.optimizer))
    return out


@pytest.fixture(scope="module")
def user_runs() -> list[dict[str, Any]]:
    return run_ranks(_user_runs, timeout=600)


def test_user_model_state_to_the_byte_with_padding_and_uneven_stages(user_runs) -> None:
    per_rank = user_runs
    model = user_model_spec(OddLM, seq=um.SEQ)
    for name, kwargs in USER_LAYOUTS.items():
        layout = Layout(**kwargs)
        plan = run_plan(
            model,
            layout=layout,
            world_size=2,
            batch_size=8,
            seq=um.SEQ,
            optimizer=per_rank[0][name][1],
            module=OddLM(),
        )
        shares = []
        for rank in range(2):
            report = validate(per_rank[rank][name][0], plan, rank=rank)
            for category in (*STATE, "dp bytes/step") if layout.zero or name == "ddp" else STATE:
                row = report.row(category)
                assert row.measured == row.predicted, f"{name} rank {rank} {category}: {row}"
            assert report.row("activations").ok, f"{name} rank {rank}"
            shares.append(report.row("model state").measured)
        if name == "zero1":  # whole parameters: the two ranks' shares differ
            assert shares[0] != shares[1]
        if name == "pp uneven":  # stage 1 holds two blocks, the norm and the head
            assert shares[1] > shares[0]


def test_plan_from_at_the_layout_it_ran_is_the_tracers(user_runs) -> None:
    """``wb.plan_from`` for the user's model, planned at the layout each run used (2 GPUs,
    the run's batch split): per-rank model state to the byte, activations within 10%."""
    from workbench.parallel.planning.plan_from import plan_from
    from workbench.parallel.user_options import UserOptions

    run = UserOptions()  # the runs' micro-batches and pipeline schedule (gpipe)
    for name, kwargs in USER_LAYOUTS.items():
        layout = Layout(**kwargs)
        dims = layout.dims(2)
        m = run.microbatches if dims.pp > 1 else run.grad_accum
        measured = plan_from(
            OddLM,
            data=um.make_data,
            loss=um.lm_loss,
            gpus=2,
            seq_len=um.SEQ,
            precision="fp32",
            optimizer=user_runs[0][name][1],
            dp=dims.dp,
            tp=dims.tp,
            pp=dims.pp,
            zero=layout.zero,
            micro_batch=8 // dims.dp // m,
            micro_batches=m,
            schedule=run.schedule,
            tp_plan=layout.tp_plan,
            pp_split=layout.pp_split,
        )
        assert measured.placed, (name, measured.notes)
        for rank in range(2):
            report = validate(user_runs[rank][name][0], measured.plan, rank=rank)
            for category in STATE:
                row = report.row(category)
                assert row.measured == row.predicted, f"{name} rank {rank} {category}: {row}"
            assert report.row("activations").ok, f"{name} rank {rank}"
