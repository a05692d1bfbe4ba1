"""Run a function on N forked gloo ranks and collect the results (core-layer tests).

Fork (not spawn) so test functions need not be importable; the parent never initialises a
process group, so forking is safe.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from workbench.parallel.local import free_port, run_local_ranks

__all__ = ["free_port", "run_ranks"]


def run_ranks(
    fn: Callable[..., Any],
    *args: Any,
    world_size: int = 2,
    timeout: float = 120.0,
    **kwargs: Any,
) -> list[Any]:
    """``fn(rank, world_size, *args, **kwargs)`` on every forked rank, in rank order."""
    return run_local_ranks(
        fn, *args, world_size=world_size, timeout=timeout, start_method="fork", **kwargs
    )
