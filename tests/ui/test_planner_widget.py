"""The planner widget is a view over PlannerState: driving its controls changes the
verdict and the figures to exactly what the pure planner computes."""

from __future__ import annotations

import pytest

from workbench.ui.planner import CUSTOM, PlannerState, PlannerWidget


def _bars(w: PlannerWidget) -> list[float]:
    return [t.y[0] for t in w.memory_fig.data if t.type == "bar"]


def test_sliders_change_the_verdict_and_the_bars():
    w = PlannerWidget(model="llama2-7b", gpu="a100-80gb", gpus=8, zero=0, recompute="full")
    assert w.plan is not None and not w.plan.fits
    assert "OOM" in w.verdict.value
    before = _bars(w)
    assert sum(before) == pytest.approx(w.plan.memory.total / 1e9)

    w.zero.value = 3  # shard everything over the 8 GPUs
    assert w.state.zero == 3
    assert w.plan.fits and "fits" in w.verdict.value
    after = _bars(w)
    assert after[2] == pytest.approx(before[2] / 8, rel=1e-3)  # optimizer state / 8
    assert sum(after) == pytest.approx(w.state.plan().memory.total / 1e9)


def test_size_slider_switches_to_a_custom_model_and_gpus_slider_rescales():
    w = PlannerWidget(gpus=8, zero=3, recompute="full")
    w.size.value = 100.0
    assert w.model.value == CUSTOM and w.plan.model.n_params == 100_000_000_000
    assert "OOM" in w.verdict.value
    w.gpus.value = 256
    assert w.plan.gpus == 256 and w.plan.fits
    tokens = next(t for t in w.scaling_fig.data if t.name == "tokens/s")
    assert max(tokens.x) >= 256


def test_network_choice_changes_multi_node_throughput():
    w = PlannerWidget(model="llama2-7b", gpus=32, zero=1, recompute="selective")
    fast = w.plan.tokens_per_s
    w.network.value = "25gbe"
    assert w.plan.hardware.inter.name == "25gbe"
    assert w.plan.tokens_per_s < fast


def test_invalid_layout_shows_an_error_instead_of_raising():
    w = PlannerWidget(state=PlannerState(model="gpt2-xl", gpus=8))
    w.tp.value = 8  # 25 heads: TP 8 is impossible
    assert w.plan is None and "invalid" in w.verdict.value and "tp=8" in w.verdict.value


def test_recommend_button_writes_reasons():
    w = PlannerWidget(model="llama2-7b", gpu="h100-80gb", gpus=16)
    w.recommend_button.click()
    assert "Recommended" in w.reasons.value


def test_flash_attention_and_fused_swiglu_controls_shrink_activations():
    from workbench.ui.planner import PlannerWidget

    w = PlannerWidget(model="llama2-7b", gpus=8, zero=3, seq=4096)
    base = w.plan.memory.activations
    w.flash.value = True
    flash = w.plan.memory.activations
    w.fused.value = True
    fused = w.plan.memory.activations
    assert fused < flash < base
    assert w.state.training().flash_attention and w.state.training().fused_swiglu
    assert "HFU" in w.verdict.value
    w.grads.value = "fp32"
    assert w.plan.memory.grads == 2 * w.plan.memory.weights  # 4 bytes vs 2, both sharded


def test_fp8_and_offload_controls_reach_the_plan():
    from workbench.ui.planner import PlannerWidget

    w = PlannerWidget(model="llama2-7b", gpu="h100-80gb", gpus=8, zero=2)
    assert w.plan.memory.host == 0
    w.offload_opt.value = True
    assert w.plan.memory.optimizer == 0 and w.plan.memory.host > 0
    w.fp8.value = True
    w.offload_act.value = True
    t = w.state.training()
    assert t.fp8 and t.offload_optimizer and t.offload_activations


def test_zero3_fetch_dropdown_switches_to_deepspeeds_module_by_module_zero3():
    w = PlannerWidget(model="llama2-70b", gpus=512, zero=3, recompute="full")
    layer = w.plan.time.total
    w.zero3_prefetch.value = "module"
    assert w.state.zero3_prefetch == "module"
    assert w.plan.training.zero3_prefetch == "module"
    assert w.plan.time.total > layer
