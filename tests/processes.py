"""Process checks shared by the tests that verify nothing is left running."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import psutil

from workbench.errors import ClusterError

__all__ = ["alive", "raises_without_hanging"]

BOUND_S = 30.0  # generous: "fast" means no hang, not a speed on a busy machine


def alive(pids: list[int]) -> list[int]:
    """The pids that still run (a zombie has exited: it does not count)."""
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            continue
    return out


def raises_without_hanging(call: Callable[[], Any], bound_s: float = BOUND_S) -> ClusterError:
    """Run ``call`` on a thread; it must raise a ``ClusterError`` within ``bound_s``."""
    outcome: list[BaseException | None] = []

    def target() -> None:
        try:
            call()
        except BaseException as exc:
            outcome.append(exc)
        else:
            outcome.append(None)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(bound_s)
    assert not thread.is_alive(), f"{call} still waits after {bound_s} s"
    exc = outcome[0]
    assert isinstance(exc, ClusterError), exc
    return exc
