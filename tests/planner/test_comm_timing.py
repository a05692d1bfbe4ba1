"""Collective cost model, link choice, and the step-time decomposition."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workbench.planner import (
    LinkSpec,
    ModelSpec,
    TrainingSpec,
    all_gather_time,
    all_reduce_time,
    group_link,
    hardware_preset,
    plan,
    reduce_scatter_time,
)
from workbench.planner.sweep import scaling


@settings(max_examples=50, deadline=None)
@given(
    size=st.integers(1, 10**10),
    n=st.integers(2, 1024),
    bw=st.floats(1e8, 1e12),
    alpha=st.floats(0, 1e-3),
)
def test_ring_formulas(size, n, bw, alpha):
    link = LinkSpec(bandwidth=bw, latency=alpha)
    ar = 2 * (n - 1) / n * size / bw + 2 * (n - 1) * alpha
    ag = (n - 1) / n * size / bw + (n - 1) * alpha
    assert all_reduce_time(size, n, link) == pytest.approx(ar, rel=1e-12)
    assert all_gather_time(size, n, link) == pytest.approx(ag, rel=1e-12)
    assert reduce_scatter_time(size, n, link) == pytest.approx(ag, rel=1e-12)
    assert all_reduce_time(size, 1, link) == 0.0


def test_group_link_picks_inter_node_only_when_the_group_spans_nodes():
    hw = hardware_preset("h100-80gb")  # 8 GPUs per node
    assert group_link(hw, 8, 1) is hw.intra  # TP 8, contiguous: one node
    assert group_link(hw, 16, 1) is hw.inter
    assert group_link(hw, 2, 4) is hw.intra  # dp 2 with tp 4: ranks 0 and 4
    assert group_link(hw, 2, 8) is hw.inter  # dp 2 with tp 8: ranks 0 and 8


MODEL = ModelSpec(name="1B", layers=16, hidden=2048, heads=16, vocab=32000, seq=2048)


def test_single_gpu_step_is_pure_compute_at_the_set_mfu():
    """Papers' FLOPs: 6·N_matmul (blocks and head, not the embedding lookup) + 12·L·s·h
    of attention per token; at the set efficiency the achieved MFU is that efficiency."""
    hw = hardware_preset("a100-80gb")
    p = plan(MODEL, hw, micro_batch=4, mfu=0.5)
    tokens, s, h, L = 4 * 2048, 2048, 2048, 16
    n_mm = MODEL.n_params - 32000 * h - L * 4 * h - 2 * h  # embedding lookup, LayerNorms
    expected = (6 * n_mm + 12 * L * s * h) * tokens / (0.5 * hw.peak_flops)
    assert p.time.total == pytest.approx(expected, rel=1e-12)
    assert p.tokens_per_s == pytest.approx(tokens / expected, rel=1e-12)
    assert p.time.mfu == pytest.approx(0.5, rel=1e-12)
    assert p.time.hfu == pytest.approx(0.5, rel=1e-12)
    full = plan(MODEL, hw, micro_batch=4, mfu=0.5, recompute="full")
    executed = (8 * n_mm + 16 * L * s * h) * tokens / (0.5 * hw.peak_flops)
    assert full.time.total == pytest.approx(executed, rel=1e-12)
    assert full.time.hfu == pytest.approx(0.5, rel=1e-12)
    assert full.time.mfu == pytest.approx(0.5 * expected / executed, rel=1e-12)


def test_data_parallel_all_reduce_is_exposed_without_overlap():
    hw = hardware_preset("a100-80gb")
    p = plan(MODEL, hw, gpus=16, overlap=0.0)  # 2 nodes: the ring crosses IB
    grads = MODEL.n_params * 2  # bf16 gradients
    ring = 2 * 15 / 16 * grads / hw.inter.bandwidth + 2 * 15 * hw.inter.latency
    assert p.time.dp_comm == pytest.approx(ring, rel=1e-12)
    assert p.time.total == pytest.approx(p.time.compute + ring, rel=1e-12)


def test_tp_all_reduces_per_layer():
    hw = hardware_preset("h100-80gb")
    p = plan(MODEL, hw, tp=4, micro_batch=2)
    act = 2 * 2048 * 2048 * 2  # s·b·h bf16 elements
    per = 2 * 3 / 4 * act / hw.intra.bandwidth + 2 * 3 * hw.intra.latency
    assert p.time.tp_comm == pytest.approx(16 * 4 * per, rel=1e-12)


def test_pipeline_bubble_fraction():
    hw = hardware_preset("h100-80gb")
    for m in (4, 8, 16):
        p = plan(MODEL, hw, pp=4, micro_batches=m)
        assert p.time.bubble / p.time.compute == pytest.approx(3 / m, rel=1e-12)
    v = plan(MODEL, hw, pp=4, micro_batches=8, schedule="interleaved", virtual_stages=2)
    assert v.time.bubble / v.time.compute == pytest.approx(3 / 16, rel=1e-12)


def test_scaling_efficiency_drops_when_communication_leaves_the_node():
    hw = hardware_preset("a100-80gb", inter="25gbe")
    pts = scaling(MODEL, hw, TrainingSpec(overlap=0.0), gpus=(1, 2, 4, 8, 16, 32))
    eff = {p.gpus: p.efficiency for p in pts}
    assert eff[1] == 1.0
    assert all(eff[a] >= eff[b] for a, b in ((1, 2), (2, 4), (4, 8), (8, 16), (16, 32)))
    # Crossing from NVLink to 25 GbE costs far more than any step inside the node.
    assert eff[8] - eff[16] > 5 * (eff[4] - eff[8])
    assert pts[-1].nodes == 4
