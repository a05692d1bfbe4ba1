"""Engines started after the start (a recovery's replacements) have their environment
checked as the start checks its engines: one with another version of a checked package
is refused with the start's message, before it joins the process group."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from workbench.cluster import Cluster
from workbench.errors import ClusterError, EngineDied

pytestmark = pytest.mark.engines

PACKAGE = "wbtest-probe"


def _install(site: Path, version: str) -> None:
    """A distribution with no code: all ``importlib.metadata`` needs to report it."""
    info = site / "wbtest_probe.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {PACKAGE}\nVersion: {version}\n")


@pytest.fixture
def probed_cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Cluster]:
    site = tmp_path / "site"
    _install(site, "1.0")
    path = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p)
    monkeypatch.setenv("PYTHONPATH", path)  # the engines' interpreters find it
    cluster = Cluster(n=2, backend="gloo", check_packages=[PACKAGE])
    cluster.start_sync()
    try:
        yield cluster
    finally:
        cluster.stop_sync()


def _kill_rank_1(cluster: Cluster) -> None:
    with pytest.raises(EngineDied, match=r"rank 1"):
        cluster.execute(
            "import os, signal, time\n"
            "if rank == 1: os.kill(os.getpid(), signal.SIGKILL)\n"
            "time.sleep(0.5)",
            timeout=120,
        )


def test_a_replacement_with_another_package_version_is_refused(
    probed_cluster: Cluster, tmp_path: Path
) -> None:
    cluster = probed_cluster
    assert cluster.environment is not None
    (row,) = cluster.environment.rows.values()
    assert row[PACKAGE] == "1.0"
    _kill_rank_1(cluster)
    _install(tmp_path / "site", "2.0")  # what the replacement's interpreter will find
    old = cluster.ranks[1].engine_id
    with pytest.raises(ClusterError, match=rf"{PACKAGE} differs: .* has 1\.0, .* has 2\.0"):
        cluster.recover_sync()
    assert cluster.ranks[1].engine_id == old  # the refused engine took no rank
    client = cluster.engines.client_unchecked()
    deadline = time.monotonic() + 60  # and it is ended, not left idle until stop
    while set(client.ids) - {r.engine_id for r in cluster.ranks} and time.monotonic() < deadline:
        time.sleep(0.1)
    assert set(client.ids) <= {r.engine_id for r in cluster.ranks}
    # the same version again: the next replacement is accepted and the group works
    _install(tmp_path / "site", "1.0")
    cluster.recover_sync()
    assert cluster.ranks[1].engine_id != old
    results = cluster.execute(
        "import torch, torch.distributed as dist\nt = torch.ones(1)\ndist.all_reduce(t)\nt.item()"
    )
    assert [r.execute_result["data"]["text/plain"] for r in results] == ["2.0", "2.0"]
