"""Sweeps enumerate valid layouts; the recommendation is the fastest-then-simplest fit."""

from __future__ import annotations

import itertools

from workbench.planner import (
    ModelSpec,
    ParallelSpec,
    TrainingSpec,
    evaluate,
    hardware_preset,
    layouts,
    model_preset,
    recommend,
    sweep,
)


def test_layouts_are_valid_and_complete():
    model = model_preset("llama2-7b")
    hw = hardware_preset("h100-80gb")
    got = {(p.dp, p.tp, p.pp, p.zero) for p in layouts(16, model, hw)}
    expected = set()
    for tp, pp in itertools.product((1, 2, 4, 8, 16), repeat=2):
        if 16 % (tp * pp) or tp > 8 or 32 % tp or 32 % pp:
            continue
        dp = 16 // (tp * pp)
        expected |= {(dp, tp, pp, z) for z in ((0, 1, 2, 3) if dp > 1 else (0,))}
    assert got == expected


def test_sweep_matches_evaluate_one_by_one():
    model = ModelSpec(layers=8, hidden=512, heads=8, vocab=1000, seq=256)
    hw = hardware_preset("a100-40gb")
    t = TrainingSpec(micro_batch=2)
    plans = sweep(model, hw, t, gpus=(1, 2, 4), recompute=("none", "full"))
    assert len(plans) == len({(p.gpus, p.layout()) for p in plans})
    for p in plans[::7]:
        again = evaluate(model, p.training, p.parallel, hw)
        assert again.memory == p.memory and again.time == p.time


def test_recommendation_is_the_fastest_fit_within_two_percent_and_keeps_tp_in_a_node():
    model = model_preset("llama2-13b")
    hw = hardware_preset("a100-80gb")
    rec = recommend(model, hw, 32)
    best = rec.best
    assert best is not None and best.fits and best.gpus == 32
    assert best.parallel.tp <= hw.gpus_per_node
    fitting = [p for p in rec.ranked]
    assert fitting and all(p.fits for p in fitting)
    fastest = max(p.tokens_per_s for p in fitting)
    assert best.tokens_per_s >= 0.98 * fastest
    assert any("Recommended" in r for r in rec.reasons)
    assert rec.min_gpus is not None and rec.min_gpus <= 32


def test_recommendation_says_what_to_buy_when_nothing_fits():
    rec = recommend(model_preset("llama3-70b"), hardware_preset("rtx4090"), 4)
    assert rec.best is None
    text = str(rec)
    assert "Nothing fits" in text and f"{rec.min_gpus} GPUs" in text
    # The suggested count really fits.
    more = recommend(model_preset("llama3-70b"), hardware_preset("rtx4090"), rec.min_gpus)
    assert more.best is not None


def test_lora_prototype_fits_one_card_where_full_training_does_not():
    model, hw = model_preset("llama2-7b"), hardware_preset("rtx4090")
    full = recommend(model, hw, 1, TrainingSpec(seq=2048))
    lora = recommend(model, hw, 1, TrainingSpec(seq=2048, trainable=0.01))
    assert full.best is None and lora.best is not None
    assert lora.best.parallel == ParallelSpec(dp=1)
