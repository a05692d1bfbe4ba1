"""Run a function on N gloo ranks in forked processes and collect the results.

Used by the core-layer tests (trace, parallel) that need a real process group but not a
cluster of engines. Fork (not spawn) so test functions need not be importable; the parent
never initialises a process group, so forking is safe.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import socket
import traceback
from collections.abc import Callable
from typing import Any

__all__ = ["free_port", "run_ranks"]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _worker(
    fn: Callable[..., Any],
    rank: int,
    world_size: int,
    port: int,
    queue: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> None:
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
        result = fn(rank, world_size, *args, **kwargs)
        queue.put((rank, True, result))
    except BaseException:
        queue.put((rank, False, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_ranks(
    fn: Callable[..., Any],
    *args: Any,
    world_size: int = 2,
    timeout: float = 120.0,
    **kwargs: Any,
) -> list[Any]:
    """Call ``fn(rank, world_size, *args, **kwargs)`` on every rank; results in rank order.

    Raises ``RuntimeError`` with every failing rank's traceback if any rank fails or the
    run exceeds ``timeout`` seconds.
    """
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    port = free_port()
    procs = [
        ctx.Process(target=_worker, args=(fn, r, world_size, port, queue, args, kwargs))
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
    except Exception as exc:  # queue.Empty on timeout
        failures[-1] = f"timed out after {timeout}s waiting for ranks: {exc!r}"
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join()
    if failures:
        detail = "\n".join(f"--- rank {r} ---\n{tb}" for r, tb in sorted(failures.items()))
        raise RuntimeError(f"{len(failures)} rank(s) failed:\n{detail}")
    return [results[r] for r in range(world_size)]
