"""Model state per the bytes-per-parameter table and ZeRO; activations per Korthikanti."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workbench.planner import (
    ModelSpec,
    ParallelSpec,
    TrainingSpec,
    layer_activation_bytes,
    model_state_bytes,
    plan,
)

PSI = 7_000_000_000  # a 7B model given by its parameter count
SEVEN_B = ModelSpec(name="7B", params=PSI, vocab=32000, seq=2048)
MIXED = TrainingSpec(precision="bf16-mixed", optimizer="adam", recompute="full")


def test_7b_mixed_adam_is_16_bytes_per_param_and_ooms_on_80gb():
    p = plan(SEVEN_B, "a100-80gb", gpus=1, training=MIXED)
    assert p.memory.model_state == 16 * PSI == 112e9
    assert (p.memory.weights, p.memory.grads, p.memory.optimizer) == (2 * PSI, 2 * PSI, 12 * PSI)
    assert not p.fits
    assert p.memory.headroom < 0
    assert "OOM" in p.verdict


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_zero_stages_over_8_gpus(zero):
    """ZeRO paper: Ψ(2 + 2 + K) with stage 1 -> 2Ψ + 2Ψ + KΨ/N, stage 2 -> 2Ψ + (2+K)Ψ/N,
    stage 3 -> (2 + 2 + K)Ψ/N, K = 12 for mixed-precision Adam."""
    n, k = 8, 12
    expected = {
        0: (2 + 2 + k) * PSI,
        1: (2 + 2) * PSI + k * PSI / n,
        2: 2 * PSI + (2 + k) * PSI / n,
        3: (2 + 2 + k) * PSI / n,
    }[zero]
    p = plan(SEVEN_B, "a100-80gb", gpus=8, zero=zero, training=MIXED)
    assert p.memory.model_state == expected
    if zero == 3:
        assert p.memory.model_state == 14e9
        assert p.fits


@pytest.mark.parametrize(
    ("precision", "optimizer", "per_param"),
    [
        ("fp32", "adamw", (4, 4, 8)),
        ("fp32", "adam", (4, 4, 8)),
        ("fp32", "sgd-momentum", (4, 4, 4)),
        ("fp32", "sgd", (4, 4, 0)),
        ("bf16-mixed", "adamw", (2, 2, 12)),
        ("bf16-mixed", "sgd-momentum", (2, 2, 8)),
    ],
)
def test_bytes_per_param_table(precision, optimizer, per_param):
    n = 12_345_677  # odd on purpose: no rounding hides anything
    t = TrainingSpec(precision=precision, optimizer=optimizer)
    got = model_state_bytes(ModelSpec(params=n, vocab=100, seq=16), t, ParallelSpec())
    assert got == tuple(b * n for b in per_param)


def test_fp32_grads_make_deepspeed_2_plus_18():
    t = TrainingSpec(precision="bf16-mixed", optimizer="adamw", fp32_grads=True)
    w, g, o = model_state_bytes(SEVEN_B, t, ParallelSpec())
    assert (w, g + o) == (2 * PSI, 18 * PSI)


def test_lora_keeps_optimizer_state_for_trainable_params_only():
    t = TrainingSpec(precision="bf16-mixed", optimizer="adamw", trainable=0.01)
    w, g, o = model_state_bytes(SEVEN_B, t, ParallelSpec())
    assert (w, g, o) == (2 * PSI, 2 * PSI // 100, 12 * PSI // 100)


def test_uneven_zero_shards_round_up():
    n = 1001
    t = TrainingSpec(precision="fp32", optimizer="adamw")
    w, g, o = model_state_bytes(ModelSpec(params=n, vocab=10, seq=8), t, ParallelSpec(dp=4, zero=3))
    assert (w, g, o) == (4 * 251, 4 * 251, 8 * 251)


dims = st.tuples(
    st.sampled_from([128, 512, 2048]),  # s
    st.integers(1, 8),  # b
    st.sampled_from([1, 2, 4, 8]),  # t
    st.sampled_from([(16, 1024), (32, 4096), (64, 8192)]),  # (a, h)
)


@settings(max_examples=60, deadline=None)
@given(dims)
def test_korthikanti_activation_formulas(d):
    s, b, t, (a, h) = d
    sbh = s * b * h

    def act(**kw):
        return layer_activation_bytes(s=s, b=b, h=h, a=a, tp=t, **kw)

    if t == 1:
        assert act() == pytest.approx(sbh * (34 + 5 * a * s / h), rel=1e-12)
    assert act() == pytest.approx(sbh * (10 + 24 / t + 5 * a * s / (h * t)), rel=1e-12)
    assert act(sequence_parallel=t > 1) == pytest.approx(
        sbh * (34 / t + 5 * a * s / (h * t)), rel=1e-12
    )
    assert act(recompute="selective") == pytest.approx(sbh * (10 + 24 / t), rel=1e-12)
    assert act(recompute="selective", sequence_parallel=t > 1) == pytest.approx(
        sbh * 34 / t, rel=1e-12
    )
    assert act(recompute="full") == pytest.approx(2 * sbh, rel=1e-12)


def test_activations_of_a_plan_scale_with_layers_and_micro_batch():
    model = ModelSpec(layers=4, hidden=256, heads=4, vocab=1000, seq=128)
    base = plan(model, "a100-80gb", micro_batch=1, dropout=False)
    double = plan(model, "a100-80gb", micro_batch=2, dropout=False)
    assert double.memory.activations == pytest.approx(2 * base.memory.activations, rel=1e-6)
    deeper = plan(model.with_(layers=8), "a100-80gb", dropout=False)
    layer_part = deeper.memory.activations - base.memory.activations
    assert layer_part == pytest.approx(base.memory.activations_layers, rel=1e-6)


def test_pipeline_1f1b_first_stage_holds_p_micro_batches():
    model = ModelSpec(layers=8, hidden=256, heads=4, vocab=1000, seq=128)
    one = plan(model, "a100-80gb", pp=1, micro_batches=8)
    four = plan(model, "a100-80gb", pp=4, micro_batches=8)
    gpipe = plan(model, "a100-80gb", pp=4, micro_batches=8, schedule="gpipe")
    # 2 of 8 layers per stage, 4 micro-batches in flight: the same layer activations as
    # one full model with one micro-batch (Korthikanti et al., section 4.2).
    assert four.memory.activations_layers == one.memory.activations_layers
    assert gpipe.memory.activations_layers == 2 * four.memory.activations_layers


def test_zero3_gathers_the_largest_unit_as_a_temporary_buffer():
    p = plan("llama3-8b", "h100-80gb", gpus=8, zero=3)
    # Llama-3's 128256 x 4096 embedding is bigger than a block: gathered in bf16 with its
    # bf16 gradient.
    assert p.memory.temporary == 128256 * 4096 * (2 + 2)


def test_vocab_parallel_off_keeps_the_embedding_whole_on_every_tp_rank() -> None:
    from workbench.planner import ModelSpec
    from workbench.planner.params import count_params, params_per_rank

    model = ModelSpec(name="m", layers=2, hidden=64, heads=4, vocab=1000, seq=32,
                      tied_embeddings=True)  # fmt: skip
    c = count_params(model)
    split = params_per_rank(model, tp=2)
    whole = params_per_rank(model, tp=2, vocab_parallel=False)
    # only the embedding's share changes: it is whole instead of halved
    assert whole - split == c.embedding - c.embedding // 2
    layer = c.layer_sharded // 2 + c.layer_replicated
    assert whole == c.embedding + c.positions + 2 * layer + c.final_norm + c.head
