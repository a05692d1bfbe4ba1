"""Engine-side probe for the dashboard: process memory and device memory of this rank."""

from __future__ import annotations

import os
from typing import Any

__all__ = ["engine_memory"]


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        import resource

        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def engine_memory() -> dict[str, Any]:
    """RSS of the engine process and, on CUDA, allocated/reserved device bytes."""
    import torch

    out: dict[str, Any] = {"rss": _rss_bytes(), "cuda_allocated": 0, "cuda_reserved": 0}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["cuda_allocated"] = int(torch.cuda.memory_allocated())
        out["cuda_reserved"] = int(torch.cuda.memory_reserved())
    return out
