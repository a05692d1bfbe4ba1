"""A ``peft`` LoRA model (``get_peft_model`` on a tiny Llama from a config, no download) under
DDP and FSDP2 matches the single-device run (<= 1e-5 after 5 steps, AdamW and SGD) with its
base weights frozen; the memory tracer counts the frozen weights apart from the trainable
parameters, their gradients and optimizer state, to the byte; and the planner's
``trainable`` fraction, set to the measured one, predicts those bytes. Skipped without peft
(the optional [hf] extra)."""

from __future__ import annotations

import math
from typing import Any

import pytest

pytest.importorskip("peft")

from tests.harness import run_ranks
from tests.parallel import _user_models as um

TOL, STEPS = 1e-5, 5
LAYOUTS: dict[str, dict[str, Any]] = {"ddp": {"zero": 0}, "fsdp": {"zero": 3}}


def _lora_runs(rank: int, world: int) -> dict[str, Any]:
    """Every layout x optimizer for STEPS traced steps; on every rank its memory samples,
    and on rank 0 the differences from the single-device run."""
    from workbench.parallel.build import full_state_dict
    from workbench.parallel.hf import causal_lm_loss, tiny_llama_lora
    from workbench.parallel.parallelize import Layout
    from workbench.parallel.user_model import UserRun, build_user_train_step, user_reference

    out: dict[str, Any] = {}
    base = {"model": tiny_llama_lora, "data": um.make_data, "loss": causal_lm_loss}
    for opt_name, opt in um.OPTIMIZERS.items():
        ref_losses, ref_params = user_reference(UserRun(**base, optimizer=opt), STEPS)
        for name, kwargs in LAYOUTS.items():
            step = build_user_train_step(UserRun(**base, optimizer=opt, layout=Layout(**kwargs)))
            losses = [step.run_step() for _ in range(STEPS)]
            step.memory_tracer.stop()
            step.comm_tracer.stop()
            optimized = {id(p) for g in step.optimizer.param_groups for p in g["params"]}
            frozen_names = sorted(
                n for n, p in step.model.named_parameters() if not p.requires_grad
            )
            result: dict[str, Any] = {
                "records": step.recorder.to_records(),
                "optimized_frozen": any(
                    id(p) in optimized for p in step.model.parameters() if not p.requires_grad
                ),
                "frozen_grads": [
                    n
                    for n, p in step.model.named_parameters()
                    if not p.requires_grad and p.grad is not None
                ],
                "frozen_names": frozen_names,
            }
            params = full_state_dict(step)
            if rank == 0:
                assert params is not None and sorted(params) == sorted(ref_params)
                result["loss"] = max(abs(a - b) for a, b in zip(losses, ref_losses, strict=True))
                result["param"] = max(
                    float((params[n] - ref_params[n]).abs().max()) for n in params
                )
                # The run's own final weights against its start: base frozen, adapters moved.
                start = dict(UserRun(**base).model().named_parameters())
                result["moved"] = {
                    n: float((params[n] - start[n].detach()).abs().max())
                    for n in start
                    if n in params
                }
            out[f"{name}/{opt_name}"] = result
    return out


