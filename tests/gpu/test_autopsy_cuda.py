"""The hang autopsy (issue 43) with NCCL: its flight recorder names the collective a rank
waits in; a rank that never enters is named with its cell line; differing sizes (which
NCCL, unlike gloo, does not check) are named; ``cluster.stacks()`` reads a CUDA rank."""

# ruff: noqa: F811  (the tests' parameter is test_hang_nccl's fixture, imported by name)

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from tests.gpu.test_hang_nccl import _together, nccl_cluster  # noqa: F401  (the fixture)
from workbench.cluster import Cluster
from workbench.errors import CollectiveTimeout, EngineDied

CELL_TIMEOUT = 5.0

NEVER = """import time
def load_batch():
    if rank == 1:
        time.sleep(600)
    return torch.ones(1 << 10, device=device)
t = load_batch()
dist.all_reduce(t)
torch.cuda.synchronize()
"""
SIZES = """t = torch.ones(4 if rank == 0 else 8, device=device)
dist.all_reduce(t)
torch.cuda.synchronize()
"""
BUSY = """import time
x = torch.ones(8, device=device)
started = time.time()
while time.time() - started < 4:
    spin = 1
'finished'
"""


@pytest.mark.parametrize("nccl_cluster", [2], indirect=True)
def test_nccl_autopsy_of_a_rank_that_never_enters(
    nccl_cluster: Cluster, numbers: dict[str, Any]
) -> None:
    with pytest.raises(CollectiveTimeout) as info:
        nccl_cluster.execute(NEVER, timeout=CELL_TIMEOUT)
    error = info.value
    numbers.update(verdict=error.verdict, autopsy_s=error.autopsy.seconds)
    numbers["rank0"] = error.autopsy.ranks[0].line()
    assert error.verdict == "rank 1 never reached all_reduce #1: it is in load_batch (cell line 4)"
    assert error.culprits == [1]
    collective = error.autopsy.ranks[0].collective
    assert collective["op"] == "all_reduce" and collective["seq"] is not None  # NCCL's FR
    assert error.autopsy.fr_dir is not None
    nccl_cluster.recover_sync()
    assert _together(nccl_cluster) == ["2.0", "2.0"]


@pytest.mark.parametrize("nccl_cluster", [2], indirect=True)
def test_nccl_differing_sizes_are_named(nccl_cluster: Cluster, numbers: dict[str, Any]) -> None:
    try:
        out = nccl_cluster.execute(SIZES, timeout=CELL_TIMEOUT)
    except (CollectiveTimeout, EngineDied) as error:
        numbers["outcome"] = f"{type(error).__name__}: {error}"[:600]
        assert "sizes differ at all_reduce #1: 16 B on rank 0, 32 B on rank 1" in str(error)
    else:  # NCCL does not compare sizes: it may finish, reading past rank 0's buffer
        numbers["outcome"] = f"finished: {[r.ok for r in out]}"
    nccl_cluster.recover_sync()
    assert _together(nccl_cluster) == ["2.0", "2.0"]


@pytest.mark.parametrize("nccl_cluster", [1], indirect=True)
def test_stacks_of_a_cuda_rank(nccl_cluster: Cluster, numbers: dict[str, Any]) -> None:
    results: dict[str, Any] = {}
    cell = threading.Thread(
        target=lambda: results.update(out=nccl_cluster.execute(BUSY, timeout=60))
    )
    cell.start()
    try:
        deadline = time.monotonic() + 30
        while True:
            start = time.perf_counter()
            stacks = nccl_cluster.stacks()
            numbers["stacks_s"] = time.perf_counter() - start
            if "cell line 4" in stacks[0] or "cell line 5" in stacks[0]:
                break
            assert time.monotonic() < deadline, stacks
            time.sleep(0.1)
    finally:
        cell.join(60)
    assert results["out"][0].execute_result["data"]["text/plain"] == "'finished'"
