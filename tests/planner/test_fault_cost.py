"""planner.fault_cost: the expected cost of failures per hour, and its best interval."""

from __future__ import annotations

import math

import pytest

from workbench.errors import ConfigError
from workbench.planner import (
    best_checkpoint_every,
    fault_cost,
    young_daly_interval_s,
)

BASE = {
    "step_s": 2.0,
    "save_s": 30.0,
    "detect_s": 5.0,
    "recover_s": 60.0,
    "mtbf_node_h": 1000.0,
    "nodes": 64,
}


def test_parts_follow_the_model() -> None:
    c = fault_cost(checkpoint_every=300, **BASE)
    rate_h = 64 / 1000  # failures per hour of the whole system
    assert c.interval_s == 600.0
    assert c.failures_per_hour == pytest.approx(rate_h)
    assert c.saving_s == pytest.approx(3600 * 30 / 600)  # 6 saves an hour
    assert c.redone_s == pytest.approx(rate_h * (600 + 30) / 2)
    assert c.downtime_s == pytest.approx(rate_h * 65)
    assert c.total_s == pytest.approx(c.saving_s + c.redone_s + c.downtime_s)
    assert 0 < c.useful_fraction < 1


def test_grid_minimum_agrees_with_young_daly() -> None:
    """Young's sqrt(2 * save * MTBF), computed here from its definition, against the
    minimum of the cost over a fine grid of whole-step intervals."""
    mtbf_system_s = 1000.0 * 3600 / 64
    young_s = math.sqrt(2 * 30.0 * mtbf_system_s)
    grid = range(1, 5000)
    costs = {k: fault_cost(checkpoint_every=k, **BASE).total_s for k in grid}
    best_k = min(costs, key=costs.__getitem__)
    assert abs(best_k * BASE["step_s"] - young_s) <= BASE["step_s"]
    assert young_daly_interval_s(30.0, 1000.0, 64) == pytest.approx(young_s)
    assert best_checkpoint_every(step_s=2.0, save_s=30.0, mtbf_node_h=1000.0, nodes=64) == best_k


def test_detection_and_recovery_do_not_move_the_best_interval() -> None:
    # they are paid once per failure whatever the interval
    fast = {**BASE, "detect_s": 0.0, "recover_s": 0.0}
    a = [fault_cost(checkpoint_every=k, **fast).total_s for k in range(1, 3000)]
    b = [fault_cost(checkpoint_every=k, **BASE).total_s for k in range(1, 3000)]
    assert a.index(min(a)) == b.index(min(b))
    assert min(b) - min(a) == pytest.approx(64 / 1000 * 65)


def test_more_nodes_cost_more_and_want_shorter_intervals() -> None:
    few = best_checkpoint_every(step_s=1.0, save_s=10.0, mtbf_node_h=500.0, nodes=8)
    many = best_checkpoint_every(step_s=1.0, save_s=10.0, mtbf_node_h=500.0, nodes=512)
    assert many < few
    c8 = fault_cost(checkpoint_every=few, **{**BASE, "step_s": 1.0, "nodes": 8})
    c512 = fault_cost(checkpoint_every=few, **{**BASE, "step_s": 1.0, "nodes": 512})
    assert c512.total_s > c8.total_s


def test_best_interval_is_at_least_one_step_and_capped() -> None:
    assert best_checkpoint_every(step_s=100.0, save_s=0.01, mtbf_node_h=0.01, nodes=100) == 1
    assert best_checkpoint_every(step_s=0.001, save_s=100.0, mtbf_node_h=1e6, max_every=50) == 50


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"checkpoint_every": 0}, "checkpoint_every=0 is not valid"),
        ({"checkpoint_every": 2.5}, "checkpoint_every=2.5 is not valid"),
        ({"step_s": 0}, "step_s=0 is not valid"),
        ({"save_s": -1}, "save_s=-1 is not valid"),
        ({"detect_s": float("nan")}, "detect_s=nan is not valid"),
        ({"recover_s": "2"}, "recover_s='2' is not valid"),
        ({"mtbf_node_h": 0}, "mtbf_node_h=0 is not valid"),
        ({"nodes": 0}, "nodes=0 is not valid"),
        ({"nodes": True}, "nodes=True is not valid"),
    ],
)
def test_bad_input_names_the_value_and_the_valid_range(change: dict, needle: str) -> None:
    args = {"checkpoint_every": 10, **BASE, **change}
    with pytest.raises(ConfigError, match="use ") as info:
        fault_cost(**args)
    assert needle in str(info.value)


def test_top_level_entry_point() -> None:
    import workbench

    assert workbench.fault_cost(checkpoint_every=10, **BASE).checkpoint_every == 10
