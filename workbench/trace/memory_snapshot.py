"""Memory timelines in PyTorch's memory snapshot format (``torch.cuda.memory._snapshot()``).

The format pytorch.org/memory_viz opens and ``torch.cuda._memory_viz`` (``segsum``,
``trace``) reads: ``{"segments": [...], "device_traces": [[action, ...]]}``, each action an
``alloc`` / ``free_requested`` / ``free_completed`` of ``size`` bytes at ``addr`` with its
``frames``. Two sources:

- ``to_memory_snapshot(events, dir)``: built from the memory tracer's samples (CPU and
  GPU alike). Each category (params, grads, optimizer, activations, ...) gets a segment of
  its own; a rise between two samples is an ``alloc`` of the difference on top of that
  category's stack, a fall frees from the top. Every action carries its ``category``,
  ``phase`` and ``step``, also as its frame (``"<category> · <phase> · step <n>"``), which
  is what the viewers show.
- On CUDA, the caching allocator's own history (``_record_memory_history``), whose actions
  ``tag_snapshot`` tags the same way: phase and step from the rank's phase spans by time,
  category from which storages the parameters, gradients and optimizer state hold.
"""

from __future__ import annotations

import bisect
import os
import pickle
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from workbench.errors import ConfigError
from workbench.trace.events import Event, MemorySample, PhaseSpan

__all__ = [
    "SNAPSHOT_CATEGORIES",
    "snapshot_from_samples",
    "snapshot_path",
    "tag_snapshot",
    "to_memory_snapshot",
    "write_snapshot",
]

# ``MemorySample`` fields that hold distinct bytes (``allocator`` overlaps them all).
SNAPSHOT_CATEGORIES = ("params", "frozen", "grads", "optimizer", "activations", "other")
_ALIGN = 512  # the caching allocator's rounding: block sizes look as they would on CUDA
_GAP = 1 << 40  # address space between categories' segments


def _frame(category: str, phase: str, step: int) -> dict[str, Any]:
    return {
        "filename": "workbench",
        "line": step,
        "name": f"{category} · {phase or 'no phase'} · step {step}",
    }


def _action(action: str, addr: int, size: int, tag: dict[str, Any]) -> dict[str, Any]:
    frame = _frame(tag["category"], tag["phase"], tag["step"])
    return {"action": action, "addr": addr, "size": size, "stream": 0, "frames": [frame], **tag}


