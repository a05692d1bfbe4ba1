"""Recorders of what happens inside a distributed step: phases, memory, collectives.

Imports only torch and the standard library, so it runs in scripts, under torchrun and on
engines alike.
"""

from workbench.trace.clock import Clock
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
from workbench.trace.recorder import Recorder

__all__ = [
    "PHASES",
    "Clock",
    "CommEvent",
    "Event",
    "MemorySample",
    "Metric",
    "PhaseSpan",
    "Recorder",
    "bus_factor",
    "from_record",
    "to_record",
]
