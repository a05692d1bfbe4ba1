"""CPU ranks that time-share a node's cores: ``HardwareSpec.core_share`` and what
``cpu_profile`` / ``step_time`` do with it (processor sharing, no fitted factor)."""

from __future__ import annotations

import math

import pytest

from workbench.errors import ConfigError
from workbench.planner import (
    HardwareSpec,
    LinkSpec,
    ModelSpec,
    TrainingSpec,
    all_reduce_time,
    cpu_profile,
    fit_alpha_beta,
    plan,
)

LINK = LinkSpec(bandwidth=1e9, latency=1e-4)
MODEL = ModelSpec(name="tiny", layers=2, hidden=64, heads=4, vocab=100, seq=64)
TRAIN = TrainingSpec(micro_batch=16, seq=64, precision="fp32", dropout=False)


def _hw(**changes: object) -> HardwareSpec:
    base = HardwareSpec(memory=2**33, peak_flops=1e11, gpus_per_node=2, intra=LINK, inter=LINK)
    return base.with_(**changes)


def _fit():
    return fit_alpha_beta([(s, all_reduce_time(s, 2, LINK)) for s in (4096, 65536, 1 << 20)])


def test_core_share_is_cores_over_busy_processes_capped_at_one():
    assert _hw().core_share(64) == 1.0  # no core count: a device per rank
    hw = _hw(cores=2.0, background=0.5)
    assert hw.core_share(1) == 1.0  # 1.5 busy processes on 2 cores: nobody waits
    assert hw.core_share(2) == pytest.approx(2 / 2.5)
    assert hw.core_share(4) == pytest.approx(2 / 4.5)
    assert _hw(cores=1.0).core_share(2) == 0.5


@pytest.mark.parametrize(
    ("field", "value"),
    [("cores", 0.0), ("cores", -1.0), ("cores", math.nan), ("cores", math.inf), ("cores", 1e9),
     ("background", -0.5), ("background", math.inf), ("background", True)],
)  # fmt: skip
def test_bad_core_counts_are_one_clear_error(field: str, value: float) -> None:
    with pytest.raises(ConfigError, match=f"{field}="):
        _hw(**{field: value})
    with pytest.raises(ConfigError, match=f"{field}="):
        cpu_profile(_fit(), MODEL, TRAIN, seq=64, step_s=0.074, outside_s=0.012, **{field: value})


def test_core_fields_survive_the_json_round_trip():
    hw = _hw(cores=2.0, background=0.25, kind="cpu")
    assert HardwareSpec.from_dict(hw.to_dict()) == hw


def test_step_time_stretches_compute_and_overhead_by_the_share_not_the_collective():
    hw = _hw(cores=1.0, step_overhead=0.01, max_overlap=0.0, kind="cpu")
    alone = plan(MODEL, hw.with_(cores=None), gpus=2, training=TRAIN.with_(micro_batch=8))
    shared = plan(MODEL, hw, gpus=2, training=TRAIN.with_(micro_batch=8))
    t, a = shared.time, alone.time
    assert t.compute == pytest.approx(2 * a.compute)  # 2 ranks on 1 core: each runs half
    assert t.overhead == pytest.approx(2 * a.overhead)
    assert t.dp_exposed == pytest.approx(a.dp_exposed)


def test_cpu_profile_calibrates_at_one_ranks_share_and_predicts_two_at_theirs():
    # One core and half a busy process beside it: the measured rank got s1 = 1/1.5 of a
    # core, each of two ranks gets s2 = 1/2.5.
    hw = cpu_profile(
        _fit(), MODEL, TRAIN, seq=64, step_s=0.074, outside_s=0.012, cores=1.0,
        background=0.5,
    )  # fmt: skip
    s1, s2 = 1 / 1.5, 1 / 2.5
    assert hw.core_share(1) == pytest.approx(s1) and hw.core_share(2) == pytest.approx(s2)
    one = plan(MODEL, hw, training=TRAIN)
    assert one.time.total == pytest.approx(0.074, rel=1e-9)
    two = plan(MODEL, hw, gpus=2, training=TRAIN.with_(micro_batch=8))
    expected = (0.062 / 2 + 0.012) * s1 / s2 + two.time.dp_comm
    assert two.time.total == pytest.approx(expected, rel=1e-9)
    # Without a core count the same measurement predicts dedicated cores.
    free = cpu_profile(_fit(), MODEL, TRAIN, seq=64, step_s=0.074, outside_s=0.012)
    free_two = plan(MODEL, free, gpus=2, training=TRAIN.with_(micro_batch=8))
    assert free_two.time.total == pytest.approx(0.062 / 2 + 0.012 + two.time.dp_comm, rel=1e-9)
