"""The async/sync rule (workbench.cluster.loop): the plain name is the coroutine, the
``_sync`` twin blocks, and a plain-name call that is never awaited warns naming the twin."""

from __future__ import annotations

import asyncio
import gc

import pytest

from workbench.cluster import Cluster
from workbench.cluster.loop import async_first, run_anywhere, run_sync, sync_twin


class Counter:
    def __init__(self) -> None:
        self.calls = 0

    @async_first
    async def bump(self, by: int = 1) -> int:
        """Add ``by``."""
        await asyncio.sleep(0)
        self.calls += by
        return self.calls

    bump_sync = sync_twin(bump)


def test_await_and_sync_twin_run_the_same_coroutine() -> None:
    c = Counter()

    async def main() -> int:
        return await c.bump(2)

    assert asyncio.run(main()) == 2
    assert c.bump_sync(3) == 5
    assert run_sync(c.bump()) == 6  # a pending call can be handed to run_sync too
    assert Counter.bump_sync.__name__ == "bump_sync"
    assert "Add ``by``." in (Counter.bump_sync.__doc__ or "")


def test_a_dropped_call_warns_naming_the_twin_and_does_nothing() -> None:
    c = Counter()
    with pytest.warns(RuntimeWarning, match=r"counter\.bump\(\) was never awaited") as record:
        c.bump()
        gc.collect()
    assert "counter.bump_sync()" in str(record[0].message)
    assert c.calls == 0


def test_the_cluster_follows_the_rule() -> None:
    for name in ("start", "stop", "restart", "recover"):
        assert getattr(Cluster, f"{name}_sync").__name__ == f"{name}_sync"
        assert asyncio.iscoroutinefunction(getattr(Cluster, name).__wrapped__)
    cluster = Cluster(n=1)
    with pytest.warns(RuntimeWarning, match=r"cluster\.start_sync\(\)"):
        cluster.start()  # a script that forgot the twin: nothing starts, and it says so
        gc.collect()
    assert cluster.state == "stopped"


async def _where() -> str:
    """A coroutine that, like ``signals.signal_rank``, only waits; names its thread."""
    import threading

    await asyncio.sleep(0)
    return threading.current_thread().name


def test_run_anywhere_runs_a_coroutine_from_any_synchronous_caller() -> None:
    # From plain code (a script, the kernel's thread): on the workbench loop.
    assert run_anywhere(_where()) == "workbench-cluster-loop"

    # From synchronous code running on the workbench loop itself (run_sync refuses there:
    # the loop cannot wait on itself): on a short-lived thread of its own.
    async def on_the_loop() -> str:
        with pytest.raises(RuntimeError, match="run_sync called from the workbench loop"):
            run_sync(_where())
        return run_anywhere(_where())

    assert run_sync(on_the_loop()).startswith("workbench-run-anywhere")

    # From a thread whose own loop is running (a Jupyter kernel's): on the workbench loop.
    async def in_another_loop() -> str:
        return run_anywhere(_where())

    assert asyncio.run(in_another_loop()) == "workbench-cluster-loop"
