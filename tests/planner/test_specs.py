"""Bad input raises ConfigError naming the bad value and the valid range or choices."""

from __future__ import annotations

import pytest

from workbench.errors import ConfigError
from workbench.planner import (
    GPUS,
    MODELS,
    HardwareSpec,
    LinkSpec,
    ModelSpec,
    ParallelSpec,
    TrainingSpec,
    hardware_preset,
    link_preset,
    model_preset,
    plan,
)


@pytest.mark.parametrize(
    ("make", "needle"),
    [
        (lambda: ModelSpec(params=-5), "params=-5"),
        (lambda: ModelSpec(layers=-1, hidden=64, heads=4, vocab=10), "layers=-1"),
        (lambda: ModelSpec(layers=2, hidden=64, heads=5, vocab=10), "heads=5"),
        (lambda: ModelSpec(layers=2, hidden=64, heads=4, kv_heads=3, vocab=10), "kv_heads=3"),
        (lambda: TrainingSpec(micro_batch=0), "micro_batch=0"),
        (lambda: TrainingSpec(seq=-8), "seq=-8"),
        (lambda: TrainingSpec(mfu=1.5), "mfu=1.5"),
        (lambda: TrainingSpec(precision="fp8"), "'bf16-mixed'"),
        (lambda: TrainingSpec(optimizer="lion"), "'adamw'"),
        (lambda: TrainingSpec(recompute="some"), "'selective'"),
        (lambda: ParallelSpec(dp=0), "dp=0"),
        (lambda: ParallelSpec(zero=4), "0, 1, 2, 3"),
        (lambda: ParallelSpec(sequence_parallel=True), "tp > 1"),
        (lambda: LinkSpec(bandwidth=-1.0, latency=0.0), "bandwidth=-1.0"),
        (lambda: model_preset("gpt5"), "llama2-7b"),
        (lambda: hardware_preset("v100"), "h100-80gb"),
        (lambda: link_preset("token-ring"), "nvlink4"),
    ],
)
def test_bad_values_name_the_value_and_the_choices(make, needle):
    with pytest.raises(ConfigError) as info:
        make()
    assert needle in str(info.value)


def test_unknown_preset_lists_every_valid_name():
    with pytest.raises(ConfigError) as info:
        model_preset("nope")
    for name in MODELS:
        assert repr(name) in str(info.value)
    with pytest.raises(ConfigError) as info:
        hardware_preset("nope")
    for name in GPUS:
        assert repr(name) in str(info.value)


def test_tp_must_divide_heads_and_lists_valid_tp():
    with pytest.raises(ConfigError) as info:
        plan("llama2-7b", tp=3)
    msg = str(info.value)
    assert "tp=3" in msg and "[1, 2, 4, 8, 16, 32]" in msg
    # GQA: 8 KV heads limit TP to divisors of 8 even though there are 64 query heads.
    with pytest.raises(ConfigError, match=r"tp=16.*valid tp: \[1, 2, 4, 8\]"):
        plan("llama2-70b", tp=16)


def test_pp_cannot_exceed_layers():
    with pytest.raises(ConfigError, match=r"pp=13.*valid pp: 1..12"):
        plan("gpt2-small", pp=13)


def test_gpus_must_match_layout():
    with pytest.raises(ConfigError, match="gpus=8"):
        plan("gpt2-small", gpus=8, dp=2, tp=2)
    with pytest.raises(ConfigError, match="not divisible"):
        plan("gpt2-small", gpus=6, tp=4)


def test_global_batch_must_divide():
    with pytest.raises(ConfigError, match="global_batch=10"):
        plan("gpt2-small", gpus=4, global_batch=10, micro_batch=1)


def test_unknown_plan_setting_lists_valid_keys():
    with pytest.raises(ConfigError, match=r"unknown option 'zer'; did you mean 'zero'"):
        plan("gpt2-small", zer=1)


def test_specs_are_frozen_and_hardware_round_trips_through_dict():
    hw = hardware_preset("h100-80gb")
    with pytest.raises(AttributeError):
        hw.memory = 1  # type: ignore[misc]
    assert HardwareSpec.from_dict(hw.to_dict()) == hw
    with pytest.raises(ConfigError, match="unknown hardware fields"):
        HardwareSpec.from_dict({**hw.to_dict(), "colour": "green"})


def test_params_only_model_gets_an_assumed_shape_and_keeps_the_exact_count():
    m = ModelSpec(params=10_000_000_000, vocab=32000, seq=2048)
    assert m.shape_assumed and m.n_params == 10_000_000_000
    # The assumed shape is GPT-3-like: ~12·L·h² parameters in the blocks.
    assert 0.8 < 12 * m.layers * m.hidden**2 / 10e9 < 1.2
    bigger = m.with_(params=20_000_000_000)
    assert bigger.shape_assumed and bigger.hidden > m.hidden


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_numbers_are_rejected_with_the_field_name(bad):
    from workbench.planner import HardwareSpec, LinkSpec

    with pytest.raises(ConfigError, match="bandwidth=.*finite"):
        LinkSpec(bandwidth=bad, latency=0.0)
    link = LinkSpec(bandwidth=1e9, latency=0.0)
    with pytest.raises(ConfigError, match="peak_flops=.*finite"):
        HardwareSpec(memory=10, peak_flops=bad, intra=link, inter=link)
    with pytest.raises(ConfigError, match="mfu=.*finite"):
        TrainingSpec(mfu=bad)


def test_hardware_from_dict_reports_malformed_input_as_config_errors():
    from workbench.planner import HardwareSpec, hardware_preset

    good = hardware_preset("a100-80gb").to_dict()
    assert HardwareSpec.from_dict(good) == hardware_preset("a100-80gb")
    for broken, match in (
        ([], "JSON object"),
        ({k: v for k, v in good.items() if k != "intra"}, "missing"),
        ({**good, "intra": "nvlink"}, "intra="),
        ({**good, "inter": {"bandwidth": 1e9}}, "latency"),
        ({**good, "inter": {"bandwidth": 1e9, "latency": 0, "x": 1}}, "unknown link fields"),
    ):
        with pytest.raises(ConfigError, match=match):
            HardwareSpec.from_dict(broken)  # type: ignore[arg-type]


def test_specs_module_still_names_every_spec_and_choice_list():
    """``workbench.planner.specs`` is the import path users and notebooks know: the specs
    defined in ``model_spec`` and ``hardware_spec`` are the same objects there."""
    from workbench.planner import hardware_spec, model_spec, specs

    for name in specs.__all__:
        assert hasattr(specs, name), name
    assert specs.ModelSpec is model_spec.ModelSpec is ModelSpec
    assert specs.HardwareSpec is hardware_spec.HardwareSpec is HardwareSpec
    assert specs.LinkSpec is hardware_spec.LinkSpec is LinkSpec
    assert (specs.NORMS, specs.GPU_KINDS) == (model_spec.NORMS, hardware_spec.GPU_KINDS)


def test_expert_parallel_must_divide_dp_and_top_k_the_experts() -> None:
    from workbench.planner import ModelSpec, ParallelSpec

    with pytest.raises(ConfigError, match=r"ep=3 is not valid with dp=4.*\[1, 2, 4\]"):
        ParallelSpec(dp=4, ep=3)
    with pytest.raises(ConfigError, match="top_k=3"):
        ModelSpec(layers=2, hidden=32, heads=4, vocab=64, experts=2, top_k=3)
