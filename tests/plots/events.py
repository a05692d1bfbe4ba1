"""Synthetic traces for the figure tests, built from the event dataclasses directly."""

from __future__ import annotations

from workbench.plots import synthetic_events
from workbench.trace.events import CommEvent, Event, MemorySample, PhaseSpan

MS = 1_000_000


def ddp_events(steps: int = 4) -> list[Event]:
    """2 ranks, DDP-like: bucket all-reduces overlapping backward (15 events/rank/step)."""
    return synthetic_events(steps, 2, seed=1)


def of_steps(events: list[Event], steps: range) -> list[Event]:
    return [e for e in events if e.step in steps]


def samples(events: list[Event], rank: int) -> list[MemorySample]:
    return [e for e in events if isinstance(e, MemorySample) and e.rank == rank]


def pipeline_events() -> list[Event]:
    """Two pipeline stages, two micro-batches, with p2p transfers and an FSDP-style gather."""
    t = 1_000 * MS
    out: list[Event] = []
    for rank in (0, 1):
        offset = rank * 4 * MS
        for mb in (0, 1):
            start = t + offset + mb * 5 * MS
            out.append(
                PhaseSpan(
                    rank=rank, step=0, phase=f"forward[mb={mb}]", start=start, end=start + 4 * MS
                )
            )
            op = "send" if rank == 0 else "recv"
            out.append(
                CommEvent(
                    rank=rank,
                    step=0,
                    op=op,
                    bytes=(mb + 1) * 65536,
                    group_size=2,
                    start=start + 4 * MS,
                    end=start + 5 * MS,
                    source="pipeline",
                    phase=f"forward[mb={mb}]",
                )
            )
        out.append(
            CommEvent(
                rank=rank,
                step=0,
                op="all_gather",
                bytes=3 << 20,
                group_size=2,
                start=t,
                end=t + 2 * MS,
                source="fsdp",
            )
        )
        out.append(
            CommEvent(
                rank=rank,
                step=0,
                op="reduce_scatter",
                bytes=3 << 20,
                group_size=2,
                start=t + 20 * MS,
                end=t + 23 * MS,
                source="fsdp",
            )
        )
    return out
