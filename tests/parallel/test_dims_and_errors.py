"""Impossible layouts and bad settings fail early with ParallelError/ConfigError messages
that name the bad value and the valid choices (no process group needed)."""

from __future__ import annotations

import pytest
import torch

from workbench.errors import ConfigError, ParallelError
from workbench.parallel import ParallelDims, RunSpec, build_train_step, get_config
from workbench.parallel.options import check_precision
from workbench.parallel.pp import split_stage


def test_dims_product_must_equal_world_size() -> None:
    with pytest.raises(
        ParallelError, match=r"dp\*tp\*pp = 2\*2\*1 = 4 does not equal world_size=2"
    ):
        ParallelDims(dp=2, tp=2, world_size=2)
    dims = ParallelDims(dp=2, tp=2, world_size=4)
    assert dims.active == ("dp", "tp") and dims.sizes == {"pp": 1, "dp": 2, "cp": 1, "tp": 2}


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_dims_reject_non_positive_integers(bad: object) -> None:
    with pytest.raises(ParallelError, match=f"tp={bad!r}"):
        ParallelDims(tp=bad, world_size=2)  # type: ignore[arg-type]


def test_tp_must_divide_heads() -> None:
    dims = ParallelDims(tp=3, world_size=3)
    with pytest.raises(ParallelError, match=r"tp=3 does not divide the model's n_heads=4.*\[1\]"):
        dims.validate_for(get_config("gpt-tiny"))


def test_tp_must_divide_mlp_sizes() -> None:
    with pytest.raises(ParallelError, match=r"tp=3 does not divide the model's dim=32"):
        ParallelDims(tp=3, world_size=3).validate_for(get_config("mlp-tiny"))


def test_pp_larger_than_layers() -> None:
    dims = ParallelDims(pp=4, world_size=4)
    with pytest.raises(
        ParallelError, match=r"pp=4 does not divide the model's n_layers=2.*\[1, 2\]"
    ):
        dims.validate_for(get_config("gpt-tiny"))


def test_split_stage_rejects_too_many_stages() -> None:
    from workbench.parallel import build_model

    with pytest.raises(ParallelError, match=r"pp=3 does not divide n_layers=2"):
        split_stage(build_model(get_config("mlp-tiny")), 0, 3)


def test_valid_layouts_pass_and_mesh_needs_a_process_group() -> None:
    dims = ParallelDims(dp=1, tp=2, pp=2, world_size=4)
    dims.validate_for(get_config("gpt-tiny"))  # 4 heads / 2, 2 layers / 2: fine
    with pytest.raises(ParallelError, match="init_process_group"):
        _ = dims.mesh


@pytest.mark.parametrize(
    ("field", "value", "choices"),
    [
        ("strategy", "zero4", "'single', 'dp'"),
        ("model", "gpt-huge", "'gpt-tiny'"),
        ("precision", "fp8", "'fp32', 'bf16'"),
        ("optimizer", "lamb", "'sgd', 'adamw'"),
        ("schedule", "zb", "'1f1b', 'dualpipe_v', 'gpipe', 'interleaved_1f1b'"),
    ],
)
def test_runspec_choices(field: str, value: str, choices: str) -> None:
    with pytest.raises(
        ConfigError, match=f"{field}={value!r} is not valid; choose one of: .*{choices}"
    ):
        RunSpec(**{field: value})


@pytest.mark.parametrize(("field", "value"), [("batch_size", 0), ("grad_accum", 0), ("lr", -1.0)])
def test_runspec_numbers(field: str, value: object) -> None:
    with pytest.raises(ConfigError, match=f"{field}={value!r} is not valid"):
        RunSpec(**{field: value})


def test_runspec_layout_errors() -> None:
    with pytest.raises(ConfigError, match="grad_accum=2 is not valid with strategy='pp'"):
        RunSpec(strategy="pp", grad_accum=2)
    with pytest.raises(ParallelError, match="needs at least 2 ranks"):
        RunSpec(strategy="tp").dims(1)
    with pytest.raises(ParallelError, match="even world_size, got 3"):
        RunSpec(strategy="dp_tp").dims(3)
    spec = RunSpec(strategy="dp", batch_size=6)
    with pytest.raises(ConfigError, match="batch_size=6 does not split over dp=4"):
        spec.check_batch(spec.dims(4))
    spec = RunSpec(strategy="dp", batch_size=8, grad_accum=3)
    with pytest.raises(
        ConfigError, match=r"grad_accum=3 does not divide the per-rank batch 4.*\[1, 2, 4\]"
    ):
        spec.check_batch(spec.dims(2))
    spec = RunSpec(strategy="pp", batch_size=8, microbatches=3)
    with pytest.raises(ConfigError, match="microbatches=3 does not divide batch_size=8"):
        spec.check_batch(spec.dims(2))
    spec = RunSpec(strategy="pp", batch_size=8, microbatches=1, schedule="1f1b")
    with pytest.raises(
        ConfigError, match="schedule=.1f1b. on pp=2 ranks.*at least 2 micro-batches"
    ):
        spec.check_batch(spec.dims(2))
    RunSpec(strategy="pp", batch_size=8, microbatches=1, schedule="gpipe").check_batch(
        RunSpec(strategy="pp").dims(2)
    )


def test_distributed_strategy_without_process_group() -> None:
    with pytest.raises(ParallelError, match="strategy='fsdp' needs an initialised process group"):
        build_train_step(RunSpec(strategy="fsdp", trace=False))


def test_bf16_where_unsupported(monkeypatch: pytest.MonkeyPatch) -> None:
    # A GPU without bf16 (before Ampere): the check must refuse before any kernel runs.
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a, **k: "Tesla V100")
    with pytest.raises(
        ConfigError, match="precision='bf16' is not supported on Tesla V100.*'fp32'"
    ):
        check_precision("bf16", torch.device("cuda", 0))
    check_precision("fp32", torch.device("cuda", 0))  # fp32 is always fine
    check_precision("bf16", torch.device("cpu"))  # CPUs run bf16 autocast


def test_bf16_single_device_runs_and_learns() -> None:
    step = build_train_step(RunSpec(strategy="single", precision="bf16", trace=False, lr=1e-2))
    losses = [step.run_step() for _ in range(5)]
    assert all(torch.isfinite(torch.tensor(losses)))
    assert losses[-1] < losses[0]


def test_entry_points_reject_unknown_options() -> None:
    from torch import nn

    from workbench.parallel import apply_fsdp, apply_megatron
    from workbench.parallel.tp import plan_for

    with pytest.raises(ConfigError, match=r"stage=4 is not valid; choose one of: \(1, 2, 3\)"):
        apply_fsdp(nn.Linear(2, 2), None, stage=4)  # type: ignore[arg-type]
    with pytest.raises(
        ParallelError, match=r"no tensor-parallel plan for model type 'Linear'.*'GPT'"
    ):
        plan_for(nn.Linear(2, 2))
    with pytest.raises(ParallelError, match="found no FeedForward block in Sequential"):
        apply_megatron(nn.Sequential(nn.Linear(2, 2)), None)  # type: ignore[arg-type]
