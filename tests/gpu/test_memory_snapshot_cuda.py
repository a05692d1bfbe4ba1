"""``export_memory_snapshot`` on CUDA (issue 42 / 48): the caching allocator's recorded
history, tagged with the run's phases and categories, read by PyTorch's own
``torch.cuda._memory_viz`` (in this process, on cuda:0)."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import torch

from tests.gpu._gpt import SMALL, gpt_step
from workbench.engine.memory_history import snapshot_of, start_history
from workbench.trace.memory_snapshot import tag_snapshot, write_snapshot


def test_the_allocators_history_is_tagged_and_read_by_memory_viz(
    tmp_path: Path, numbers: dict[str, Any]
) -> None:
    from torch.cuda import _memory_viz

    step = gpt_step(SMALL, "cuda:0")
    assert start_history(step)
    try:
        for _ in range(2):
            step.run_step()
        torch.cuda.synchronize()
        raw = snapshot_of(step)
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    assert raw is not None
    snapshot = tag_snapshot(raw["snapshot"], step.recorder.events, raw["categories"])
    path = write_snapshot(snapshot, tmp_path, 0)
    loaded = pickle.loads(path.read_bytes())
    assert "total_allocated" in _memory_viz.segsum(loaded)
    assert "entries" in _memory_viz.trace(loaded)
    allocs = [a for t in loaded["device_traces"] for a in t if a["action"] == "alloc"]
    phases = {a["phase"] for a in allocs}
    categories = {a["category"] for a in allocs}
    numbers.update(allocs=len(allocs), phases=sorted(phases), categories=sorted(categories))
    # time_us is the allocator's wall clock, as the recorder's spans are: phases line up
    assert {"forward", "backward"} <= phases
    assert {"grads", "optimizer", "activations"} <= categories
    assert all(a["frames"][0]["filename"] == "workbench" for a in allocs)
