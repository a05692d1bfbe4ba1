"""recover(): a dead rank's replacement starts while stuck survivors are being freed (issue 31
item 4: the new engine's start is most of a recovery; freeing is reply trips), and a rank
that stays stuck is replaced after. The steps are stand-ins: this checks the order only."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from workbench.cluster.lifecycle import recovery
from workbench.cluster.state import ClusterState, StateLink
from workbench.cluster.world import World


def _fake_engines() -> Any:
    return SimpleNamespace(
        client_unchecked=lambda: SimpleNamespace(ids=[0, 2]),
        config=SimpleNamespace(launcher="local"),
    )


def _degraded() -> StateLink:
    return StateLink(lambda: ClusterState.DEGRADED, lambda: None, lambda: None)


def _ranks() -> Any:
    return tuple(SimpleNamespace(rank=r, engine_id=r, host="h", pid=100 + r) for r in range(3))


def test_replacement_starts_while_stuck_ranks_are_freed(monkeypatch: pytest.MonkeyPatch) -> None:
    events: list[str] = []
    replacing = asyncio.Event()

    async def free_stuck(
        engines: Any, ranks: Any, dead: list[int], blocked: Any
    ) -> tuple[list[int], list[int]]:
        events.append(f"free {dead}")
        # the old order replaced only after this returned: it would wait here in vain
        await asyncio.wait_for(replacing.wait(), timeout=10)
        events.append("freed")
        return [], [2]  # rank 2 stayed stuck: killed, to be replaced too

    async def replace(
        engines: Any, world: World, dead: list[int], report: Any, commit: Any
    ) -> World:
        events.append(f"replace {dead}")
        if dead:
            replacing.set()
            report.replaced.update({r: (r, 10 + r) for r in dead})
        return world

    async def nothing(*args: Any, **kwargs: Any) -> None:
        return None

    monkeypatch.setattr(recovery, "_unresponsive", lambda engines, ranks, ids: [])
    monkeypatch.setattr(recovery, "_kill_local", nothing)
    monkeypatch.setattr(recovery, "move_to_spares", lambda engines, ranks, dead: {})
    monkeypatch.setattr(recovery, "_free_stuck", free_stuck)
    monkeypatch.setattr(recovery, "_replace", replace)
    monkeypatch.setattr(recovery, "regroup", nothing)
    monkeypatch.setattr(recovery, "local_state", lambda host, pid: None)

    report = asyncio.run(
        recovery.recover(_fake_engines(), World(_ranks()), ({}, set()), _degraded(), lambda w: None)
    )
    assert events == ["free [1]", "replace [1]", "freed", "replace [2]"]
    assert report.killed == [2] and sorted(report.replaced) == [1, 2]
