"""Trace events: frozen, plain-data, picklable, and JSON round-trippable.

All timestamps are nanoseconds on the workbench clock (see ``clock.Clock``); all sizes are
bytes.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, ClassVar

__all__ = [
    "PHASES",
    "CommEvent",
    "Event",
    "MemorySample",
    "Metric",
    "PhaseSpan",
    "bus_factor",
    "from_record",
    "to_record",
]

# The phases of one training step, in order. Pipeline schedules add micro-batch phases
# such as "forward[mb=1]"; those keep the base phase as prefix.
PHASES: tuple[str, ...] = ("data", "forward", "backward", "sync", "optimizer")


def bus_factor(op: str, n: int) -> float:
    """nccl-tests bus-bandwidth factor: busbw = algbw * factor."""
    if n <= 1:
        return 0.0 if op in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all") else 1.0
    if op == "all_reduce":
        return 2.0 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    # broadcast, reduce, send, recv, barrier: bus bandwidth equals algorithm bandwidth
    return 1.0


@dataclass(frozen=True, slots=True, kw_only=True)
class PhaseSpan:
    """A compute phase of one step on one rank."""

    kind: ClassVar[str] = "phase"
    rank: int
    step: int
    phase: str
    start: int
    end: int

    @property
    def duration_s(self) -> float:
        return (self.end - self.start) / 1e9


@dataclass(frozen=True, slots=True, kw_only=True)
class MemorySample:
    """Bytes by category at one instant. Categories are exact counts from storages;
    ``allocator`` is torch.cuda.memory_allocated on CUDA and the process RSS on CPU."""

    kind: ClassVar[str] = "memory"
    rank: int
    step: int
    phase: str
    t: int
    params: int
    grads: int
    optimizer: int
    activations: int
    other: int = 0
    allocator: int = 0
    label: str = ""  # e.g. the module path for per-module samples during forward
    # Parameters that do not require grad (a LoRA model's base weights); ``params`` are the
    # trainable ones, whose gradients and optimizer state ``grads`` / ``optimizer`` are.
    frozen: int = 0

    @property
    def total(self) -> int:
        return (
            self.params + self.frozen + self.grads + self.optimizer + self.activations + self.other
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class CommEvent:
    """One collective or point-to-point transfer, from issue to completion."""

    kind: ClassVar[str] = "comm"
    rank: int
    step: int
    op: str
    bytes: int
    group_size: int
    start: int
    end: int
    source: str = "user"  # ddp-bucket, dtensor, fsdp, pipeline, zero, workbench, metrics, user
    phase: str = ""

    @property
    def duration_s(self) -> float:
        return max(self.end - self.start, 1) / 1e9

    @property
    def algbw(self) -> float:
        """Algorithm bandwidth in bytes/s (size / time)."""
        return self.bytes / self.duration_s

    @property
    def busbw(self) -> float:
        """Bus bandwidth in bytes/s with the nccl-tests factor for ``op``."""
        return self.algbw * bus_factor(self.op, self.group_size)


@dataclass(frozen=True, slots=True, kw_only=True)
class Metric:
    """A scalar measured at a step (loss, grad norm, tokens/s ...)."""

    kind: ClassVar[str] = "metric"
    rank: int
    step: int
    name: str
    value: float
    t: int = 0


Event = PhaseSpan | MemorySample | CommEvent | Metric

_KINDS: dict[str, type[Any]] = {c.kind: c for c in (PhaseSpan, MemorySample, CommEvent, Metric)}


def to_record(event: Event) -> dict[str, Any]:
    """Plain dict (JSON-ready) with a ``kind`` key naming the event type."""
    record = asdict(event)
    record["kind"] = event.kind
    return record


def from_record(record: dict[str, Any]) -> Event:
    """Inverse of ``to_record``; unknown keys are an error so schema drift is loud."""
    data = dict(record)
    kind = data.pop("kind", None)
    cls = _KINDS.get(str(kind))
    if cls is None:
        raise ValueError(f"unknown event kind {kind!r}; valid kinds: {sorted(_KINDS)}")
    names = {f.name for f in fields(cls)}
    extra = set(data) - names
    if extra:
        raise ValueError(f"unknown fields {sorted(extra)} for event kind {kind!r}")
    return cls(**data)
