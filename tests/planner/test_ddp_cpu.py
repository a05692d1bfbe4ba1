"""The DDP all-reduce's CPU cost on CPU ranks: ``HardwareSpec.comm_cpu`` and its
calibration from one measured DDP step (``cpu_profile(ddp_step_s=...)``). Given inputs
only; no wall clock."""

from __future__ import annotations

import math

import pytest

from workbench.errors import ConfigError
from workbench.planner import (
    HardwareSpec,
    LinkSpec,
    ModelSpec,
    ParallelSpec,
    TrainingSpec,
    all_reduce_time,
    cpu_profile,
    fit_alpha_beta,
    step_time,
)

LINK = LinkSpec(bandwidth=1e9, latency=1e-4)
MODEL = ModelSpec(name="tiny", layers=2, hidden=64, heads=4, vocab=100, seq=64)
TRAIN = TrainingSpec(micro_batch=16, seq=64, precision="fp32", dropout=False, mfu=1.0)


def _fit():
    return fit_alpha_beta([(s, all_reduce_time(s, 2, LINK)) for s in (4096, 65536, 1 << 20)])


def _profile(**kw: object) -> HardwareSpec:
    args: dict[str, object] = dict(
        seq=64, step_s=0.074, outside_s=0.012, cores=2.0, background=1.0,
        processes_per_node=2,
    )  # fmt: skip
    args.update(kw)
    return cpu_profile(_fit(), MODEL, TRAIN, **args)  # type: ignore[arg-type]


def _two(hw: HardwareSpec, micro_batch: int):
    return step_time(
        MODEL, TRAIN.with_(micro_batch=micro_batch), ParallelSpec(dp=2), hw, seq=64,
        micro_batches=1,
    )  # fmt: skip


def test_comm_cpu_adds_the_collective_stretched_by_the_share_never_hidden():
    base = _profile()
    assert base.comm_cpu is None  # no DDP step given: the old model (exposed, unstretched)
    share = base.core_share(2)
    assert share == pytest.approx(2 / 3)
    plain = _two(base, 8)
    charged = _two(base.with_(comm_cpu=3.0), 8)
    assert charged.dp_comm == pytest.approx(plain.dp_comm)
    assert charged.dp_exposed == pytest.approx(3.0 * plain.dp_comm / share, rel=1e-12)
    assert charged.total - charged.dp_exposed == pytest.approx(plain.total - plain.dp_exposed)
    # Full overlap allowed by the training does not hide CPU work on the same cores.
    overlapped = step_time(
        MODEL, TRAIN.with_(micro_batch=8, overlap=1.0), ParallelSpec(dp=2),
        base.with_(comm_cpu=3.0, max_overlap=1.0), seq=64, micro_batches=1,
    )  # fmt: skip
    assert overlapped.dp_exposed == pytest.approx(charged.dp_exposed)
    # One rank has no data-parallel collective to pay for.
    one = step_time(MODEL, TRAIN, ParallelSpec(dp=1), base.with_(comm_cpu=3.0), seq=64,
                    micro_batches=1)  # fmt: skip
    assert one.dp_exposed == 0.0


def test_ddp_calibration_reproduces_its_own_step_and_predicts_another_batch():
    base = _profile()
    bare4 = _two(base.with_(comm_cpu=0.0), 4)
    extra = 0.030  # the measured DDP step took 30 ms more than compute + fixed time
    hw = _profile(ddp_step_s=bare4.total + extra, ddp_micro_batch=4)
    share = hw.core_share(2)
    assert hw.comm_cpu == pytest.approx(extra * share / bare4.dp_comm, rel=1e-12)
    assert _two(hw, 4).total == pytest.approx(bare4.total + extra, rel=1e-12)
    # At 8 per rank: the compute doubles, the all-reduce's cost (same gradients) does not.
    bare8 = _two(base.with_(comm_cpu=0.0), 8)
    assert _two(hw, 8).total == pytest.approx(bare8.total + extra, rel=1e-12)
    assert bare8.compute == pytest.approx(2 * bare4.compute, rel=1e-12)


def test_a_ddp_step_faster_than_compute_charges_nothing():
    base = _profile()
    bare = _two(base.with_(comm_cpu=0.0), 4)
    hw = _profile(ddp_step_s=0.5 * bare.total, ddp_micro_batch=4)
    assert hw.comm_cpu == 0.0


def test_a_ddp_step_in_cpu_seconds_calibrates_the_same_whatever_the_load():
    # The same DDP step measured as one rank's CPU seconds: 20 ms beyond the profile's
    # compute and fixed time at a whole core. CPU time does not stretch with the other
    # processes' load, so comm_cpu must not depend on the share the planner assumes for
    # the 2 calibration ranks. Backgrounds 0 and 1 on 2 cores leave the 1-rank profile
    # alike (a whole core either way) and change only that 2-rank share (1 vs 2/3).
    bare = _two(_profile(cores=None).with_(comm_cpu=0.0), 4)  # a whole core each
    cpu_s = bare.total + 0.020
    by_load = [
        _profile(background=b, ddp_cpu_s=cpu_s, ddp_micro_batch=4).comm_cpu for b in (0.0, 1.0)
    ]
    assert by_load == pytest.approx([0.020 / bare.dp_comm] * 2, rel=1e-12)
    # The wall-time form of a calibration divides by that assumed share, so it moves.
    walls = [
        _profile(background=b, ddp_step_s=0.08, ddp_micro_batch=4).comm_cpu for b in (0.0, 1.0)
    ]
    assert walls[0] != pytest.approx(walls[1])


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"ddp_cpu_s": 0.05, "ddp_step_s": 0.05, "ddp_micro_batch": 4}, "not both"),
        ({"ddp_cpu_s": math.nan, "ddp_micro_batch": 4}, "ddp_cpu_s=nan"),
        ({"ddp_cpu_s": 0.05}, "ddp_cpu_s=0.05, ddp_micro_batch=None"),
        ({"ddp_step_s": 0.05}, "ddp_micro_batch=None"),
        ({"ddp_micro_batch": 4}, "ddp_step_s=None"),
        ({"ddp_step_s": math.nan, "ddp_micro_batch": 4}, "ddp_step_s=nan"),
        ({"ddp_step_s": -1.0, "ddp_micro_batch": 4}, "ddp_step_s=-1.0"),
        ({"ddp_step_s": math.inf, "ddp_micro_batch": 4}, "ddp_step_s=inf"),
        ({"ddp_step_s": 0.05, "ddp_micro_batch": 0}, "ddp_micro_batch=0"),
        ({"ddp_step_s": 0.05, "ddp_micro_batch": True}, "ddp_micro_batch=True"),
        ({"ddp_step_s": 0.05, "ddp_micro_batch": 4, "ddp_ranks": 1}, "ddp_ranks=1"),
        ({"ddp_step_s": 0.05, "ddp_micro_batch": 4, "ddp_ranks": 10**9}, "ddp_ranks="),
    ],
)
def test_bad_ddp_calibration_inputs_are_one_clear_error(kw: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        _profile(**kw)


@pytest.mark.parametrize("value", [-0.1, math.nan, math.inf, 1e9, True])
def test_bad_comm_cpu_is_one_clear_error(value: float) -> None:
    with pytest.raises(ConfigError, match="comm_cpu="):
        _profile().with_(comm_cpu=value)


def test_comm_cpu_survives_the_json_round_trip():
    hw = _profile().with_(comm_cpu=2.5)
    assert HardwareSpec.from_dict(hw.to_dict()) == hw
