"""Issue 16 options: uneven stages, per-stage memory, gradient dtype and sync, ZeRO-3
overlap per pass, context parallel, FLOPs as papers count them, the CPU profile."""

from __future__ import annotations

import pytest

from workbench.errors import ConfigError, ParallelError
from workbench.planner import (
    LinkSpec,
    ModelSpec,
    ParallelSpec,
    TrainingSpec,
    all_reduce_time,
    cpu_profile,
    fit_alpha_beta,
    layer_activation_bytes,
    plan,
)

MODEL = ModelSpec(name="m", layers=16, hidden=1024, heads=16, vocab=32000, seq=1024)


def test_uneven_stages_split_the_middle_evenly_and_reject_impossible_splits():
    assert ParallelSpec(pp=16, first_stage_layers=7, last_stage_layers=7).stage_layers(126) == (
        7, *([8] * 14), 7,
    )  # fmt: skip
    assert ParallelSpec(pp=4).stage_layers(10) == (3, 3, 2, 2)
    with pytest.raises(ParallelError, match="split evenly"):
        ParallelSpec(pp=4, first_stage_layers=3).stage_layers(16)
    with pytest.raises(ConfigError, match="need pp > 1"):
        ParallelSpec(first_stage_layers=3)


def test_memory_is_the_most_loaded_stage_not_only_the_first():
    # Llama 3's layout: stage 0 holds 7 layers x 16 micro-batches, stage 1 8 x 15 = 120.
    p = plan("llama3-405b", "h100-80gb", tp=8, pp=16, dp=64, zero=1, sequence_parallel=True,
             micro_batches=32, seq=8192, flash_attention=True, fused_swiglu=True,
             first_stage_layers=7, last_stage_layers=7)  # fmt: skip
    assert p.memory.stage == 1 and p.fits
    even = plan("llama3-405b", "h100-80gb", tp=8, pp=16, dp=64, zero=1, sequence_parallel=True,
                micro_batches=32, seq=8192, flash_attention=True, fused_swiglu=True)  # fmt: skip
    assert even.memory.stage == 0 and not even.fits


def test_flash_attention_and_fused_swiglu_activation_terms():
    kw = dict(s=2048, b=1, h=4096, a=32, ffn=11008, gated_mlp=True)
    base = layer_activation_bytes(**kw)
    fused = layer_activation_bytes(fused_swiglu=True, **kw)
    assert base - fused == 2 * 2048 * 11008  # one s·b·f bf16 tensor fewer
    flash = layer_activation_bytes(flash_attention=True, **kw)
    selective = layer_activation_bytes(recompute="selective", **kw)
    assert flash - selective == 4 * 32 * 2048  # the fp32 logsumexp per head and query


def test_grads_fp32_alone_is_18_bytes_per_param_and_sync_per_step_keeps_them_whole():
    t = TrainingSpec(grads="fp32")
    p = plan(MODEL, "a100-80gb", training=t)
    assert p.memory.model_state == 18 * MODEL.n_params
    with pytest.raises(ConfigError, match="fp32_grads=True means"):
        TrainingSpec(fp32_grads=True, grads="fp32")
    per_mb = plan(MODEL, "a100-80gb", gpus=8, zero=2, micro_batches=4)
    per_step = plan(MODEL, "a100-80gb", gpus=8, zero=2, micro_batches=4, grad_sync="per_step")
    assert per_mb.memory.grads == 2 * -(-MODEL.n_params // 8)  # sharded over 8
    assert per_step.memory.grads == 2 * MODEL.n_params  # accumulated whole until the step
    assert per_step.time.dp_comm < per_mb.time.dp_comm  # one reduce-scatter, not four


def test_zero3_hides_each_pass_only_behind_itself():
    from workbench.planner import all_gather_time, hardware_preset
    from workbench.planner.params import largest_unit

    link = LinkSpec(bandwidth=30e9, latency=0.0)
    hw = hardware_preset("a100-80gb", intra=link, inter=link)
    p = plan(MODEL, hw, gpus=8, zero=3, recompute="full", micro_batch=4, mfu=0.5)
    t = p.time
    # All traffic is less than all compute (hiding it all would expose nothing), but the
    # forward's gathers exceed the forward (1 of 4 passes under full recompute).
    assert t.dp_comm < t.compute
    n = MODEL.n_params
    ag = all_gather_time(2 * n, 8, link)
    unit = all_gather_time(2 * largest_unit(MODEL), 8, link)
    fwd, bwd = t.compute / 4, 3 * t.compute / 4
    expected = max(unit, ag - fwd) + max(unit, 2 * ag - bwd)  # rs (bf16) costs one ag
    assert t.dp_exposed == pytest.approx(expected, rel=1e-9)
    assert t.dp_exposed > 0.05 * t.compute


def test_context_parallel_splits_activations_and_adds_kv_traffic():
    one = plan(MODEL, "h100-80gb", gpus=8, tp=4, flash_attention=True, seq=8192)
    cp = plan(MODEL, "h100-80gb", gpus=8, tp=4, cp=2, flash_attention=True, seq=8192)
    assert cp.parallel.dp == 1 and cp.parallel.world == 8
    assert cp.memory.activations_layers == pytest.approx(one.memory.activations_layers / 2,
                                                         rel=1e-9)  # fmt: skip
    assert cp.time.cp_comm > 0 and one.time.cp_comm == 0


def test_cpu_profile_reproduces_the_measured_step_and_adds_the_fixed_part():
    model = ModelSpec(name="tiny", layers=2, hidden=64, heads=4, vocab=100, seq=64)
    fit = fit_alpha_beta(
        [(s, all_reduce_time(s, 2, LinkSpec(bandwidth=1e9, latency=1e-4)))
         for s in (4096, 65536, 1 << 20)]
    )  # fmt: skip
    train = TrainingSpec(micro_batch=16, seq=64, precision="fp32", dropout=False)
    hw = cpu_profile(fit, model, train, seq=64, step_s=0.074, outside_s=0.012)
    one = plan(model, hw, training=train)
    assert one.time.total == pytest.approx(0.074, rel=1e-9)
    two = plan(model, hw, gpus=2, training=train.with_(micro_batch=8))
    assert hw.max_overlap == 0.0  # gloo shares the cores: nothing hides
    assert two.time.total == pytest.approx(0.062 / 2 + 0.012 + two.time.dp_comm, rel=1e-9)
    with pytest.raises(ConfigError, match="outside_s"):
        cpu_profile(fit, model, train, seq=64, step_s=0.01, outside_s=0.02)
