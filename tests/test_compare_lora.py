"""``wb.compare`` and ``wb.Stepper`` on a ``peft`` LoRA model, and checkpointing side by side:
DDP, FSDP and FSDP with checkpointed blocks each equal one device; the frozen base weights
are a memory category of their own; the table sets activation bytes beside step time, and
the planner's recompute prediction beside the measured activations. Skipped without peft."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("peft")

import cloudpickle

from tests.parallel import _user_models as um
from workbench.cluster import Cluster
from workbench.compare import compare
from workbench.errors import ConfigError
from workbench.parallel.hf import causal_lm_loss, tiny_llama_lora

cloudpickle.register_pickle_by_value(um)

LORA = {
    "model": tiny_llama_lora,
    "data": um.make_data,
    "loss": causal_lm_loss,
    "optimizer": um.adamw,
}


@pytest.mark.engines
@pytest.mark.slow
def test_lora_compared_with_and_without_checkpointing(cluster: Cluster, tmp_path: Path) -> None:
    result = compare(
        **LORA,
        strategies=["dp", "fsdp", {"strategy": "fsdp", "checkpointing": True}],
        steps=5,
        cluster=cluster,
        out=tmp_path,
        log=lambda _line: None,
    )
    assert [r.strategy for r in result.results] == ["dp", "fsdp", "fsdp +ckpt"]
    for r in result.results:
        assert r.check is not None and r.check["steps"] == 5
        assert r.check["max_param_diff"] <= 1e-5 and r.check["max_loss_diff"] <= 1e-5, r.strategy
        frozen = {e.frozen for e in r.events if e.kind == "memory" and e.phase == "data"}
        assert len(frozen) == 1 and frozen.pop() > 0, r.strategy  # the base weights, apart
        rows = {row["category"]: row for row in r.validation["rows"]}
        # Data-parallel bytes too: only the adapters' gradients are reduced, while FSDP
        # gathers the frozen weights with them.
        for category in ("weights", "frozen weights", "grads", "optimizer", "dp bytes/step"):
            assert rows[category]["measured"] == rows[category]["predicted"], (r.strategy, category)
    table = {row["strategy"]: row for row in result.table}
    plain, ckpt = table["fsdp"], table["fsdp +ckpt"]
    assert 0 < ckpt["activations / rank (MiB)"] < plain["activations / rank (MiB)"]
    assert ckpt["step (ms, median)"] is not None
    # The planner's activation prediction drops with recompute, as the measurement does.
    predicted = {
        r.strategy: {row["category"]: row for row in r.validation["rows"]}["activations"]
        for r in result.results
    }
    assert predicted["fsdp +ckpt"]["predicted"] < predicted["fsdp"]["predicted"]
    assert predicted["fsdp +ckpt"]["measured"] < predicted["fsdp"]["measured"]
    # The report's planner table has the frozen weights as a row of their own.
    assert "frozen weights" in result.report.read_text()
    print(result)


@pytest.mark.engines
def test_lora_steps_in_the_stepper_under_fsdp(cluster: Cluster) -> None:
    import workbench as wb
    from workbench.engine.equivalence import compare_user_with_reference

    stepper = wb.Stepper(**LORA, strategy="fsdp", batch_size=8, cluster=cluster)
    try:
        stepper.run(5)
        check = next(r for r in cluster.run(compare_user_with_reference) if r)
        assert check["steps"] == 5 and check["max_param_diff"] <= 1e-5
        frozen = [e.frozen for e in stepper.session.events if e.kind == "memory"]
        assert frozen and min(frozen) > 0
    finally:
        stepper.close()


@pytest.mark.parametrize(
    ("strategy", "match"),
    [
        ({"strategy": "fsdp", "checkpointing": 3}, "checkpointing=3"),
        ({"strategy": "fsdp", "checkpointing": "layers.*"}, "'layers.*' matches no module"),
        ({"strategy": "fsdp", "precision": "fp16"}, "precision='fp16'"),
        ({"strategy": "fsdp", "recompute": "full"}, "recompute"),
        ({"strategy": "single", "checkpointing": True}, "'single' is the reference"),
        ({"strategy": 3}, "strategy=3"),
    ],
)
def test_bad_run_options_in_a_strategy_fail_before_any_process(
    strategy: object, match: str
) -> None:
    base = {"model": um.make_model, "data": um.make_data, "loss": um.lm_loss}
    with pytest.raises(ConfigError, match=match):
        compare(**base, strategies=[strategy])  # type: ignore[list-item]
