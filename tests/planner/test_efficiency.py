"""The per-operation efficiency model (workbench/planner/efficiency.py): its shipped
constants are what the documented fit gives on the calibration rows, and only those."""

from __future__ import annotations

import pytest

from tests.planner.published import CASES
from workbench.errors import ConfigError
from workbench.planner import ModelSpec, TrainingSpec, hardware_preset, plan
from workbench.planner.efficiency import (
    CALIBRATION_ROWS,
    GEMM_EFFICIENCY,
    TRAFFIC_FACTOR,
    fit_efficiency,
)
from workbench.planner.memory import model_layer_bytes
from workbench.planner.presets import HOPPER_GEMM_EFFICIENCY

_BY_ID = {c.id: c for c in CASES}


def _row(case_id: str):
    case = _BY_ID[case_id]
    assert case.with_training is not None
    return case


def test_calibration_rows_are_the_marked_ones_and_the_rest_are_held_out():
    marked = {c.id for c in CASES if c.calibration}
    assert marked == {*CALIBRATION_ROWS, "llama3-405b-mfu-8192"}
    held_out = [c for c in CASES if c.with_training is not None and not c.calibration]
    assert len(held_out) == 13  # 8 Narayanan, 4 Korthikanti, 1 Llama 3


def test_a100_constants_are_the_fit_on_the_two_narayanan_rows():
    rows = []
    for case_id in CALIBRATION_ROWS:
        case = _row(case_id)
        rows.append((lambda e, k, f=case.with_training: f(mfu=e, memory_traffic=k), case.published))
    eff, factor = fit_efficiency(rows, (0.5, 1.0))
    assert pytest.approx(eff, abs=5e-4) == GEMM_EFFICIENCY  # shipped rounded
    assert pytest.approx(factor, abs=5e-3) == TRAFFIC_FACTOR


def test_hopper_efficiency_is_the_fit_on_the_llama3_8192_row():
    case = _row("llama3-405b-mfu-8192")
    (eff,) = fit_efficiency(
        [(lambda e: case.with_training(mfu=e, memory_traffic=TRAFFIC_FACTOR), case.published)],
        (0.5,),
    )
    assert pytest.approx(eff, abs=5e-4) == HOPPER_GEMM_EFFICIENCY
    assert hardware_preset("h100-80gb").gemm_efficiency == HOPPER_GEMM_EFFICIENCY


def test_fit_efficiency_recovers_known_constants_and_rejects_a_bad_system():
    def predict(e: float, k: float) -> float:
        return 3.0 / e + 2.0 * k

    def other(e: float, k: float) -> float:
        return 1.0 / e + 5.0 * k

    eff, factor = fit_efficiency([(predict, 3 / 0.6 + 2 * 4), (other, 1 / 0.6 + 5 * 4)], (0.5, 1))
    assert (eff, factor) == (pytest.approx(0.6), pytest.approx(4.0))
    with pytest.raises(ConfigError, match="1 or 2 constants"):
        fit_efficiency([(predict, 1.0)], (0.5, 1.0))


_MODEL = ModelSpec(layers=24, hidden=2048, heads=16, vocab=32000, seq=2048)


def test_memory_bound_share_falls_with_width_so_efficiency_rises():
    """The traffic term is linear in h against matmuls' h²: the HFU of a wider model is
    higher at the same layout (the trend of Narayanan et al. Table 1)."""
    narrow = plan(_MODEL, "a100-80gb", micro_batch=1)
    wide = plan(_MODEL.with_(hidden=8192, heads=64), "a100-80gb", micro_batch=1)
    assert narrow.time.hfu < wide.time.hfu < GEMM_EFFICIENCY
    # the per-layer traffic: factor x activation bytes / bandwidth, by hand for one layer
    hw = hardware_preset("a100-80gb")
    one = plan(_MODEL.with_(layers=1), hw, micro_batch=1, mfu=0.5, memory_traffic=2.0)
    flat = plan(_MODEL.with_(layers=1), hw, micro_batch=1, mfu=0.5)
    act = model_layer_bytes(
        one.model, one.training, one.parallel, hw, 2048, recompute="none"
    )  # 2048: the model's sequence
    assert one.time.compute - flat.time.compute == pytest.approx(
        2.0 * act / hw.memory_bandwidth, rel=1e-9
    )


def test_a_flat_mfu_keeps_the_old_model_and_cpu_profiles_have_no_traffic_term():
    hw = hardware_preset("a100-80gb")
    flat = plan(_MODEL, hw, mfu=0.5)
    assert flat.time.hfu == pytest.approx(0.5, rel=1e-12)  # one GPU: all compute at 0.5
    cpu = hw.with_(memory_bandwidth=None, gemm_efficiency=None)
    p = plan(_MODEL, cpu)
    assert p.time.hfu == pytest.approx(GEMM_EFFICIENCY, rel=1e-12)


@pytest.mark.parametrize(
    ("field", "value"),
    [("mfu", float("nan")), ("mfu", 0.0), ("memory_traffic", -1.0), ("memory_traffic", 1e9)],
)
def test_bad_efficiency_settings_are_config_errors(field: str, value: float):
    with pytest.raises(ConfigError, match=field):
        TrainingSpec(**{field: value})


@pytest.mark.parametrize(
    ("field", "value"),
    [("memory_bandwidth", -1.0), ("memory_bandwidth", float("inf")), ("gemm_efficiency", 1.5)],
)
def test_bad_hardware_efficiency_fields_are_config_errors(field: str, value: float):
    with pytest.raises(ConfigError, match=field):
        hardware_preset("a100-80gb").with_(**{field: value})
