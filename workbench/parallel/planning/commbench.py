"""Measure all-reduce time against message size, to calibrate the planner's cost model.

``allreduce_sweep`` runs inside an existing process group (every rank calls it);
``run_local_sweep`` starts its own gloo ranks on 127.0.0.1 and returns rank 0's numbers,
which is what ``workbench calibrate`` fits α and B to.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch
import torch.distributed as dist

from workbench.errors import ConfigError, ParallelError
from workbench.parallel.local import run_local_ranks

__all__ = ["DEFAULT_SIZES", "allreduce_sweep", "run_local_sweep"]

# 4 KiB .. 16 MiB by factors of 4: small sizes pin down latency, large ones bandwidth.
DEFAULT_SIZES: tuple[int, ...] = tuple(4096 * 4**k for k in range(7))


def allreduce_sweep(
    sizes: list[int],
    iters: int = 5,
    warmup: int = 2,
    group: Any = None,
) -> list[tuple[int, float]]:
    """Median seconds of an fp32 all-reduce for each size in bytes, as (bytes, seconds).

    Sizes are rounded down to whole fp32 elements (at least one); the bytes returned are
    the sizes actually sent. A barrier before each timed call lines the ranks up so the
    time measures the collective, not the slowest rank's arrival.
    """
    if not dist.is_initialized():
        raise ParallelError("allreduce_sweep needs an initialised torch.distributed group")
    if iters < 1 or warmup < 0:
        raise ConfigError(f"iters={iters} must be >= 1 and warmup={warmup} >= 0")
    if not sizes or any(int(s) < 1 for s in sizes):
        raise ConfigError(f"sizes={sizes!r} must be a non-empty list of byte counts >= 1")
    results: list[tuple[int, float]] = []
    for size in sizes:
        buf = torch.ones(max(1, int(size) // 4), dtype=torch.float32)
        for _ in range(warmup):
            dist.all_reduce(buf, group=group)
        times: list[float] = []
        for _ in range(iters):
            dist.barrier(group=group)
            start = time.perf_counter()
            dist.all_reduce(buf, group=group)
            times.append(time.perf_counter() - start)
        results.append((buf.numel() * buf.element_size(), statistics.median(times)))
    return results


def _sweep_rank(rank: int, world_size: int, sizes: list[int], iters: int, warmup: int) -> Any:
    return allreduce_sweep(sizes, iters=iters, warmup=warmup)


def run_local_sweep(
    world_size: int = 2,
    sizes: list[int] | tuple[int, ...] = DEFAULT_SIZES,
    iters: int = 5,
    warmup: int = 2,
    timeout: float = 120.0,
) -> list[tuple[int, float]]:
    """Spawn ``world_size`` gloo ranks on 127.0.0.1 (a free port), run the sweep, and
    return rank 0's (bytes, seconds) pairs."""
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 2:
        raise ConfigError(f"world_size={world_size!r} is not valid; it must be >= 2")
    results = run_local_ranks(
        _sweep_rank, list(sizes), iters, warmup, world_size=world_size, timeout=timeout
    )
    return results[0]
