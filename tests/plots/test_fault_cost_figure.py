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


def _notebook_06_facts(times: object) -> list[bool]:
    """Notebook 06's fault-cost cells (their compared output: four booleans), on ``times``."""
    from workbench.planner import best_checkpoint_every

    mtbf_h, nodes = 5 * 365 * 24, 1000
    intervals = sorted({max(1, round(10 ** (k / 8))) for k in range(41)})
    curve = [times.cost(every, mtbf_h, nodes) for every in intervals]  # type: ignore[attr-defined]
    young = young_daly_interval_s(times.save_s, mtbf_h, nodes)  # type: ignore[attr-defined]
    fault_cost_figure(curve, young_daly_s=young)
    best = best_checkpoint_every(
        step_s=times.step_s,  # type: ignore[attr-defined]
        save_s=times.save_s,  # type: ignore[attr-defined]
        mtbf_node_h=mtbf_h,
        nodes=nodes,
    )
    lowest = min(curve, key=lambda c: c.total_s)
    at_best = times.cost(best, mtbf_h, nodes).total_s  # type: ignore[attr-defined]
    return [
        abs(best * times.step_s - young) <= times.step_s,  # type: ignore[attr-defined]
        abs(lowest.checkpoint_every / best - 1) < 0.34,
        curve[0].total_s > at_best,
        curve[-1].total_s > at_best,
    ]


@pytest.mark.parametrize("step_s", [0.005, 0.02, 0.08, 0.3])
@pytest.mark.parametrize("save_s", [0.003, 0.02, 0.1, 0.5])
@pytest.mark.parametrize("recover_s", [0.8, 2.5, 15.0])
def test_notebook_06_output_holds_for_any_measured_times(
    step_s: float, save_s: float, recover_s: float
) -> None:
    """The measured times vary run to run (and with the machine's load); the notebook's
    compared output must not: the same four facts over the range this machine gives."""
    from workbench.session.fault_times import FaultTimes

    times = FaultTimes(step_s=step_s, save_s=save_s, detect_s=0.05, recover_s=recover_s)
    assert _notebook_06_facts(times) == [True, True, True, True]
