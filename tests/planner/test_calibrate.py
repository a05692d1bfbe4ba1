"""Fitting α and B recovers the parameters that generated the times."""

from __future__ import annotations

import random

import pytest

from workbench.errors import ConfigError
from workbench.planner import LinkSpec, all_reduce_time, fit_alpha_beta, hardware_from_fit

SIZES = [4096 * 4**k for k in range(8)]


@pytest.mark.parametrize("n", [2, 4, 8])
def test_exact_samples_give_back_alpha_and_bandwidth(n):
    link = LinkSpec(bandwidth=0.8e9, latency=4e-4)
    pts = [(s, all_reduce_time(s, n, link)) for s in SIZES]
    fit = fit_alpha_beta(pts, n=n)
    assert fit.latency == pytest.approx(4e-4, rel=1e-9)
    assert fit.bandwidth == pytest.approx(0.8e9, rel=1e-9)
    assert fit.rms_rel_error < 1e-9
    assert fit.predict(10**6) == pytest.approx(all_reduce_time(10**6, n, link), rel=1e-9)


def test_noisy_samples_fit_within_noise():
    rng = random.Random(0)
    link = LinkSpec(bandwidth=0.6e9, latency=2.5e-4)
    pts = [
        (s, all_reduce_time(s, 2, link) * rng.uniform(0.95, 1.05)) for s in SIZES for _ in range(3)
    ]
    fit = fit_alpha_beta(pts, n=2)
    assert fit.latency == pytest.approx(2.5e-4, rel=0.15)
    assert fit.bandwidth == pytest.approx(0.6e9, rel=0.15)


def test_all_gather_fit_uses_its_own_factors():
    link = LinkSpec(bandwidth=2e9, latency=1e-5)
    pts = [(s, 3 * link.latency + 3 / 4 * s / link.bandwidth) for s in SIZES]
    fit = fit_alpha_beta(pts, n=4, op="all_gather")
    assert fit.bandwidth == pytest.approx(2e9, rel=1e-9)
    assert fit.latency == pytest.approx(1e-5, rel=1e-9)


def test_bad_samples_are_config_errors():
    with pytest.raises(ConfigError, match="2 different sizes"):
        fit_alpha_beta([(100, 1e-3), (100, 2e-3)])
    with pytest.raises(ConfigError, match="do not grow"):
        fit_alpha_beta([(100, 2e-3), (10_000, 1e-3), (1_000_000, 1e-4)])
    with pytest.raises(ConfigError, match="seconds > 0"):
        fit_alpha_beta([(100, 0.0), (200, 1e-3)])
    with pytest.raises(ConfigError, match="'all_reduce'"):
        fit_alpha_beta([(1, 1.0), (2, 2.0)], op="broadcast")


def test_hardware_from_fit_is_a_cpu_profile_with_the_fitted_link():
    fit = fit_alpha_beta(
        [(s, all_reduce_time(s, 2, LinkSpec(bandwidth=1e9, latency=1e-4))) for s in SIZES]
    )
    hw = hardware_from_fit(fit, memory=8 * 2**30, peak_flops=5e10)
    assert hw.kind == "cpu" and hw.intra == hw.inter
    assert hw.intra.bandwidth == pytest.approx(1e9)
    assert hw.flops("fp32") == 5e10
