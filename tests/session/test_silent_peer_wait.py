"""A step whose ranks wait on a host that went silent returns as soon as the controller
drops the host's engines (``rank_failures.wait_unless_a_rank_failed``), with no engines:
the survivors' requests never finish by themselves (no reset reaches them), so waiting for
them to fail first meant waiting for the process group's timeout."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

from workbench.session.rank_failures import wait_unless_a_rank_failed


class _Pending:
    """A request that never gets its reply (a rank blocked in a collective)."""

    def ready(self) -> bool:
        return False

    def wait(self, timeout: float) -> None:
        threading.Event().wait(timeout)


class _Cluster:
    def __init__(self, dead: set[int]) -> None:
        self.dead = dead

    def _dead_engine(self, future: Any, engine_id: int) -> bool:
        return engine_id in self.dead


def test_the_wait_ends_once_an_engine_is_gone_though_no_rank_failed() -> None:
    targets = [SimpleNamespace(rank=r, engine_id=10 + r) for r in range(4)]
    futures = [_Pending() for _ in targets]
    cluster = _Cluster(dead=set())
    waiter = threading.Thread(
        target=wait_unless_a_rank_failed, args=(cluster, targets, futures, None), daemon=True
    )
    waiter.start()
    waiter.join(1.0)
    assert waiter.is_alive()  # nothing has happened yet: it waits
    cluster.dead = {12, 13}  # the controller dropped the silent host's engines
    waiter.join(60)  # a bound on a hang, generous for a busy machine
    assert not waiter.is_alive(), "the wait went on after the engines were gone"
