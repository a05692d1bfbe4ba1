"""The doctor's network arithmetic: pairs, groups, statistics, slow links, the hardware."""

from __future__ import annotations

import pytest

from workbench.planner import fit_alpha_beta, plan
from workbench.planner.network_fit import (
    INTER,
    PairMeasure,
    all_reduce_busbw,
    choose_pairs,
    fit_ends,
    fit_groups,
    measured_hardware,
    percentile,
    slow_pairs,
    sweep_groups,
)
from workbench.planner.presets import hardware_preset


def test_every_pair_up_to_the_limit_then_host_pairs_and_one_pair_per_host() -> None:
    pairs, how = choose_pairs(["a", "a", "b"], all_pairs_up_to=16)
    assert pairs == [(0, 1), (0, 2), (1, 2)] and how == "every pair of ranks"
    hosts = ["a"] * 4 + ["b"] * 4 + ["c"] * 4
    pairs, how = choose_pairs(hosts, all_pairs_up_to=8)
    assert pairs == [(0, 1), (0, 4), (0, 8), (4, 5), (4, 8), (8, 9)]
    assert "pair of hosts" in how


def test_groups_one_host_is_its_own_world_many_hosts_add_inter_and_world() -> None:
    assert sweep_groups(["a", "a"]) == {"intra a": [0, 1]}
    groups = sweep_groups(["a", "a", "b", "b"])
    assert groups == {"intra a": [0, 1], "intra b": [2, 3], INTER: [0, 2], "world": [0, 1, 2, 3]}
    assert sweep_groups(["a", "b"]) == {INTER: [0, 1], "world": [0, 1]}


def test_percentile_and_busbw_follow_their_definitions() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 0.5) == 50.0 or percentile(values, 0.5) == 51.0
    assert percentile(values, 0.99) == 99.0
    assert percentile(values, 1.0) == 100.0
    assert all_reduce_busbw(4, 1000.0, 1.0) == 1000.0 * 2 * 3 / 4


def _pair(a: int, b: int, latency: float, bandwidth: float) -> PairMeasure:
    size = 1 << 20
    times = {
        "round_trip_s": [2 * latency] * 20,
        "one_way_s": [latency + size / bandwidth] * 5,
        "both_ways_s": [size / bandwidth] * 5,
        "bytes": size,
    }
    return PairMeasure.from_times(a, b, True, times)


def test_a_pair_is_half_its_round_trip_and_its_size_over_time() -> None:
    p = _pair(0, 1, latency=1e-4, bandwidth=2e9)
    assert p.latency == pytest.approx(1e-4) and p.latency_p99 == pytest.approx(1e-4)
    assert p.one_way == pytest.approx(2e9)
    assert p.both_ways == pytest.approx(4e9)  # two messages in the time of one


def test_pairs_below_three_quarters_of_the_median_are_slow() -> None:
    pairs = [_pair(0, 1, 1e-4, 2e9), _pair(0, 2, 1e-4, 2e9), _pair(1, 2, 1e-4, 1e9)]
    assert [(p.a, p.b) for p in slow_pairs(pairs)] == [(1, 2)]
    assert slow_pairs(pairs[:2]) == []


def _fit(n: int, alpha: float, bandwidth: float) -> object:
    sizes = [4096, 65536, 1 << 20, 8 << 20]
    factor = 2 * (n - 1) / n
    return fit_alpha_beta([(s, 2 * (n - 1) * alpha + factor * s / bandwidth) for s in sizes], n=n)


def test_measured_hardware_keeps_intra_and_inter_apart_and_plans() -> None:
    fits = {
        "intra a": _fit(2, 1e-5, 50e9),
        "intra b": _fit(2, 1e-5, 40e9),
        INTER: _fit(2, 5e-5, 5e9),
    }
    hw = measured_hardware(fits, ranks_per_node=2)  # type: ignore[arg-type]
    assert hw.intra.bandwidth == pytest.approx(40e9)  # the slower host limits a ring
    assert hw.inter.bandwidth == pytest.approx(5e9)
    assert hw.inter.latency == pytest.approx(5e-5) and hw.gpus_per_node == 2
    base = hardware_preset("h100-80gb")
    on_gpus = measured_hardware(fits, ranks_per_node=8, base=base)  # type: ignore[arg-type]
    assert on_gpus.memory == base.memory and on_gpus.inter.bandwidth == pytest.approx(5e9)
    slow = plan(model="gpt2-small", gpus=16, hardware=on_gpus)
    fast = plan(model="gpt2-small", gpus=16, hardware=base)
    assert slow.time.dp_comm > fast.time.dp_comm  # the measured NIC is slower than the preset's


def test_one_host_uses_its_intra_link_for_inter() -> None:
    hw = measured_hardware({"intra a": _fit(2, 1e-5, 1e9)}, ranks_per_node=2)  # type: ignore[arg-type]
    assert hw.inter.bandwidth == hw.intra.bandwidth
    assert "one host" in hw.inter.source


def test_the_doctor_fits_latency_at_the_small_end_and_bandwidth_at_the_large_end() -> None:
    sizes = [4096, 65536, 1 << 20, 8 << 20]
    exact = fit_ends([(s, 2 * 1e-4 + s / 1e9) for s in sizes], n=2)
    assert exact.latency == pytest.approx(1e-4) and exact.bandwidth == pytest.approx(1e9)
    # a token-bucket link (the bed's tc tbf): the first 187.5 kB of a message pass at once,
    # the rest at 37.5 MB/s; what limits a gradient all-reduce is the latter
    rate, burst = 37.5e6, 187_500
    bursty = [(s, 2 * 1e-4 + max(0, s - burst) / rate) for s in sizes]
    big = 8 << 20
    assert fit_ends(bursty, n=2).predict(big) == pytest.approx(bursty[-1][1])
    assert fit_ends(bursty, n=2).bandwidth == pytest.approx(rate, rel=0.05)
    assert fit_alpha_beta(bursty, n=2).bandwidth > 2 * rate  # what the doctor fitted before
    assert fit_groups({"inter-host": bursty}, {"inter-host": 2})["inter-host"].bandwidth == (
        fit_ends(bursty, n=2).bandwidth
    )
