"""The planner's Placement arithmetic on its own (no torch): FSDP's padded and unpadded
shards, ZeRO-1's greedy whole-parameter partition, per-rank memory, interleaved chunks."""

from __future__ import annotations

import pytest

from workbench.errors import ConfigError, ParallelError
from workbench.planner import ModelSpec, ParallelSpec, TrainingSpec, evaluate, hardware_preset
from workbench.planner.activations import chunk_inflight
from workbench.planner.memory import rank_position
from workbench.planner.placement import Piece, Placement, zero1_shares

HW = hardware_preset("a100-80gb")
MODEL = ModelSpec(name="m", layers=2, hidden=64, heads=4, vocab=128, seq=32)
FP32 = TrainingSpec(precision="fp32", optimizer="adamw", micro_batch=1)


def test_fsdp_pads_dim0_and_the_last_rank_holds_the_remainder():
    p = Piece(numel=3 * 5, rows=3)
    assert [p.shard(2), p.shard(4)] == [10, 5]  # ceil(3/2) and ceil(3/4) rows of 5
    assert [p.local(2, r) for r in range(2)] == [10, 5]
    assert [p.local(4, r) for r in range(4)] == [5, 5, 5, 0]
    assert Piece(numel=1, rows=1).shard(8) == 1


def test_zero1_places_whole_parameters_largest_first_on_the_emptiest_rank():
    pieces = tuple(Piece(numel=n, rows=n) for n in (10, 7, 5, 5, 3))
    # 10 -> r0; 7 -> r1; 5 -> r1 (7 < 10); 5 -> r0 (10 < 12); 3 -> r1 (12 < 15)
    assert zero1_shares(pieces, 2) == [15, 15]
    assert zero1_shares((*pieces, Piece(numel=4, rows=4, trainable=False)), 3) == [10, 10, 10]


def _placement() -> Placement:
    stage0 = (Piece(numel=30, rows=3), Piece(numel=8, rows=8))
    stage1 = (Piece(numel=20, rows=5), Piece(numel=1, rows=1))
    return Placement(stages=(stage0, stage1), layers=(1, 1))


def test_each_rank_gets_its_own_stage_and_share():
    layout = ParallelSpec(dp=2, pp=2, zero=1, micro_batches=2)
    plan = evaluate(MODEL, FP32, layout, HW, placement=_placement())
    assert rank_position(layout, 3) == (1, 1)
    # Stage 0, ZeRO-1 over 2: the 30-element parameter on rank 0, the 8 on rank 1.
    assert plan.rank_memory(0).optimizer == 8 * 30 and plan.rank_memory(1).optimizer == 8 * 8
    assert plan.rank_memory(2).weights == 4 * 21  # stage 1
    assert plan.memory.total == max(plan.rank_memory(r).total for r in range(4))
    with pytest.raises(ConfigError, match="rank=4 is not valid"):
        plan.rank_memory(4)
    with pytest.raises(ParallelError, match="2 pipeline stage"):
        evaluate(MODEL, FP32, ParallelSpec(dp=2), HW, placement=_placement())


def test_fsdp_state_per_rank():
    layout = ParallelSpec(dp=2, pp=2, zero=3, micro_batches=2)
    plan = evaluate(MODEL, FP32, layout, HW, placement=_placement())
    m = plan.rank_memory(0)
    assert (m.weights, m.grads) == (4 * (20 + 4), 4 * (20 + 4))  # padded shards
    assert plan.rank_memory(1).optimizer == 8 * (10 + 4)  # unpadded: 1 of 3 rows, 4 of 8
    gathered = evaluate(MODEL, FP32, layout.with_(zero=2), HW, placement=_placement())
    assert gathered.rank_memory(0).weights == 4 * (40 + 8)  # padded all-gather outputs


def test_interleaved_chunks_in_flight_follow_megatrons_order():
    # 2 stages x 2 chunks, 4 micro-batches: stage 0 warms up 2(2-0-1) + (2-1)2 = 4, + 1.
    assert chunk_inflight((1, 1), 2, 0, 4) == (5, 3, 2)
    assert chunk_inflight((0, 1), 2, 0, 4) == (2, 3, 2)  # an embedding-only first chunk
    assert chunk_inflight((1, 1), 2, 1, 4) == (3, 2, 1)
    with pytest.raises(ConfigError, match="chunks="):
        Placement(stages=((), ()), layers=(1, 1), chunks=((1,), (1, 0)))
