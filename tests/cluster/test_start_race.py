"""An engine registering while start-up counts engines must not break the start (it once
gave a bare ``KeyError: 1``): the ids counted are the ids whose facts were asked for."""

from __future__ import annotations

import asyncio
from concurrent.futures import Future
from typing import Any

import pytest

from workbench.cluster import Cluster
from workbench.cluster.lifecycle.registration import engine_infos, wait_for_engines


class _Engine:
    def __init__(self, eid: int, asked: list[int]) -> None:
        self.eid, self.asked = eid, asked

    def apply_async(self, fn: Any, *args: Any) -> Future[dict[str, Any]]:
        self.asked.append(self.eid)
        future: Future[dict[str, Any]] = Future()
        future.set_result({"host": "h", "pid": 1000 + self.eid, "engine": self.eid})
        return future


class _GrowingClient:
    """One more engine has registered every time the ids are read (up to ``limit``)."""

    def __init__(self, limit: int) -> None:
        self.reads, self.limit, self.asked = 0, limit, []

    @property
    def ids(self) -> list[int]:
        self.reads += 1
        return list(range(min(self.reads, self.limit)))

    def __getitem__(self, eid: int) -> _Engine:
        return _Engine(eid, self.asked)


def test_engine_registering_between_reads_is_counted_with_its_facts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # An external cluster (nothing is launched); no controller runs, so skip looking for one.
    monkeypatch.setattr("workbench.cluster.cluster.find_connection_file", lambda *a: None)
    cluster = Cluster(n=2, cluster_id="fake")
    client = _GrowingClient(limit=3)
    cluster.engines._client = client  # type: ignore[assignment]

    async def start() -> tuple[list[int], list[dict[str, Any]]]:
        await wait_for_engines(cluster.engines, cluster.startup, lambda *_: None)
        return await engine_infos(cluster.engines, cluster.startup)

    ids, infos = asyncio.run(start())
    assert ids == [0, 1]
    assert [info["engine"] for info in infos] == [0, 1]
    assert set(ids) <= set(client.asked)
    assert client.reads >= 2  # the ids did grow while start-up was reading them
