"""Engine-side probe for the dashboard: process memory and device memory of this rank."""

from __future__ import annotations

from typing import Any

from workbench.trace.storage import process_rss

__all__ = ["engine_memory"]


def engine_memory() -> dict[str, Any]:
    """RSS of the engine process and, on CUDA, allocated/reserved device bytes."""
    import torch

    out: dict[str, Any] = {"rss": process_rss(), "cuda_allocated": 0, "cuda_reserved": 0}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["cuda_allocated"] = int(torch.cuda.memory_allocated())
        out["cuda_reserved"] = int(torch.cuda.memory_reserved())
    return out
