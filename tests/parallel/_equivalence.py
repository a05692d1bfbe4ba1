"""Shared rank function: run strategies for k steps and compare with the single-device run."""

from __future__ import annotations

from typing import Any

TOL = 1e-5
STEPS = 5
LR = {"sgd": 1e-2, "adamw": 1e-3}

# Every strategy on 2 ranks (dp_tp needs 4 and has its own slow test).
STRATEGY_CASES: list[dict[str, Any]] = [
    {"strategy": "dp", "overlap": False},
    {"strategy": "dp", "overlap": True},
    {"strategy": "zero1"},
    {"strategy": "zero2"},
    {"strategy": "fsdp"},
    {"strategy": "tp"},
    {"strategy": "megatron"},
    {"strategy": "pp", "schedule": "gpipe", "microbatches": 2},
    {"strategy": "pp", "schedule": "1f1b", "microbatches": 4},
]


def cases_for(model: str) -> list[dict[str, Any]]:
    """All strategies x both optimizers, plus accumulation and checkpointing variants."""
    cases = [
        {"model": model, "optimizer": opt, "lr": LR[opt], **strategy}
        for opt in ("sgd", "adamw")
        for strategy in STRATEGY_CASES
    ]
    base = {"model": model, "optimizer": "adamw", "lr": LR["adamw"]}
    cases += [
        {**base, "strategy": "dp", "overlap": True, "grad_accum": 2},
        {**base, "strategy": "dp", "overlap": False, "grad_accum": 2},
        {**base, "strategy": "fsdp", "grad_accum": 2},
        {**base, "strategy": "tp", "grad_accum": 2},
        {**base, "strategy": "fsdp", "checkpointing": True},
        {**base, "strategy": "tp", "checkpointing": True},
        {**base, "strategy": "megatron", "checkpointing": True},
        {**base, "strategy": "pp", "schedule": "1f1b", "checkpointing": True},
    ]
    return cases


def label(case: dict[str, Any]) -> str:
    return ",".join(f"{k}={v}" for k, v in case.items() if k != "lr")


def compare_cases(rank: int, world_size: int, cases: list[dict[str, Any]]) -> dict[str, Any]:
    """Run every case (RunSpec kwargs) for STEPS steps; rank 0 returns, per case label, the
    max |loss - reference| over steps, max |param - reference| over all elements, and how far
    the reference parameters moved from their start (so a pass is not a run that did nothing).
    """
    from workbench.parallel import (
        RunSpec,
        build_model,
        build_train_step,
        full_state_dict,
        get_config,
        reference_losses_and_params,
    )

    out: dict[str, Any] = {}
    references: dict[tuple[Any, ...], Any] = {}
    for case in cases:
        spec = RunSpec(trace=False, **case)
        step = build_train_step(spec)
        losses = [step.run_step() for _ in range(STEPS)]
        params = full_state_dict(step)
        if rank != 0:
            if params is not None:
                raise AssertionError("full_state_dict must return None off rank 0")
            continue
        key = (spec.model, spec.optimizer, spec.learning_rate, spec.batch_size, spec.seed)
        if key not in references:
            initial = build_model(get_config(spec.model, seed=spec.seed)).named_parameters()
            start = {n: p.detach().clone() for n, p in initial}
            references[key] = (*reference_losses_and_params(spec, STEPS), start)
        ref_losses, ref_params, start = references[key]
        if params is None or sorted(params) != sorted(ref_params):
            raise AssertionError(f"{case}: parameter names differ from the reference")
        out[label(case)] = {
            "loss": max(abs(a - b) for a, b in zip(losses, ref_losses, strict=True)),
            "param": max(float((params[n] - ref_params[n]).abs().max()) for n in ref_params),
            "moved": max(float((ref_params[n] - start[n]).abs().max()) for n in start),
            "loss_drop": ref_losses[0] - ref_losses[-1],
        }
    return out


def assert_equivalent(results: dict[str, dict[str, float]], expected: int) -> None:
    """Every case moved its parameters and matches the single-device run within TOL."""
    assert len(results) == expected, sorted(results)
    for name, r in results.items():
        print(f"loss {r['loss']:.2e} param {r['param']:.2e} moved {r['moved']:.2e}  {name}")
        assert r["moved"] > 100 * TOL, f"{name}: parameters barely moved"
        assert r["loss"] <= TOL, f"{name}: loss differs by {r['loss']:.3e}"
        assert r["param"] <= TOL, f"{name}: parameters differ by {r['param']:.3e}"
