"""The fault-cost curve: one trace per cause and the total, Young / Daly marked."""

from __future__ import annotations

import pytest

from workbench.planner import fault_cost, young_daly_interval_s
from workbench.plots.fault_cost import fault_cost_figure

TIMES = {"step_s": 1.0, "save_s": 20.0, "detect_s": 1.0, "recover_s": 30.0}


def test_curve_traces_and_marker() -> None:
    costs = [
        fault_cost(checkpoint_every=k, mtbf_node_h=100.0, nodes=8, **TIMES) for k in (10, 100, 1000)
    ]
    young = young_daly_interval_s(20.0, 100.0, 8)
    fig = fault_cost_figure(costs, young_daly_s=young)
    names = [t.name for t in fig.data]
    assert names == [
        "saving checkpoints",
        "work redone after a failure",
        "detection + recovery",
        "total",
    ]
    total = fig.data[-1]
    assert list(total.x) == [10, 100, 1000]
    assert list(total.y) == [c.total_s for c in costs]
    assert fig.layout.shapes[0].x0 == pytest.approx(young / 1.0)


def test_empty_curve_is_refused() -> None:
    with pytest.raises(ValueError, match="costs is empty"):
        fault_cost_figure([])
