"""The acceptance test: every strategy matches the single-device run on the same batches.

After STEPS optimizer steps (SGD and AdamW), the full parameters gathered from the sharded
run and the per-step losses match the single-device run within 1e-5 (fp32). Accumulation
and activation checkpointing are compared with the plain single-device run too, so they
must not change the numbers either. One process launch per model keeps the suite fast.
"""

from __future__ import annotations

import pytest

from tests.harness import run_ranks
from tests.parallel._equivalence import STEPS, TOL, cases_for, compare_cases

pytestmark = pytest.mark.engines


def _report(results: dict[str, dict[str, float]]) -> None:
    for name, r in results.items():
        print(f"loss {r['loss']:.2e} param {r['param']:.2e} moved {r['moved']:.2e}  {name}")


@pytest.mark.parametrize("model", ["gpt-tiny", "mlp-tiny"])
def test_strategies_match_single_device(model: str) -> None:
    cases = cases_for(model)
    results = run_ranks(compare_cases, cases, timeout=240)[0]
    _report(results)
    assert len(results) == len(cases)
    for name, r in results.items():
        assert r["moved"] > 100 * TOL, f"{name}: parameters barely moved in {STEPS} steps"
        assert r["loss"] <= TOL, f"{name}: loss differs by {r['loss']:.3e}"
        assert r["param"] <= TOL, f"{name}: parameters differ by {r['param']:.3e}"


@pytest.mark.slow
def test_dp_tp_on_four_ranks_matches_single_device() -> None:
    cases = [
        {"model": m, "strategy": "dp_tp", "optimizer": opt, "lr": lr}
        for m in ("gpt-tiny", "mlp-tiny")
        for opt, lr in (("sgd", 1e-2), ("adamw", 1e-3))
    ]
    results = run_ranks(compare_cases, cases, world_size=4, timeout=240)[0]
    _report(results)
    for name, r in results.items():
        assert r["moved"] > 100 * TOL, name
        assert r["loss"] <= TOL and r["param"] <= TOL, f"{name}: {r}"
