"""``plan_from`` on a model the test defines: parameters counted on the meta device,
activations measured from one small traced forward and extrapolated by the planner's
formula; each number says how it was obtained. No processes: everything runs here."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from tests.parallel import _user_models as um
from workbench.errors import ConfigError
from workbench.parallel.planning.measure import first_batch, measure_activations
from workbench.parallel.planning.plan_from import plan_from
from workbench.parallel.planning.run_plan import LOCAL_CPU
from workbench.planner import ParallelSpec, TrainingSpec, evaluate, model_preset

# The measured size itself, planned on one local CPU rank in the measured precision.
SAME = {"gpus": 1, "gpu": LOCAL_CPU, "precision": "fp32", "micro_batch": 4}


def _measure(seq: int, batch: int = 4, model: nn.Module | None = None) -> int:
    x = um.make_data().x[:batch, :seq].clone()  # a view would count the whole data set
    measured = measure_activations(
        model or um.make_model(), (x, (x + 1) % um.VOCAB), loss=um.lm_loss
    )
    return measured.total_bytes


def test_measured_size_is_reproduced_exactly() -> None:
    r = plan_from(
        um.make_model, data=um.make_data, loss=um.lm_loss, batch_size=4, seq_len=um.SEQ, **SAME
    )
    # The measured run's own size: the calibrated formula gives back the measured bytes.
    assert r.plan.memory.activations == math.ceil(r.measurement.total_bytes)
    assert r.measurement.total_bytes == _measure(um.SEQ)
    assert r.measurement.stores_scores is True  # TinyLM's math attention keeps s x s scores


@pytest.mark.parametrize(("seq", "batch"), [(4, 4), (8, 2), (4, 8)])
def test_other_sizes_are_extrapolated_within_two_percent(seq: int, batch: int) -> None:
    big = um.TinyLM  # measured at batch 4 x seq 8; planned at another size
    r = plan_from(
        big, data=um.make_data, loss=um.lm_loss, batch_size=4, seq_len=seq,
        **{**SAME, "micro_batch": batch},
    )  # fmt: skip
    measured = _measure(seq, batch)
    assert abs(r.plan.memory.activations - measured) / measured <= 0.02, (
        r.plan.memory.activations,
        measured,
    )


def test_a_smaller_variant_measures_for_a_model_too_big_to_build() -> None:
    def big() -> nn.Module:
        return um.TinyLM(blocks=24)

    def small() -> nn.Module:
        return um.TinyLM(blocks=1)

    r = plan_from(big, measure_with=small, data=um.make_data, loss=um.lm_loss, batch_size=4,
                  seq_len=um.SEQ, **SAME)  # fmt: skip
    assert r.plan.model.n_params == sum(p.numel() for p in big().parameters())
    assert r.plan.model.layers == 24 and r.measurement.layers == 1
    direct = _measure(um.SEQ, model=big())
    assert abs(r.plan.memory.activations - direct) / direct <= 0.01


def test_cluster_plan_changes_only_what_was_measured() -> None:
    r = plan_from(um.make_model, data=um.make_data, loss=um.lm_loss, gpus=64, gpu="h100-80gb",
                  tp=2, zero=3, seq_len=4096)  # fmt: skip
    plan, formula = r.plan, r.formula_plan
    assert plan.parallel.dp == 32 and plan.parallel.tp == 2 and plan.parallel.zero == 3
    assert plan.training.precision == "bf16-mixed" and plan.seq == 4096
    n = plan.model.n_params
    # Model state is the planner's arithmetic on the counted parameters (bf16 mixed
    # AdamW: 2 bytes of weights, sharded over tp then over dp by ZeRO-3).
    assert plan.memory.model_state == formula.memory.model_state
    assert plan.memory.weights == math.ceil(math.ceil(n * _tp_share(plan)) / 32) * 2
    assert plan.memory.activations != formula.memory.activations  # scaled by the measurement
    assert r.scale[0] == pytest.approx(r.measurement.layer_bytes / _formula_layer(r), rel=1e-9)
    hows = {row["quantity"]: row["how"] for row in r.rows}
    assert hows["parameters"].startswith("counted")
    assert hows["activations / token / layer (small run)"].startswith("measured")
    assert hows["activations / GPU"].startswith("extrapolated")
    assert hows["step time"].startswith("extrapolated")
    assert "measured" in str(r) and "extrapolated" in str(r) and "h100-80gb" in repr(r)


def _tp_share(plan: object) -> float:
    from workbench.planner import stage_params

    p = plan.parallel  # type: ignore[attr-defined]
    m = plan.model  # type: ignore[attr-defined]
    return stage_params(m, p.tp, vocab_parallel=p.vocab_parallel)[0] / m.n_params


def _formula_layer(r: object) -> float:
    from workbench.parallel.planning.spec_from_model import user_model_spec
    from workbench.planner.memory import activation_bytes

    x = r.measurement  # type: ignore[attr-defined]
    spec = user_model_spec(um.make_model, seq=x.seq)
    t = TrainingSpec(micro_batch=x.batch, seq=x.seq, precision="fp32", dropout=False)
    layers, _ = activation_bytes(spec, t, ParallelSpec(), LOCAL_CPU, seq=x.seq, micro_batches=1)
    return layers / spec.layers


def test_an_oom_is_predicted_when_activations_outgrow_the_gpu() -> None:
    r = plan_from(um.make_model, data=um.make_data, loss=um.lm_loss, gpus=8, gpu="h100-80gb",
                  seq_len=32768, micro_batch=64)  # fmt: skip
    assert not r.fits and r.verdict.startswith("OOM")
    assert r.plan.memory.activations > r.plan.memory.capacity


def test_sdpa_model_keeps_no_scores_and_is_planned_without_them() -> None:
    pytest.importorskip("transformers")
    from workbench.parallel.hf import causal_lm_loss, tiny_llama

    r = plan_from(tiny_llama, data=um.make_data, loss=causal_lm_loss, batch_size=4,
                  seq_len=um.SEQ, **SAME)  # fmt: skip
    assert r.measurement.stores_scores is False
    assert r.plan.training.flash_attention  # no s x s term on the target either
    assert r.plan.memory.activations == math.ceil(r.measurement.total_bytes)
    assert r.shape_sources["heads"] == "config.num_attention_heads"


# -- bad input: one clear error, before anything is built -----------------------------------


@pytest.mark.parametrize("bad", [0, -4, 2.5, float("nan"), True, 10**30])
def test_bad_seq_len_is_refused(bad: object) -> None:
    if bad == 10**30:  # huge but an integer: the planner's arithmetic takes it; OOM says so
        r = plan_from(um.make_model, data=um.make_data, seq_len=bad, gpus=1)  # type: ignore[arg-type]
        assert not r.fits
        return
    with pytest.raises(ConfigError, match="seq_len"):
        plan_from(um.make_model, data=um.make_data, seq_len=bad)  # type: ignore[arg-type]


def test_missing_batch_and_bad_batch_size() -> None:
    with pytest.raises(ConfigError, match="sample=.*data="):
        plan_from(um.make_model)
    with pytest.raises(ConfigError, match="batch_size"):
        plan_from(um.make_model, data=um.make_data, batch_size=0)


def test_too_big_to_measure_asks_for_a_smaller_variant() -> None:
    def huge() -> nn.Module:
        return nn.Sequential(nn.ModuleList([nn.Linear(40000, 40000)]))

    with pytest.raises(ConfigError, match="measure_with="):
        plan_from(huge, sample=torch.zeros(1, 4))


def test_model_without_blocks_and_bad_sample() -> None:
    with pytest.raises(ConfigError, match="no repeated blocks"):
        plan_from(lambda: nn.Linear(4, 4), sample=torch.zeros(2, 4))
    with pytest.raises(ConfigError, match="sample="):
        plan_from(um.make_model, sample="tokens")


def test_planner_settings_are_checked_by_the_planner() -> None:
    with pytest.raises(ConfigError, match=r"plan: unknown option .warp.; valid options: "):
        plan_from(um.make_model, data=um.make_data, warp=3)
    with pytest.raises(ConfigError, match="h100"):
        plan_from(um.make_model, data=um.make_data, gpu="h1000")


def test_activation_scale_is_validated() -> None:
    spec = model_preset("llama2-7b")
    t, p = TrainingSpec(seq=128), ParallelSpec()
    with pytest.raises(ConfigError, match="activation_scale"):
        evaluate(spec, t, p, LOCAL_CPU, activation_scale=(float("nan"), 1.0))
    base = evaluate(spec, t, p, LOCAL_CPU)
    double = evaluate(spec, t, p, LOCAL_CPU, activation_scale=(2.0, 1.0))
    assert double.memory.activations_layers == 2 * base.memory.activations_layers
    assert double.memory.model_state == base.memory.model_state


def test_first_batch_takes_every_data_form() -> None:
    ds = um.make_data()
    assert first_batch(ds, 3)[0].shape == (3, um.SEQ)
    assert first_batch(um.make_data, 2)[0].shape == (2, um.SEQ)

    def batches(rank: int, size: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [(ds.x[:5], ds.x[:5])]

    assert first_batch(batches, 2)[0].shape == (5, um.SEQ)
    with pytest.raises(ConfigError, match="int"):
        first_batch(lambda: 3, 2)


def test_a_sample_sliced_from_a_data_set_counts_only_itself() -> None:
    x = um.make_data().x  # 128 samples; the sample below is a view of 4 of them
    sliced = measure_activations(um.make_model(), (x[:4], (x[:4] + 1) % um.VOCAB), loss=um.lm_loss)
    assert sliced.total_bytes == _measure(um.SEQ)


def test_target_layout_places_the_models_own_parameters() -> None:
    """Model state at the target is the model's parameters as the layout places them (the
    placement the tracer agrees with to the byte, tests/parallel/test_planner_layouts.py),
    not the count divided: the TP plan leaves the embedding, head and norms whole."""
    from workbench.parallel.parallelize import Layout
    from workbench.parallel.placement import module_placement

    r = plan_from(um.make_model, data=um.make_data, loss=um.lm_loss, gpus=8, gpu="h100-80gb",
                  tp=2, zero=3, tp_plan=um.TP_PLAN, precision="fp32")  # fmt: skip
    placement = module_placement(um.make_model(), Layout(tp=2, zero=3, tp_plan=um.TP_PLAN), 8)
    shards = sum(p.shard(4) for p in placement.stages[0])
    assert r.placed and r.plan.memory.weights == 4 * shards
    assert r.plan.memory.weights > 4 * math.ceil(r.plan.model.n_params / 8)  # whole parts
    assert all("counted" in row["how"] for row in r.rows if row["quantity"] == "grads / GPU")
    # A layout the model cannot take (no TP plan given or found) falls back to the count.
    fallback = plan_from(um.make_model, data=um.make_data, loss=um.lm_loss, gpus=8, tp=2, zero=3)
    assert not fallback.placed and any("cannot place" in n for n in fallback.notes)
