"""Preset dimensions reproduce the published parameter counts (within 2%)."""

from __future__ import annotations

import pytest

from workbench.planner import MODELS, count_params, hardware_preset, model_preset

# Counts as the releases report them (Hugging Face model cards / safetensors metadata).
PUBLISHED = {
    "gpt2-small": 124_439_808,
    "gpt2-xl": 1_557_611_200,
    "llama2-7b": 6.74e9,
    "llama2-13b": 13.0e9,
    "llama2-70b": 69.0e9,
    "llama3-8b": 8.03e9,
    "llama3-70b": 70.6e9,
    "llama3-405b": 405e9,
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_derived_parameter_count_matches_published(name):
    derived = count_params(model_preset(name)).total
    assert abs(derived / PUBLISHED[name] - 1) < 0.02


def test_every_model_preset_is_checked():
    assert set(MODELS) == set(PUBLISHED)


def test_gpt2_small_count_by_hand():
    # wte + wpe + 12 blocks (4h² + 4h attention, 8h² + 5h MLP, 2 LayerNorms) + final LN.
    h, v, s, L = 768, 50257, 1024, 12
    block = 4 * h * h + 4 * h + 8 * h * h + 5 * h + 4 * h
    assert count_params(model_preset("gpt2-small")).total == v * h + s * h + L * block + 2 * h


def test_gqa_and_untied_head_are_counted():
    # Llama-3 8B: K and V are 8 heads of 128, the head is untied (vocab 128256).
    h, kv, f, v, L = 4096, 8 * 128, 14336, 128256, 32
    block = 2 * h * h + 2 * h * kv + 3 * h * f + 2 * h
    assert count_params(model_preset("llama3-8b")).total == 2 * v * h + L * block + h


def test_gpu_presets():
    assert hardware_preset("rtx4090").memory == 24564 * 2**20
    assert hardware_preset("h200-141gb").memory > 140e9
    a100 = hardware_preset("a100-80gb", inter="100gbe", gpus_per_node=4)
    assert a100.inter.name == "100gbe" and a100.gpus_per_node == 4
