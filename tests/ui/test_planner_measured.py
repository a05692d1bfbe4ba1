"""The planner widget plans on a measured ``HardwareSpec`` (``cluster.measured_hardware()``)."""

from __future__ import annotations

import pytest

from workbench.planner import evaluate, fit_alpha_beta, hardware_preset
from workbench.planner.network_fit import INTER, measured_hardware
from workbench.ui.planner import PlannerWidget


def _measured() -> object:
    sizes = [4096, 1 << 20, 8 << 20]

    def fit(bandwidth: float) -> object:
        return fit_alpha_beta([(s, 2e-5 + s / bandwidth) for s in sizes], n=2)

    fits = {"intra a": fit(100e9), INTER: fit(2e9)}
    return measured_hardware(fits, ranks_per_node=8, base=hardware_preset("h100-80gb"))  # type: ignore[arg-type]


def test_the_widget_offers_and_plans_on_the_measured_hardware() -> None:
    hw = _measured()
    w = PlannerWidget(model="llama2-7b", gpu=hw, gpus=16, zero=3)
    assert (hw.name, hw) in w.gpu.options  # type: ignore[attr-defined]
    assert w.plan is not None
    expected = evaluate(w.state.model_spec(), w.state.training(), w.state.layout(), hw)  # type: ignore[arg-type]
    assert w.plan.time.dp_comm == pytest.approx(expected.time.dp_comm)
    w.gpu.value = "h100-80gb"  # back to the preset: its network is faster than measured
    assert w.plan.time.dp_comm < expected.time.dp_comm
