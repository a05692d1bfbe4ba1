"""ZeRO-3 module by module (``zero3_prefetch='module'``): the trace, the reuse rule, the
one-ahead prefetch walk and the reduce-scatter, each checked on given inputs."""

from __future__ import annotations

import pytest

from workbench.errors import ConfigError
from workbench.planner import ModelSpec, ParallelSpec, TrainingSpec, evaluate, hardware_preset
from workbench.planner.comm import all_gather_time
from workbench.planner.zero3_modules import (
    MAX_LIVE_PARAMETERS,
    PREFETCH_BUCKET,
    _edges,
    _trace,
    _Use,
    _walk,
    layer_linears,
)

A100 = hardware_preset("a100-80gb")
GPT3 = ModelSpec(name="gpt3", layers=96, hidden=12288, heads=96, vocab=51200, seq=2048)
SMALL = ModelSpec(name="small", layers=12, hidden=1024, heads=16, vocab=51200, seq=2048)


def _uses(model: ModelSpec, recompute: str = "full") -> list[_Use]:
    """The traced micro-batch of a 1536-GPU ZeRO-3 plan of ``model``."""
    from workbench.planner.compute_time import compute_efficiency, stage_compute
    from workbench.planner.specs import StepInputs

    training = TrainingSpec(recompute=recompute, zero3_prefetch="module")
    parallel = ParallelSpec(dp=1536, zero=3)
    eff, _ = compute_efficiency(training, A100)
    work = stage_compute(model, training, parallel, 2048, 1, rate=eff * A100.peak_flops)
    step = StepInputs(model, training, parallel, A100, 2048, 1)
    return _trace(step, work, _edges(step, work))


def test_a_gpt_layer_is_four_linears_in_forward_order_split_by_tp():
    h = 12288
    assert layer_linears(GPT3) == (3 * h * h, h * h, 4 * h * h, 4 * h * h)
    assert layer_linears(GPT3, tp=8) == (3 * h * h // 8, h * h // 8, h * h // 2, h * h // 2)


def test_gpt3_under_full_recompute_gathers_every_linear_three_times_but_the_last():
    uses = _uses(GPT3, "full")
    # forward, recompute forward and backward of each layer; embedding and head twice each
    assert len(uses) == 96 * 12 + 4
    # Reuse distance from the recompute forward to the backward, 2 x the later Linears:
    # 0 for the MLP down (kept), 8h^2 = 1.2e9 > 1e9 for the MLP up (gathered again).
    layer0_bwd = uses[-5:-1]  # backward of layer 0: down, up, out, qkv
    assert [u.gathered for u in layer0_bwd] == [False, True, True, True]
    # the head's backward follows its forward (kept); the embedding is 190B params away
    assert sum(u.gathered for u in uses) == 96 * (4 + 4 + 3) + 3


def test_a_small_model_stays_gathered_after_its_first_use():
    # 12 layers x 12.6M params: every reuse is within 1e9 parameters.
    uses = _uses(SMALL)
    assert sum(u.gathered for u in uses) == 12 * 4 + 2  # every Linear, embedding, head


def test_without_recompute_the_backward_reuses_the_forward_gather_only_near_the_turn():
    tiny_vocab = GPT3.with_(vocab=1024)  # the head between the two uses is 12.6M
    uses = _uses(tiny_vocab, "none")
    assert len(uses) == 96 * 8 + 4
    last_layer = uses[1 + 96 * 4 + 2 :][:4]  # its backward: down, up, out, qkv
    # down: only the head between (kept); up: 2 x 4h^2 = 1.2e9 apart (gathered again)
    assert [u.gathered for u in last_layer] == [False, True, True, True]
    assert all(u.gathered for u in uses[-5:-1])  # layer 0: 174B parameters ago


def test_one_ahead_prefetch_hides_each_gather_behind_the_previous_compute():
    big = PREFETCH_BUCKET * 2  # one weight fills the prefetch bucket
    comm_bound = [_Use(i, big, 1.0) for i in range(3)]
    # first gather on demand (2), then max(compute, next gather) twice, the last compute
    assert _walk(comm_bound, {big: 2.0}) == (2 + 2 + 2 + 1, 6.0)
    compute_bound = [_Use(i, big, 3.0) for i in range(3)]
    assert _walk(compute_bound, {big: 2.0}) == (2 + 3 + 3 + 3, 6.0)


def test_small_weights_are_prefetched_together_up_to_the_bucket():
    small = PREFETCH_BUCKET // 4
    uses = [_Use(i, small, 1.0) for i in range(3)]
    # use 0 on demand (2); uses 1 and 2 in one batch (4) landing at 6; computes 1 each
    assert _walk(uses, {small: 2.0}) == (2 + 4 + 1 + 1, 6.0)


def test_past_max_live_parameters_nothing_is_prefetched():
    huge = MAX_LIVE_PARAMETERS
    uses = [_Use(i, huge, 1.0) for i in range(2)]
    assert _walk(uses, {huge: 2.0}) == (2 + 1 + 2 + 1, 4.0)


def test_the_gradient_reduce_scatter_is_never_hidden():
    training = TrainingSpec(micro_batch=4, recompute="full", zero3_prefetch="module", mfu=0.01)
    t = evaluate(GPT3, training, ParallelSpec(dp=384, zero=3), A100).time
    embedding = GPT3.vocab * GPT3.hidden  # and the (untied) head, as big

    def seconds(params: int) -> float:
        return all_gather_time(params * 2, 384, A100.inter)

    rs = 96 * sum(seconds(p) for p in layer_linears(GPT3)) + 2 * seconds(embedding)
    # At 1% of peak the compute hides every gather but the first two: the embedding's and
    # the first QKV's (the lookup between them computes nothing). The reduce-scatter stays.
    first = seconds(embedding) + seconds(layer_linears(GPT3)[0])
    assert t.dp_exposed == pytest.approx(first + rs, rel=1e-9)


def test_module_prefetch_is_slower_than_layer_prefetch_where_gathers_dominate():
    def step(mode: str) -> float:
        training = TrainingSpec(recompute="full", zero3_prefetch=mode)
        return evaluate(GPT3, training, ParallelSpec(dp=1536, zero=3), A100).time.total

    assert step("module") > 1.3 * step("layer")


def test_an_unknown_prefetch_mode_names_the_choices():
    with pytest.raises(ConfigError, match="zero3_prefetch.*layer.*module"):
        TrainingSpec(zero3_prefetch="stage")
