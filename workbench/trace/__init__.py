"""Recorders of what happens inside a distributed step: phases, memory, collectives.

Imports only torch and the standard library, so it runs in scripts, under torchrun and on
engines alike.
"""

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
from workbench.trace.memory import MemoryTracer
from workbench.trace.perfetto import to_perfetto
from workbench.trace.recorder import Recorder
from workbench.trace.storage import (
    gradient_bytes,
    optimizer_bytes,
    parameter_bytes,
    process_rss,
    storage_bytes,
)

__all__ = [
    "PHASES",
    "Clock",
    "CommEvent",
    "CommTracer",
    "Event",
    "MemorySample",
    "MemoryTracer",
    "Metric",
    "PhaseSpan",
    "Recorder",
    "bus_factor",
    "from_record",
    "gradient_bytes",
    "optimizer_bytes",
    "parameter_bytes",
    "process_rss",
    "storage_bytes",
    "to_perfetto",
    "to_record",
]
