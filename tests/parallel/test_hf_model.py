"""A Hugging Face causal LM (tiny Llama, random weights, no download) under DP, FSDP and
TP with the TP plan read from its own config matches the single-device run (<= 1e-5 after
5 steps, SGD and AdamW). Skipped without transformers (the optional [hf] extra)."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("transformers")

from tests.harness import run_ranks
from tests.parallel import _user_models as um

pytestmark = pytest.mark.engines

TOL, STEPS = 1e-5, 5
LAYOUTS: dict[str, dict[str, Any]] = {
    "ddp": {"zero": 0},
    "fsdp": {"zero": 3},
    "tp-own-plan": {"dp": 1, "tp": 2},  # no tp_plan: the config's base_model_tp_plan
}


def _compare(rank: int, world: int) -> dict[str, Any]:
    from workbench.parallel.build import full_state_dict
    from workbench.parallel.hf import causal_lm_loss, tiny_llama
    from workbench.parallel.parallelize import Layout
    from workbench.parallel.user_model import UserRun, build_user_train_step, user_reference

    out: dict[str, Any] = {}
    for opt_name, opt in um.OPTIMIZERS.items():
        base = {"model": tiny_llama, "data": um.make_data, "loss": causal_lm_loss}
        ref_losses, ref_params = user_reference(UserRun(**base, optimizer=opt), STEPS)
        for name, kwargs in LAYOUTS.items():
            run = UserRun(**base, optimizer=opt, layout=Layout(**kwargs), trace=False)
            step = build_user_train_step(run)
            losses = [step.run_step() for _ in range(STEPS)]
            params = full_state_dict(step)
            if rank == 0:
                assert params is not None and sorted(params) == sorted(ref_params)
                out[f"{name}/{opt_name}"] = {
                    "loss": max(abs(a - b) for a, b in zip(losses, ref_losses, strict=True)),
                    "param": max(float((params[n] - ref_params[n]).abs().max()) for n in params),
                    "drop": ref_losses[0] - ref_losses[-1],
                }
    return out


def test_hf_llama_matches_single_device_under_dp_fsdp_tp() -> None:
    results = run_ranks(_compare, timeout=300)[0]
    assert len(results) == 2 * len(LAYOUTS)
    for name, r in results.items():
        print(f"loss {r['loss']:.2e} param {r['param']:.2e} drop {r['drop']:.3f}  {name}")
        assert r["drop"] > 0.01, f"{name}: the reference run did not learn"
        assert r["loss"] <= TOL and r["param"] <= TOL, f"{name}: {r}"


def test_hf_plan_comes_from_the_config() -> None:
    from workbench.parallel.hf import tiny_llama
    from workbench.parallel.parallelize import default_tp_plan

    plan = default_tp_plan(tiny_llama())
    assert plan["model.layers.*.self_attn.q_proj"] == "colwise"
    assert plan["model.layers.*.mlp.down_proj"] == "rowwise"
