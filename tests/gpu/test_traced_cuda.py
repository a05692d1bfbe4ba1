"""``wb.traced`` on a hand-written CUDA loop (a 1-rank NCCL group in this process) and its
Perfetto export: phase spans, NCCL all-reduces timed with CUDA events, CUDA memory."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import workbench as wb
from tests.gpu._gpt import SMALL
from workbench.engine.traced import trace_recorder
from workbench.parallel.data import make_dataset
from workbench.parallel.models import build_model, loss_fn_for
from workbench.trace.perfetto import to_perfetto

STEPS = 3
REDUCED = 1 << 26  # 256 MiB of fp32: long enough on the GPU to time


@pytest.fixture
def nccl_rank() -> Iterator[None]:
    import torch.distributed as dist

    torch.cuda.set_device(0)
    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _traced_loop(device: str, path: Path) -> tuple[list[Any], dict[str, Any]]:
    """A hand-written loop under ``wb.traced``; its events and its Perfetto file, read back."""
    import torch.distributed as dist

    model = build_model(SMALL).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = (t.to(device) for t in make_dataset(SMALL, 8).tensors)
    loss_fn = loss_fn_for(SMALL)
    big = torch.ones(REDUCED, device=device)
    with wb.traced(model, optimizer) as t:
        for _ in range(STEPS):
            with t.phase("forward"):
                loss = loss_fn(model(x), y)
            with t.phase("backward"):
                loss.backward()
            with t.phase("sync"):
                dist.all_reduce(big)
            with t.phase("optimizer"):
                optimizer.step()
                optimizer.zero_grad()
            t.step(loss=loss)
    events = trace_recorder().events
    trace = to_perfetto(events, path)
    on_disk = json.loads(path.read_text())
    assert on_disk == json.loads(json.dumps(trace))
    return events, on_disk


def test_traced_cuda_loop_exports_to_perfetto(
    nccl_rank: None, tmp_path: Path, numbers: dict[str, Any]
) -> None:
    events, on_disk = _traced_loop("cuda:0", tmp_path / "loop.json")
    spans = [e for e in on_disk["traceEvents"] if e.get("ph") == "X"]
    reduces = [e for e in spans if e["name"] == "all_reduce"]
    allocator = [
        e["args"]["bytes"] for e in on_disk["traceEvents"] if e["name"] == "memory: allocator"
    ]
    numbers.update(
        events=len(events),
        all_reduces=len(reduces),
        all_reduce_us=[round(e["dur"], 1) for e in reduces],
        busbw_GBps=[round(e["args"]["busbw_GBps"], 1) for e in reduces],
        allocator_max=max(allocator, default=0),
    )
    assert {"forward", "backward", "sync", "optimizer"} <= {e["name"] for e in spans}
    assert len(reduces) == STEPS
    assert all(e["args"]["bytes"] == REDUCED * 4 and e["dur"] > 0 for e in reduces)
    # the allocator counter is CUDA's (model + a 256 MiB tensor), not the process RSS
    assert max(allocator) >= REDUCED * 4
    assert max(allocator) <= torch.cuda.max_memory_allocated()