def _expected_bytes(layout: str) -> dict[str, int]:
    """Frozen and trainable parameter bytes on one of 2 ranks, from the shapes alone: DDP
    keeps every parameter whole; FSDP2 keeps ceil(rows / 2) rows of each (padded)."""
    from workbench.parallel.hf import tiny_llama_lora

    out = {"frozen": 0, "trainable": 0}
    for p in tiny_llama_lora().parameters():
        rows = p.shape[0]
        kept = math.ceil(rows / 2) * (p.numel() // rows) if layout == "fsdp" else p.numel()
        out["trainable" if p.requires_grad else "frozen"] += kept * p.element_size()
    return out


@pytest.mark.engines
@pytest.mark.slow
def test_lora_under_ddp_and_fsdp_matches_one_device_and_traces_frozen_weights() -> None:
    from workbench.parallel.hf import tiny_llama_lora
    from workbench.parallel.parallelize import Layout
    from workbench.parallel.planning.run_plan import run_plan
    from workbench.parallel.planning.spec_from_model import meta_model, user_model_spec
    from workbench.planner import validate

    per_rank = run_ranks(_lora_runs, timeout=600)
    model = tiny_llama_lora()
    n = sum(p.numel() for p in model.parameters())
    n_trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert 0 < n_trainable < n / 10  # adapters only: a LoRA model
    spec, module = user_model_spec(tiny_llama_lora, seq=um.SEQ), meta_model(tiny_llama_lora)
    for key, r in per_rank[0].items():
        print(f"loss {r['loss']:.2e} param {r['param']:.2e}  {key}")
        assert r["loss"] <= TOL and r["param"] <= TOL, key
        base = [v for name, v in r["moved"].items() if "lora_" not in name]
        adapters = [v for name, v in r["moved"].items() if "lora_" in name]
        assert max(base) == 0.0 and min(adapters) > 0.0, key
        assert max(adapters) > 100 * TOL, f"{key}: the adapters barely moved"
    for rank, results in enumerate(per_rank):
        for key, r in results.items():
            layout = key.split("/")[0]
            assert not r["optimized_frozen"] and not r["frozen_grads"], key
            assert r["frozen_names"] and all("lora_" not in n for n in r["frozen_names"])
            samples = [e for e in r["records"] if e["kind"] == "memory"]
            expected = _expected_bytes(layout)
            assert {s["frozen"] for s in samples if s["phase"] == "data"} == {expected["frozen"]}
            assert (
                max(s["params"] for s in samples if s["phase"] == "data") == expected["trainable"]
            )
            # The planner, with the module's placement (which parameters require grad), holds
            # model state to the byte under both layouts.
            optimizer = {"adamw": "adamw", "sgd": "sgd-momentum"}[key.split("/")[1]]
            plan = run_plan(
                spec, layout=Layout(**LAYOUTS[layout]), world_size=2, batch_size=8, seq=um.SEQ,
                optimizer=optimizer, module=module,
            )  # fmt: skip
            report = validate(r["records"], plan, rank=rank)
            for category in ("weights", "frozen weights", "grads", "optimizer", "model state"):
                row = report.row(category)
                assert row.measured == row.predicted, f"rank {rank} {key} {category}: {row}"
            # Without the module: the parameter count and the trainable fraction measured.
            if layout == "ddp":
                fraction = report_fraction(samples)
                assert fraction == pytest.approx(n_trainable / n, abs=0.5 / n)
                counted = run_plan(
                    spec, layout=Layout(zero=0), world_size=2, batch_size=8, seq=um.SEQ,
                    optimizer=optimizer, trainable=fraction,
                )  # fmt: skip
                mem = counted.memory
                assert mem.weights == max(s["params"] + s["frozen"] for s in samples)
                assert mem.frozen == max(s["frozen"] for s in samples) > 0
                assert mem.grads == max(s["grads"] for s in samples)
                assert mem.optimizer == max(s["optimizer"] for s in samples)


def report_fraction(samples: list[dict[str, Any]]) -> float:
    """The trainable fraction the tracer measured: trainable over all parameter bytes."""
    trainable = max(s["params"] for s in samples)
    return trainable / (trainable + max(s["frozen"] for s in samples))


def test_plan_from_reads_the_trainable_fraction_from_requires_grad() -> None:
    from workbench.parallel.hf import causal_lm_loss, tiny_llama_lora
    from workbench.parallel.planning.plan_from import plan_from

    model = tiny_llama_lora()
    n = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    kwargs = {"data": um.make_data, "loss": causal_lm_loss, "gpus": 2, "zero": 0}
    p = plan_from(tiny_llama_lora, optimizer="adamw", precision="fp32", **kwargs)
    assert p.plan.training.trainable == trainable / n
    assert any("trainable=" in note for note in p.notes)
    # Placed (the flags) and counted (the fraction) agree, and neither counts twice.
    for memory in (p.plan.memory, p.formula_plan.memory):
        assert memory.grads == 4 * trainable and memory.optimizer == 8 * trainable
        assert memory.frozen == 4 * (n - trainable) and memory.weights == 4 * n
