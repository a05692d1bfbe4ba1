"""The all-reduce sweep measures real gloo collectives, and the fit reads them."""

from __future__ import annotations

import pytest

from tests.harness import run_ranks
from workbench.planner import fit_alpha_beta

pytestmark = pytest.mark.engines

# Sizes a noisy machine cannot put out of order: 16 MB takes ~100x longer than 64 KB on
# loopback gloo, far beyond any latency spike of the small one.
SIZES = [65536, 4194304, 16777216]


def _sweep(rank: int, world_size: int) -> list[tuple[int, float]]:
    from workbench.parallel.planning.commbench import allreduce_sweep

    return allreduce_sweep(SIZES, iters=5, warmup=1)


def test_allreduce_sweep_on_two_gloo_ranks_fits_a_positive_link():
    results = run_ranks(_sweep, world_size=2)
    for per_rank in results:
        assert [b for b, _ in per_rank] == SIZES
        assert all(t > 0 for _, t in per_rank)
    fit = fit_alpha_beta(results[0], n=2)
    assert fit.bandwidth > 0 and fit.latency >= 0
