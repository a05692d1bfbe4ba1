"""Planner figures show the plan's numbers (GB per category, throughput, efficiency)."""

from __future__ import annotations

import plotly.graph_objects as go
import pytest

from workbench.planner import ParallelSpec, TrainingSpec, hardware_preset, plan
from workbench.planner.sweep import scaling
from workbench.plots.planner import (
    MEMORY_PARTS,
    memory_breakdown_figure,
    memory_vs_model_size_figure,
    scaling_figure,
)


def test_memory_breakdown_bars_stack_to_the_plan_total():
    plans = [
        plan(params=7e9, hardware="a100-80gb", gpus=8, zero=z, recompute="full") for z in (0, 3)
    ]
    fig = memory_breakdown_figure(plans, labels=["zero0", "zero3"])
    assert isinstance(fig, go.Figure)
    bars = [t for t in fig.data if t.type == "bar"]
    assert [t.name for t in bars] == [label for _, label, _ in MEMORY_PARTS]
    for i, p in enumerate(plans):
        assert sum(t.y[i] for t in bars) == pytest.approx(p.memory.total / 1e9)
    limit = next(t for t in fig.data if t.name == "usable memory")
    assert limit.y[0] == pytest.approx(plans[0].memory.capacity / 1e9)
    assert "OOM" in fig.layout.title.text and "fits" in fig.layout.title.text


def test_scaling_figure_plots_throughput_and_efficiency():
    hw = hardware_preset("a100-80gb")
    pts = scaling(plan("gpt2-xl").model, hw, TrainingSpec(seq=1024), gpus=(1, 2, 4, 8, 16))
    fig = scaling_figure(pts)
    by_name = {t.name: t for t in fig.data}
    assert list(by_name["tokens/s"].y) == pytest.approx([p.tokens_per_s for p in pts])
    assert list(by_name["efficiency"].y) == pytest.approx([p.efficiency for p in pts])
    assert by_name["linear"].y[-1] == pytest.approx(16 * pts[0].tokens_per_s)
    two = scaling_figure({"a": pts, "b": pts[:2]})
    assert len(two.data) == 6
    # readable axes (issue 49): GPU counts as whole numbers, efficiency in whole quarters,
    # the legend under the plot (at the right it covered the efficiency axis)
    assert list(fig.layout.xaxis.ticktext) == ["1", "4", "16"]  # at most 4 whole counts
    assert list(fig.layout.yaxis2.tickvals) == [0, 0.25, 0.5, 0.75, 1]
    assert fig.layout.legend.orientation == "h" and fig.layout.legend.y == 0
    wide = scaling(plan("gpt2-xl").model, hw, TrainingSpec(seq=1024), gpus=(1, 8, 64, 512))
    assert list(scaling_figure(wide).layout.xaxis.ticktext) == ["1", "8", "64", "512"]


def test_memory_vs_model_size_crosses_the_card_limit():
    hw = hardware_preset("a100-80gb")
    layouts = {"1 GPU": ParallelSpec(), "ZeRO-3 x8": ParallelSpec(dp=8, zero=3)}
    fig = memory_vs_model_size_figure(
        [1e9, 3e9, 10e9], hw, TrainingSpec(seq=1024, recompute="full"), layouts
    )
    one, z3 = fig.data
    assert list(one.x) == [1, 3, 10]
    assert all(a > b for a, b in zip(one.y, z3.y, strict=True))
    assert one.y[-1] > hw.usable / 1e9 > z3.y[-1]
