from __future__ import annotations

import pytest

from tests.harness import run_ranks
from workbench.errors import ParallelError

pytestmark = pytest.mark.engines


def _sum_ranks(rank: int, world_size: int) -> float:
    import torch
    import torch.distributed as dist

    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    return float(t.item())


def _fail_on_one(rank: int, world_size: int) -> int:
    if rank == 1:
        raise ValueError("boom on rank 1")
    return rank


def test_run_ranks_all_reduce() -> None:
    assert run_ranks(_sum_ranks) == [3.0, 3.0]


def test_run_ranks_reports_failure() -> None:
    with pytest.raises(ParallelError, match="boom on rank 1"):
        run_ranks(_fail_on_one, timeout=60)
