"""Kernel side of ``Stepper.export_memory_snapshot``: one PyTorch memory snapshot per rank.

On CUDA the engines hand over the caching allocator's recorded history
(``engine/memory_history.py``), tagged here with the phases and categories the kernel
knows; otherwise the snapshot is built from the memory samples of the recorded steps.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from workbench.engine import memory_history
from workbench.trace.events import MemorySample
from workbench.trace.memory_snapshot import (
    snapshot_from_samples,
    tag_snapshot,
    to_memory_snapshot,
    write_snapshot,
)

__all__ = ["export_memory_snapshot"]


def export_memory_snapshot(session: Any, directory: str | os.PathLike[str]) -> list[Path]:
    """``session`` is a built ``TrainingSession``; see ``Stepper.export_memory_snapshot``."""
    events = session.events
    ranks = session.run_ranks
    raw: list[Any] = [None] * len(ranks)
    if session.built:
        raw = session.cluster.run(
            memory_history.cuda_snapshot, ranks=ranks, timeout=session.timeout
        )
    if all(r is None for r in raw):
        return to_memory_snapshot(events, directory)
    paths: list[Path] = []
    out = Path(directory).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    for rank, got in zip(ranks, raw, strict=True):
        mine = [e for e in events if e.rank == rank]
        if got is None:  # a rank off CUDA in a CUDA run: from its samples
            samples = [e for e in mine if isinstance(e, MemorySample)]
            paths.append(write_snapshot(snapshot_from_samples(samples), out, rank))
            continue
        snapshot = tag_snapshot(got["snapshot"], mine, got["categories"])
        paths.append(write_snapshot(snapshot, out, rank))
    return paths
