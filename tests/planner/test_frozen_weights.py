"""The planner's frozen weights: the part of the weights without gradients or optimizer
state (``trainable`` < 1, or a placement's frozen pieces), sharded as the weights are."""

from __future__ import annotations

from workbench.planner import ModelSpec, ParallelSpec, TrainingSpec, plan
from workbench.planner.placement import Piece, Placement

PSI = 7_000_000_000
SEVEN_B = ModelSpec(name="7B", params=PSI, vocab=32000, seq=2048)


def test_frozen_weights_are_the_weights_not_trained() -> None:
    full = TrainingSpec(precision="bf16-mixed", optimizer="adamw")
    lora = TrainingSpec(precision="bf16-mixed", optimizer="adamw", trainable=0.01)
    assert plan(SEVEN_B, "h100-80gb", training=full, parallel=ParallelSpec()).memory.frozen == 0
    one = plan(SEVEN_B, "h100-80gb", training=lora, parallel=ParallelSpec()).memory
    assert one.frozen == 2 * (PSI - PSI // 100) and one.weights == 2 * PSI
    sharded = plan(SEVEN_B, "h100-80gb", training=lora, parallel=ParallelSpec(dp=8, zero=3)).memory
    assert sharded.frozen == 2 * -(-(PSI - PSI // 100) // 8)
    assert sharded.as_dict()["frozen"] == sharded.frozen


def test_a_placement_counts_its_frozen_pieces_padded_as_fsdp_shards_them() -> None:
    pieces = (Piece(numel=15, rows=5, trainable=False), Piece(numel=4, rows=2))
    placement = Placement(stages=(pieces,), layers=(1,))
    assert placement.frozen_elements(0, group=1, zero=0) == 15
    assert placement.frozen_elements(0, group=2, zero=3) == 3 * 3  # ceil(5 / 2) rows of 3
    assert placement.frozen_elements(0, group=2, zero=2) == 3 * 3 * 2
