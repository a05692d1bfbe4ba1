"""The planner on the user's own model: its parameter count read on the meta device, and a
real traced run on 2 ranks holding the planner's prediction to the byte (model state by
category; data-parallel bytes per step under DDP, ZeRO-1, FSDP)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from tests.harness import run_ranks
from tests.parallel import _user_models as um
from workbench.errors import ConfigError
from workbench.parallel.parallelize import Layout
from workbench.parallel.planning.run_plan import run_plan
from workbench.parallel.planning.spec_from_model import (
    meta_model,
    planner_optimizer,
    planner_precision,
    read_shape,
    user_model_spec,
)
from workbench.planner import validate

STEPS, BATCH = 3, 8
LAYOUTS: dict[str, dict[str, Any]] = {
    "ddp": {"zero": 0},
    "ddp-deferred": {"zero": 0, "overlap": False},
    "zero1": {"zero": 1},
    "zero2": {"zero": 2},
    "fsdp": {"zero": 3},
}


def _traced_runs(rank: int, world: int, layouts: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Every layout x optimizer, traced for STEPS steps: this rank's event records."""
    from workbench.parallel.user_model import UserRun, build_user_train_step

    out: dict[str, Any] = {}
    for opt_name, opt in um.OPTIMIZERS.items():
        for name, kwargs in layouts.items():
            run = UserRun(
                model=um.make_model,
                data=um.make_data,
                loss=um.lm_loss,
                optimizer=opt,
                layout=Layout(**kwargs),
                batch_size=BATCH,
            )
            step = build_user_train_step(run)
            for _ in range(STEPS):
                step.run_step()
            optimizer = planner_optimizer(step.optimizer)
            for tracer in (step.memory_tracer, step.comm_tracer):
                tracer.stop()
            out[f"{name}/{opt_name}"] = {
                "records": step.recorder.to_records(),
                "optimizer": optimizer,
            }
    return out


@pytest.mark.engines
def test_user_model_state_and_dp_bytes_equal_the_plan_to_the_byte() -> None:
    per_rank = run_ranks(_traced_runs, LAYOUTS, timeout=300)
    model = user_model_spec(um.make_model, seq=um.SEQ)
    n = sum(p.numel() for p in um.make_model().parameters())
    assert model.n_params == n and not model.shape_assumed
    for rank, results in enumerate(per_rank):
        assert len(results) == len(LAYOUTS) * len(um.OPTIMIZERS)
        for key, result in results.items():
            layout = Layout(**LAYOUTS[key.split("/")[0]])
            plan = run_plan(
                model,
                layout=layout,
                world_size=2,
                batch_size=BATCH,
                seq=um.SEQ,
                optimizer=result["optimizer"],
            )
            report = validate(result["records"], plan, rank=rank)
            print(f"rank {rank} {key}\n{report}")
            for category in ("weights", "grads", "optimizer", "model state", "dp bytes/step"):
                row = report.row(category)
                assert row.measured == row.predicted, f"rank {rank} {key} {category}: {row}"
                assert row.measured > 0 or category == "optimizer"
            # Activations: the planner's per-layer formula for this transformer, within 10%.
            assert report.row("activations").ok, f"rank {rank} {key}"
    # The planner's numbers are the arithmetic it says: AdamW fp32 is 4 + 4 + 8 bytes a
    # parameter; FSDP shards all three over 2 ranks, DDP none.
    ddp = run_plan(
        model, layout=Layout(zero=0), world_size=2, batch_size=BATCH, seq=um.SEQ,
        optimizer="adamw",
    )  # fmt: skip
    fsdp = run_plan(
        model, layout=Layout(zero=3), world_size=2, batch_size=BATCH, seq=um.SEQ,
        optimizer="adamw",
    )  # fmt: skip
    assert (ddp.memory.weights, ddp.memory.grads, ddp.memory.optimizer) == (4 * n, 4 * n, 8 * n)
    assert fsdp.memory.model_state * 2 == ddp.memory.model_state


# -- the model read on the meta device (no processes) --------------------------------------


def test_shape_is_read_from_the_users_module() -> None:
    shape = read_shape(meta_model(um.make_model))
    assert shape.params == sum(p.numel() for p in um.make_model().parameters())
    assert (shape.layers, shape.hidden, shape.heads, shape.vocab, shape.ffn) == (
        um.BLOCKS,
        um.DIM,
        um.HEADS,
        um.VOCAB,
        4 * um.DIM,
    )
    assert shape.sources["layers"] == "largest ModuleList"
    assert shape.sources["heads"].endswith("head_dim")
    assert not shape.tied_embeddings and not shape.gated_mlp


def test_meta_build_allocates_nothing_and_counts_tied_weights_once() -> None:
    class Tied(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(1000, 64)
            self.blocks = nn.ModuleList(nn.Linear(64, 64) for _ in range(3))
            self.head = nn.Linear(64, 1000, bias=False)
            self.head.weight = self.embed.weight

    module = meta_model(Tied)
    assert all(p.device.type == "meta" for p in module.parameters())
    spec = user_model_spec(Tied)
    assert spec.n_params == 1000 * 64 + 3 * (64 * 64 + 64)
    assert spec.tied_embeddings and read_shape(module).layers == 3
    # No head count anywhere: the planner assumes the whole shape from the count.
    assert read_shape(module).heads is None and spec.shape_assumed


def test_dimensions_can_be_given_and_are_checked() -> None:
    spec = user_model_spec(um.make_model, heads=4, seq=8)
    assert spec.heads == 4 and spec.seq == 8
    with pytest.raises(ConfigError, match="unknown model dimension"):
        user_model_spec(um.make_model, width=3)


def test_factory_that_cannot_build_on_meta_is_named() -> None:
    def needs_data() -> nn.Module:
        model = nn.Linear(4, 4)
        model.weight.data.copy_(torch.ones(4, 4))  # real data: impossible on meta
        float(model.weight.detach().sum())
        return model

    with pytest.raises(ConfigError, match="needs_data.*meta device"):
        meta_model(needs_data)
    with pytest.raises(ConfigError, match="not a torch.nn.Module"):
        meta_model(lambda: 3)
    with pytest.raises(ConfigError, match="model=3"):
        meta_model(3)  # type: ignore[arg-type]


def test_planner_vocabulary_for_optimizers_and_precision() -> None:
    params = list(nn.Linear(2, 2).parameters())
    assert planner_optimizer(torch.optim.AdamW(params)) == "adamw"
    assert planner_optimizer(torch.optim.Adam(params)) == "adam"
    assert planner_optimizer(torch.optim.SGD(params, lr=0.1)) == "sgd"
    assert planner_optimizer(torch.optim.SGD(params, lr=0.1, momentum=0.9)) == "sgd-momentum"
    with pytest.raises(ConfigError, match="Adagrad"):
        planner_optimizer(torch.optim.Adagrad(params))
    assert planner_precision("bf16") == "bf16-mixed"
    with pytest.raises(ConfigError, match="fp16"):
        planner_precision("fp16")


def test_hugging_face_config_gives_the_shape() -> None:
    pytest.importorskip("transformers")
    from workbench.parallel.hf import tiny_llama

    spec = user_model_spec(tiny_llama, seq=16)
    built = tiny_llama()
    assert spec.n_params == sum(p.numel() for p in built.parameters())
    assert (spec.layers, spec.hidden, spec.heads, spec.kv_heads) == (2, 32, 4, 2)
    assert spec.gated_mlp and spec.norm == "rmsnorm" and spec.ffn == 64
