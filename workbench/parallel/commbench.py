"""Measure all-reduce time against message size, to calibrate the planner's cost model.

``allreduce_sweep`` runs inside an existing process group (every rank calls it);
``run_local_sweep`` starts its own gloo ranks on 127.0.0.1 and returns rank 0's numbers,
which is what ``workbench calibrate`` fits α and B to.
"""

from __future__ import annotations

import os
import socket
import statistics
import time
import traceback
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from workbench.errors import ConfigError, ParallelError

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


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _worker(
    rank: int,
    world_size: int,
    port: int,
    sizes: list[int],
    iters: int,
    warmup: int,
    queue: Any,
) -> None:
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    try:
        dist.init_process_group("gloo", rank=rank, world_size=world_size)
        result = allreduce_sweep(sizes, iters=iters, warmup=warmup)
        queue.put((rank, True, result))
    except BaseException:
        queue.put((rank, False, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


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
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    procs = [
        ctx.Process(
            target=_worker,
            args=(r, world_size, port, list(sizes), iters, warmup, queue),
            daemon=True,
        )
        for r in range(world_size)
    ]
    for p in procs:
        p.start()
    results: dict[int, Any] = {}
    failures: dict[int, str] = {}
    try:
        for _ in range(world_size):
            rank, ok, value = queue.get(timeout=timeout)
            (results if ok else failures)[rank] = value
    except Exception as exc:  # queue.Empty: a rank hung or died
        failures[-1] = f"no answer within {timeout}s: {exc!r}"
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join()
    if failures:
        detail = "\n".join(f"--- rank {r} ---\n{tb}" for r, tb in sorted(failures.items()))
        raise ParallelError(f"all-reduce sweep failed on {len(failures)} rank(s):\n{detail}")
    return results[0]
