"""Run a function on N local gloo ranks (processes on 127.0.0.1) and gather the results.

The one place that starts throw-away process groups outside a cluster: the all-reduce
calibration, the tests of the core layers and the benchmarks all use it.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import socket
import traceback
from collections.abc import Callable
from typing import Any

from workbench.errors import ConfigError, ParallelError

__all__ = ["free_port", "run_local_ranks"]

START_METHODS = ("spawn", "fork", "forkserver")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _rank_main(
    fn: Callable[..., Any],
    rank: int,
    world_size: int,
    port: int,
    queue: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    quiet: bool,
) -> None:
    if quiet:  # native libraries' chatter on stderr; failures travel through the queue
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 2)
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK=str(rank),
    )
    try:
        dist.init_process_group("gloo", rank=rank, world_size=world_size)
        queue.put((rank, True, fn(rank, world_size, *args, **kwargs)))
    except BaseException:
        queue.put((rank, False, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_local_ranks(
    fn: Callable[..., Any],
    *args: Any,
    world_size: int = 2,
    timeout: float = 120.0,
    start_method: str = "spawn",
    quiet: bool = False,
    **kwargs: Any,
) -> list[Any]:
    """Call ``fn(rank, world_size, *args, **kwargs)`` on every rank; results in rank order.

    With ``start_method="spawn"`` (the default, safe anywhere) ``fn`` must be importable by
    module name; ``"fork"`` also takes functions defined in a test, as long as the caller
    has no process group of its own. Raises ``ParallelError`` with every failing rank's
    traceback if a rank fails or nothing comes back within ``timeout`` seconds, and always
    joins (or kills) the processes it started.
    """
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ConfigError(f"world_size={world_size!r} is not valid; it must be an integer >= 1")
    if start_method not in START_METHODS:
        raise ConfigError(
            f"start_method={start_method!r} is not valid; choose one of: {START_METHODS}"
        )
    ctx = mp.get_context(start_method)
    queue = ctx.Queue()
    port = free_port()
    procs = [
        ctx.Process(target=_rank_main, args=(fn, r, world_size, port, queue, args, kwargs, quiet))
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
    except Exception as exc:  # queue.Empty: a rank hung or died without reporting
        failures[-1] = f"no answer within {timeout}s: {exc!r}"
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join()
    if failures:
        detail = "\n".join(f"--- rank {r} ---\n{tb}" for r, tb in sorted(failures.items()))
        raise ParallelError(f"{len(failures)} rank(s) failed:\n{detail}")
    return [results[r] for r in range(world_size)]
