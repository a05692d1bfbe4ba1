"""One background event loop per process for cluster control.

Cluster control is async-first; the ``*_sync`` twins submit the coroutine to this loop and
wait. A dedicated, long-lived loop (rather than ``asyncio.run`` per call) keeps ipyparallel's
launcher pollers alive between calls and works the same inside a Jupyter kernel, whose own
loop is already running.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["run_sync", "submit", "wait"]

T = TypeVar("T")

_loop: asyncio.AbstractEventLoop | None = None
_lock = threading.Lock()


def _get_loop() -> asyncio.AbstractEventLoop:
    global _loop
    with _lock:
        if _loop is None or _loop.is_closed():
            loop = asyncio.new_event_loop()
            ready = threading.Event()

            def main() -> None:
                asyncio.set_event_loop(loop)
                loop.call_soon(ready.set)
                loop.run_forever()

            threading.Thread(target=main, name="workbench-cluster-loop", daemon=True).start()
            ready.wait(10)
            _loop = loop
        return _loop


def run_sync(coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
    """Run ``coro`` on the workbench loop thread and return its result."""
    return wait(submit(coro), timeout)


def submit(coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
    """Start ``coro`` on the workbench loop thread now; ``wait`` for it later (the caller
    can do other work meanwhile, e.g. build a progress display)."""
    loop = _get_loop()
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        coro.close()
        raise RuntimeError("run_sync called from the workbench loop itself; await instead")
    return asyncio.run_coroutine_threadsafe(coro, loop)


def wait(future: concurrent.futures.Future[T], timeout: float | None = None) -> T:
    """The result of a ``submit``-ted coroutine; an interrupt (or a timeout) cancels it."""
    try:
        return future.result(timeout)
    except BaseException:
        future.cancel()
        raise
