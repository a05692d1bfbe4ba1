"""The hang path with NCCL. Two ranks (two GPUs): a collective one rank never enters times
out with the hang report, and recovery gives a working group. One GPU (NCCL refuses two
ranks on it): a collective whose GPU work cannot finish in time, past the group's own
timeout, where NCCL's watchdog (``TORCH_NCCL_ASYNC_ERROR_HANDLING``) acts: what happens to
the engine is recorded, and it must be reported, not hang, and recovery must work."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import psutil
import pytest

from tests.gpu.conftest import gpu_count
from tests.processes import raises_without_hanging
from workbench.cluster import Cluster
from workbench.errors import ClusterError, CollectiveTimeout, EngineDied

CELL_TIMEOUT = 5.0
GROUP_TIMEOUT = 15.0  # the process group's (and NCCL watchdog's) timeout
STALL_S = 40  # GPU time the stalled collective waits behind: past GROUP_TIMEOUT

ALONE = """
t = torch.ones(1 << 20, device=device)
if rank == 0:
    dist.all_reduce(t)
    float(t[0])
"""
STALLED = f"""
s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
s.record(); torch.cuda._sleep(100_000_000); e.record(); e.synchronize()
cycles_per_s = 1e8 / (s.elapsed_time(e) / 1e3)  # elapsed_time is in ms
torch.cuda._sleep(int({STALL_S} * cycles_per_s))  # the GPU busy for STALL_S seconds
t = torch.ones(1 << 20, device=device)
dist.all_reduce(t)
float(t[0])
"""
TOGETHER = """
t = torch.ones(8, device=device)
dist.all_reduce(t)
float(t[0])
"""


@pytest.fixture
def nccl_cluster(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    n = int(request.param)
    if gpu_count() < n:
        pytest.skip(f"needs {n} GPUs for {n} NCCL ranks; this host has {gpu_count()}")
    cluster = Cluster(n=n, init_timeout=GROUP_TIMEOUT)
    cluster.start_sync()
    try:
        assert cluster.backend == "nccl"
        yield cluster
    finally:
        cluster.stop_sync()


def _together(cluster: Cluster) -> list[str]:
    return [r.execute_result["data"]["text/plain"] for r in cluster.execute(TOGETHER, timeout=60)]


@pytest.mark.parametrize("nccl_cluster", [2], indirect=True)
def test_a_rank_that_never_enters_gets_the_hang_report(
    nccl_cluster: Cluster, numbers: dict[str, Any]
) -> None:
    with pytest.raises(CollectiveTimeout) as info:
        nccl_cluster.execute(ALONE, timeout=CELL_TIMEOUT)
    report = info.value.report
    numbers.update(pending=report["pending"], never_entered=report["never_entered"])
    assert report["pending"] == [0] and report["never_entered"] == [1]
    nccl_cluster.recover_sync()
    assert _together(nccl_cluster) == ["2.0", "2.0"]


def _engine_ended_after(pid: int, deadline_s: float) -> float | None:
    """Seconds until the engine's process ended, or None if it still runs at the deadline
    (a rank given up on refuses cells until recovery, so its process is what is watched)."""
    started = time.monotonic()
    while time.monotonic() - started < deadline_s:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return time.monotonic() - started
        except psutil.NoSuchProcess:
            return time.monotonic() - started
        time.sleep(0.5)
    return None


@pytest.mark.parametrize("nccl_cluster", [1], indirect=True)
def test_a_stalled_nccl_collective_is_reported_and_recovered(
    nccl_cluster: Cluster, numbers: dict[str, Any]
) -> None:
    started = time.monotonic()
    error = raises_without_hanging(lambda: nccl_cluster.execute(STALLED, timeout=CELL_TIMEOUT))
    numbers["cell_error"] = f"{type(error).__name__}: {error}"[:300]
    numbers["cell_error_after_s"] = round(time.monotonic() - started, 1)
    ended = _engine_ended_after(nccl_cluster.ranks[0].pid, STALL_S + 10)
    numbers["engine"] = "survived" if ended is None else f"ended {ended:.1f} s after the cell"
    time.sleep(2)  # the kernel's watch on its engines reports a death within a second
    try:
        nccl_cluster.run(int, 1, timeout=5)
        numbers["next_call"] = "answered"
    except ClusterError as e:
        numbers["next_call"] = f"{type(e).__name__}: {e}"[:300]
    assert isinstance(error, CollectiveTimeout | EngineDied)
    if ended is not None:  # a dead engine is reported as one, naming its rank
        assert numbers["next_call"].startswith("EngineDied")
    nccl_cluster.recover_sync()
    assert _together(nccl_cluster) == ["1.0"]
