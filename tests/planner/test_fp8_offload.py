"""FP8 matmuls and optimizer / activation offload as plan options: the arithmetic with
given inputs (published figures are rows of tests/planner/published.py)."""

from __future__ import annotations

import math

import pytest

from workbench.errors import ConfigError
from workbench.planner import (
    HardwareSpec,
    ParallelSpec,
    TrainingSpec,
    evaluate,
    hardware_preset,
    layer_activation_bytes,
    model_preset,
    plan,
)
from workbench.planner.timing import executed_flops_per_token

H100 = hardware_preset("h100-80gb")
L7 = model_preset("llama2-7b")


def test_presets_carry_the_data_sheet_fp8_peak_and_the_host_link():
    assert H100.peak_flops_fp8 == 1979e12 == hardware_preset("h200-141gb").peak_flops_fp8
    assert hardware_preset("a100-80gb").peak_flops_fp8 is None  # no FP8 tensor cores
    assert H100.host_bandwidth == 45e9 and hardware_preset("a100-80gb").host_bandwidth == 22e9
    assert HardwareSpec.from_dict(H100.to_dict()) == H100


def test_fp8_saves_linear_inputs_in_one_byte():
    kw = dict(s=2048, b=1, h=4096, a=32, dropout=False)
    s, h, f = 2048, 4096, 4 * 4096
    bf16 = layer_activation_bytes(**kw)
    fp8 = layer_activation_bytes(**kw, fp8=True)
    # two norm outputs (h each), the attention projection input (h), GeLU output (f)
    assert bf16 - fp8 == pytest.approx(s * (3 * h + f))
    gated = dict(kw, ffn=11008, gated_mlp=True)
    assert layer_activation_bytes(**gated) - layer_activation_bytes(**gated, fp8=True) == (
        pytest.approx(s * (3 * h + 11008))
    )


def test_fp8_adds_a_one_byte_weight_copy_and_runs_matmuls_at_the_fp8_peak():
    base = plan(L7, H100, gpus=8, zero=1, seq=4096)
    fp8 = plan(L7, H100, gpus=8, zero=1, seq=4096, fp8=True)
    assert fp8.memory.weights == base.memory.weights * 3 // 2  # 2 + 1 bytes per param
    assert fp8.memory.activations < base.memory.activations
    # Same matmul efficiency; matmuls at 2x the peak, attention core at bf16.
    t = base.training
    total = executed_flops_per_token(L7, t, 4096)
    attn = 3.0 * L7.layers * 4.0 * 4096 * L7.hidden
    mm = total - attn
    speed = total / (mm / 2 + attn)  # the compute's speed-up without the traffic term
    assert base.time.compute > fp8.time.compute > base.time.compute / speed
    assert fp8.time.mfu > base.time.mfu  # MFU stays against the bf16 peak


def test_optimizer_offload_moves_grads_and_optimizer_to_host_and_pays_pcie():
    on = evaluate(L7, TrainingSpec(offload_optimizer=True), ParallelSpec(dp=8, zero=2), H100)
    off = evaluate(L7, TrainingSpec(), ParallelSpec(dp=8, zero=2), H100)
    n = off.memory.weights // 2
    assert on.memory.grads == on.memory.optimizer == 0
    assert on.memory.weights == off.memory.weights
    assert on.memory.host == math.ceil(n / 8) * 16  # fp32 grads + master + Adam, sharded
    assert off.memory.host == 0
    # bf16 gradients down and bf16 weights up, once per step, over PCIe 5 (45 GB/s).
    assert on.time.offload == pytest.approx(2 * 2 * n / 8 / 45e9, rel=1e-12)
    assert on.time.total == pytest.approx(off.time.total + on.time.offload, rel=1e-12)


def test_activation_offload_keeps_two_layers_and_hides_copies_behind_compute():
    t = TrainingSpec(offload_activations=True, micro_batch=1, global_batch=8)
    on = evaluate(L7, t, ParallelSpec(dp=8), H100.with_(host_bandwidth=1e15))
    off = evaluate(L7, t.with_(offload_activations=False), ParallelSpec(dp=8), H100)
    per_layer = off.memory.activations_layers / L7.layers
    assert on.memory.activations_layers == pytest.approx(2 * per_layer, abs=1)
    assert on.memory.host == pytest.approx(off.memory.activations_layers - 2 * per_layer, abs=2)
    assert on.time.offload == 0.0  # a fast host link hides behind compute
    slow = evaluate(L7, t, ParallelSpec(dp=8), H100.with_(host_bandwidth=1e9))
    copies = 2 * off.memory.activations_layers / 1e9
    assert slow.time.offload == pytest.approx(copies - slow.time.compute, rel=1e-9)


@pytest.mark.parametrize(
    ("settings", "hardware", "match"),
    [
        ({"fp8": True}, "a100-80gb", "fp8=True but hardware 'a100-80gb' has no FP8 peak"),
        ({"fp8": True, "precision": "fp32"}, "h100-80gb", "fp8=True needs precision"),
        ({"fp8": 1}, "h100-80gb", "fp8=1 is not valid"),
        ({"offload_optimizer": "yes"}, "h100-80gb", "offload_optimizer='yes'"),
    ],
)
def test_bad_fp8_and_offload_settings_are_one_clear_error(settings, hardware, match):
    with pytest.raises(ConfigError, match=match):
        plan(L7, hardware, gpus=8, **settings)


def test_offload_without_a_host_bandwidth_is_one_clear_error():
    hw = H100.with_(host_bandwidth=None)
    with pytest.raises(ConfigError, match="host_bandwidth"):
        plan(L7, hw, gpus=8, offload_activations=True)


@pytest.mark.parametrize("value", [-1.0, math.nan, math.inf, 1e30])
def test_bad_fp8_peak_and_host_bandwidth_are_one_clear_error(value):
    with pytest.raises(ConfigError, match="peak_flops_fp8="):
        H100.with_(peak_flops_fp8=value)
    with pytest.raises(ConfigError, match="host_bandwidth="):
        H100.with_(host_bandwidth=value)


def test_the_zero_offload_13b_row_fits_only_because_of_the_offload():
    from tests.planner.published import _V100, _v100_13b

    assert _v100_13b(True) * 1e9 <= _V100.usable < _v100_13b(False) * 1e9