def snapshot_from_samples(samples: Iterable[MemorySample]) -> dict[str, Any]:
    """One rank's samples (in order) as a snapshot dict (see the module doc)."""
    samples = list(samples)
    ceiling = {c: max((getattr(s, c) for s in samples), default=0) for c in SNAPSHOT_CATEGORIES}
    base = {c: (i + 1) * _GAP for i, c in enumerate(SNAPSHOT_CATEGORIES)}
    stacks: dict[str, list[list[Any]]] = {c: [] for c in SNAPSHOT_CATEGORIES}  # [addr, size, tag]
    level = dict.fromkeys(SNAPSHOT_CATEGORIES, 0)
    trace: list[dict[str, Any]] = []
    for s in samples:
        for category in SNAPSHOT_CATEGORIES:
            want, stack = getattr(s, category), stacks[category]
            tag = {
                "category": category,
                "phase": s.phase,
                "step": s.step,
                "time_us": s.t // 1000,
                "label": s.label,
            }
            while level[category] > want and stack:  # free from the top of the stack
                addr, size, old = stack.pop()
                for action in ("free_requested", "free_completed"):
                    trace.append(_action(action, addr, size, {**old, **_when(tag)}))
                level[category] -= size
            if want > level[category]:  # a partly freed block left a remainder to re-alloc
                addr, size = base[category] + level[category], want - level[category]
                trace.append(_action("alloc", addr, size, tag))
                stack.append([addr, size, tag])
                level[category] = want
    segments = []
    for category in SNAPSHOT_CATEGORIES:
        total = -(-max(ceiling[category], 1) // _ALIGN) * _ALIGN
        blocks = [
            {
                "address": addr,
                "size": size,
                "requested_size": size,
                "state": "active_allocated",
                "frames": [_frame(tag["category"], tag["phase"], tag["step"])],
            }
            for addr, size, tag in stacks[category]
        ]
        used = sum(b["size"] for b in blocks)
        if used < total:
            blocks.append(
                {
                    "address": base[category] + used,
                    "size": total - used,
                    "requested_size": 0,
                    "state": "inactive",
                    "frames": [],
                }
            )
        segments.append(
            {
                "device": 0,
                "address": base[category],
                "total_size": total,
                "allocated_size": used,
                "active_size": used,
                "requested_size": used,
                "stream": 0,
                "segment_type": "large",
                "segment_pool_id": (0, 0),
                "is_expandable": False,
                "frames": [],
                "blocks": blocks,
                "category": category,
            }
        )
    return {"segments": segments, "device_traces": [trace], "allocator_settings": {}}


def _when(tag: dict[str, Any]) -> dict[str, Any]:
    """A free is tagged with when it happened; its category and frame stay the alloc's."""
    return {"phase": tag["phase"], "step": tag["step"], "time_us": tag["time_us"]}


def snapshot_path(directory: str | os.PathLike[str], rank: int) -> Path:
    return Path(directory) / f"memory_snapshot_rank{rank}.pickle"


def write_snapshot(
    snapshot: Mapping[str, Any], directory: str | os.PathLike[str], rank: int
) -> Path:
    """Pickle ``snapshot`` as pytorch.org/memory_viz loads it (0600: it is the user's)."""
    path = snapshot_path(directory, rank)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        pickle.dump(dict(snapshot), f)
    return path


def _directory(directory: object) -> Path:
    if not isinstance(directory, str | os.PathLike):
        raise ConfigError(f"dir={directory!r} is not valid: not a path; give a directory")
    path = Path(directory).expanduser()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"dir={str(path)!r} cannot be made ({exc.strerror or exc})") from None
    return path


def to_memory_snapshot(events: Iterable[Event], dir: str | os.PathLike[str]) -> list[Path]:
    """Write one snapshot per rank with memory samples in ``events`` to ``dir``
    (``memory_snapshot_rank<r>.pickle``); returns the paths, rank order."""
    out = _directory(dir)
    by_rank: dict[int, list[MemorySample]] = {}
    for event in events:
        if isinstance(event, MemorySample):
            by_rank.setdefault(event.rank, []).append(event)
    if not by_rank:
        raise ConfigError(
            "no memory samples in these events: record a run with its memory tracer "
            "(a Stepper run, or wb.traced(model, optimizer)) first"
        )
    return [write_snapshot(snapshot_from_samples(by_rank[r]), out, r) for r in sorted(by_rank)]


def tag_snapshot(
    snapshot: dict[str, Any], events: Iterable[Event], categories: Mapping[int, str]
) -> dict[str, Any]:
    """Tag a real CUDA snapshot's actions (in place; returned): ``phase`` and ``step``
    from the phase span its ``time_us`` falls in (microseconds since the epoch, as the
    workbench clock's ns), ``category`` from ``categories`` (address -> category of the
    storages held at the snapshot) or, for what was freed again, activations during
    forward/backward and other elsewhere. A frame naming them goes first."""
    spans = sorted((e for e in events if isinstance(e, PhaseSpan)), key=lambda e: e.start)
    starts = [s.start for s in spans]
    for trace in snapshot.get("device_traces", []):
        for entry in trace:
            t = int(entry.get("time_us", 0)) * 1000
            i = bisect.bisect_right(starts, t) - 1
            span = spans[i] if i >= 0 and spans[i].end >= t else None
            phase, step = (span.phase, span.step) if span is not None else ("", -1)
            category = categories.get(int(entry.get("addr", -1)))
            if category is None:
                base = phase.split("[", 1)[0]
                category = "activations" if base in ("forward", "backward") else "other"
            entry.update(category=category, phase=phase, step=step)
            entry["frames"] = [_frame(category, phase, step), *entry.get("frames", [])]
    return snapshot
