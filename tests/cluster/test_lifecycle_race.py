"""Lifecycle calls from several threads at once run one after another (``OneAtATime``):
two recoveries at once used to start two replacement engines and leave no working group."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import psutil
import pytest

from workbench.cluster import Cluster
from workbench.cluster.lifecycle.recovery import RecoveryReport
from workbench.cluster.loop import OneAtATime

pytestmark = pytest.mark.engines

ALL_REDUCE = (
    "import torch, torch.distributed as dist\nt = torch.ones(1)\ndist.all_reduce(t)\nt.item()"
)


def _at_once(calls: list[Callable[[], Any]]) -> list[Any]:
    """Run the calls in threads released together; each one's result or exception."""
    barrier = threading.Barrier(len(calls))
    outcomes: list[Any] = [None] * len(calls)

    def run(i: int) -> None:
        barrier.wait()
        try:
            outcomes[i] = calls[i]()
        except BaseException as exc:
            outcomes[i] = exc

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(600)
    assert not any(thread.is_alive() for thread in threads)
    return outcomes


def _works(cluster: Cluster) -> None:
    assert cluster.state == "running"
    ids = cluster.client.ids
    assert sorted(ids) == sorted(r.engine_id for r in cluster.ranks), ids  # no extra engine
    results = cluster.execute(ALL_REDUCE, timeout=120)
    assert [r.execute_result["data"]["text/plain"] for r in results] == ["2.0", "2.0"]


def test_two_recoveries_at_once_of_a_healthy_cluster(own_cluster: Cluster) -> None:
    reports = _at_once([own_cluster.recover_sync, own_cluster.recover_sync])
    assert all(isinstance(r, RecoveryReport) for r in reports), reports
    assert [r.replaced for r in reports] == [{}, {}]
    _works(own_cluster)


def test_two_recoveries_at_once_after_an_engine_died(own_cluster: Cluster) -> None:
    dead = own_cluster.ranks[1]
    engine = psutil.Process(dead.pid)
    engine.kill()
    engine.wait(60)
    reports = _at_once([own_cluster.recover_sync, own_cluster.recover_sync])
    assert all(isinstance(r, RecoveryReport) for r in reports), reports
    # the first replaced the engine; the second found a healthy cluster
    replaced = [r.replaced for r in reports if r.replaced]
    assert len(replaced) == 1 and list(replaced[0]) == [1], reports
    assert replaced[0][1][0] == dead.engine_id
    assert own_cluster.ranks[1].engine_id == replaced[0][1][1]
    _works(own_cluster)


def test_one_at_a_time_across_threads_and_event_loops() -> None:
    lock = OneAtATime()
    inside: list[str] = []
    overlaps: list[list[str]] = []

    async def hold(name: str) -> None:
        async with lock.hold(name):
            inside.append(name)
            if len(inside) > 1:
                overlaps.append(list(inside))
            await asyncio.sleep(0.05)
            inside.remove(name)

    def each(name: str) -> Callable[[], None]:
        return lambda: asyncio.run(hold(name))  # a loop of its own per thread

    outcomes = _at_once([each(f"call {i}") for i in range(4)])
    assert outcomes == [None] * 4
    assert overlaps == []
    assert lock.holder is None
