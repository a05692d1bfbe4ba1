"""Recorders of what happens inside a distributed step: phases, memory, collectives.

Imports only torch and the standard library, so it runs in scripts, under torchrun and on
engines alike.
"""

import importlib
from typing import TYPE_CHECKING, Any

# Resolved on first use (PEP 562): code that needs only the torch-free parts (events,
# recorder, clock; e.g. the kernel's hang reports) does not pay for importing torch.
_LAZY: dict[str, str] = {
    "Clock": "clock",
    "CommTracer": "comm",
    "PHASES": "events",
    "CommEvent": "events",
    "Event": "events",
    "MemorySample": "events",
    "Metric": "events",
    "PhaseSpan": "events",
    "bus_factor": "events",
    "from_record": "events",
    "to_record": "events",
    "MemoryTracer": "memory",
    "to_hta": "hta",
    "to_perfetto": "perfetto",
    "Recorder": "recorder",
    "RecordPolicy": "policy",
    "schedule": "policy",
    "EventStore": "store",
    "StepSummaries": "summary",
    "to_memory_snapshot": "memory_snapshot",
    "gradient_bytes": "storage",
    "optimizer_bytes": "storage",
    "parameter_bytes": "storage",
    "process_rss": "storage",
    "storage_bytes": "storage",
    "collective_waits": "stragglers",
    "straggler_summary": "stragglers",
}

if TYPE_CHECKING:
    from workbench.trace.clock import Clock
    from workbench.trace.comm import CommTracer
    from workbench.trace.events import (
        PHASES,
        CommEvent,
        Event,
        MemorySample,
        Metric,
        PhaseSpan,
        bus_factor,
        from_record,
        to_record,
    )
    from workbench.trace.hta import to_hta
    from workbench.trace.memory import MemoryTracer
    from workbench.trace.memory_snapshot import to_memory_snapshot
    from workbench.trace.perfetto import to_perfetto
    from workbench.trace.policy import RecordPolicy, schedule
    from workbench.trace.recorder import Recorder
    from workbench.trace.storage import (
        gradient_bytes,
        optimizer_bytes,
        parameter_bytes,
        process_rss,
        storage_bytes,
    )
    from workbench.trace.store import EventStore
    from workbench.trace.stragglers import collective_waits, straggler_summary
    from workbench.trace.summary import StepSummaries

__all__ = [
    "PHASES",
    "Clock",
    "CommEvent",
    "CommTracer",
    "Event",
    "EventStore",
    "MemorySample",
    "MemoryTracer",
    "Metric",
    "PhaseSpan",
    "RecordPolicy",
    "Recorder",
    "StepSummaries",
    "bus_factor",
    "collective_waits",
    "from_record",
    "gradient_bytes",
    "optimizer_bytes",
    "parameter_bytes",
    "process_rss",
    "schedule",
    "storage_bytes",
    "straggler_summary",
    "to_hta",
    "to_memory_snapshot",
    "to_perfetto",
    "to_record",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'workbench.trace' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"workbench.trace.{module}"), name)
    globals()[name] = value
    return value
