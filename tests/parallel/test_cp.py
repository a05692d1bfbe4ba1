"""Context parallel (the sequence split over ranks, attention around a ring of send/recv)
equals one device; its ring traffic is in the trace; each rank holds its share of the
activations. One forked gloo launch for the 2-rank cases."""

from __future__ import annotations

from typing import Any

import pytest

from tests.harness import run_ranks
from tests.parallel._equivalence import assert_equivalent, compare_cases
from workbench.errors import ParallelError
from workbench.parallel.run_spec import RunSpec

CASES = [
    {"model": "gpt-tiny", "strategy": "cp", "optimizer": "sgd", "lr": 1e-2},
    {"model": "gpt-tiny", "strategy": "cp", "optimizer": "adamw", "lr": 1e-3},
    {"model": "gpt-small", "strategy": "cp", "optimizer": "sgd", "lr": 1e-2},
]


def _traced(rank: int, strategy: str) -> dict[str, Any]:
    from workbench.parallel import build_train_step

    step = build_train_step(RunSpec(model="gpt-small", strategy=strategy, batch_size=8))
    step.run_step()
    step.close()
    events = step.recorder.events
    comm = [e for e in events if getattr(e, "kind", "") == "comm"]
    memory = [e for e in events if getattr(e, "kind", "") == "memory"]
    return {
        "ops": sorted({(e.op, e.phase) for e in comm}),
        "activations": max(e.activations for e in memory),
    }


def _all(rank: int, world: int) -> dict[str, Any]:
    out = compare_cases(rank, world, CASES)
    out["traced"] = {s: _traced(rank, s) for s in ("cp", "single")}
    return out


@pytest.fixture(scope="module")
def results() -> dict[str, Any]:
    return run_ranks(_all, timeout=400)[0]


@pytest.mark.engines
def test_context_parallel_equals_one_device(results: dict[str, Any]) -> None:
    assert_equivalent({k: v for k, v in results.items() if k != "traced"}, len(CASES))


@pytest.mark.engines
def test_ring_traffic_is_traced_and_activations_split(results: dict[str, Any]) -> None:
    cp, single = results["traced"]["cp"], results["traced"]["single"]
    print(cp, single)
    ops = {op for op, _ in cp["ops"]}
    # keys/values around the ring in forward, their gradients back in backward
    assert {"send", "recv"} <= ops, ops
    assert any(phase == "forward" for _, phase in cp["ops"])
    assert any(phase == "backward" for _, phase in cp["ops"])
    # each rank keeps the activations of its half of every sequence (the ring attention
    # keeps each block's scores: a quarter of the full s x s, twice on the last rank)
    assert 0 < cp["activations"] < 0.75 * single["activations"]


@pytest.mark.engines
@pytest.mark.slow
def test_dp_by_cp_on_four_ranks_equals_one_device() -> None:
    cases = [{"model": "gpt-tiny", "strategy": "dp_cp", "optimizer": "sgd", "lr": 1e-2}]
    results = run_ranks(compare_cases, cases, world_size=4, timeout=300)[0]
    assert_equivalent(results, 1)


def test_cp_needs_a_sequence_that_splits() -> None:
    with pytest.raises(ParallelError, match="cp=2 splits a sequence"):
        from workbench.parallel.models import get_config

        RunSpec(model="mlp-tiny", strategy="cp").dims(2).validate_for(get_config("mlp-tiny"))
    with pytest.raises(ParallelError, match="cp=3 does not divide the model's seq_len=16"):
        from workbench.parallel.models import get_config

        RunSpec(model="gpt-tiny", strategy="cp").dims(3).validate_for(get_config("gpt-tiny"))
