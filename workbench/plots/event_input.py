"""What the event figures accept: events or ``to_record`` dicts, ranks, numeric arrays.

Input coercion shared by every figure in ``workbench.plots``: a list of events (objects or
records) becomes event objects, a rank filter is checked, and a trace's numeric data is read
back as floats whatever form the figure holds it in.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from workbench.errors import ConfigError
from workbench.trace.events import CommEvent, Event, MemorySample, Metric, PhaseSpan, from_record

__all__ = ["as_float_array", "coerce_events", "event_time", "validate_ranks"]

_EVENT_TYPES = (PhaseSpan, MemorySample, CommEvent, Metric)


def coerce_events(events: Iterable[Event | Mapping[str, Any]]) -> list[Event]:
    """Event objects pass through; records (dicts from ``to_record``) are decoded."""
    if isinstance(events, (str, bytes, Mapping)):
        raise ConfigError(
            f"events={type(events).__name__} is not valid; pass a list of events or records"
        )
    out: list[Event] = []
    for item in events:
        if isinstance(item, _EVENT_TYPES):
            out.append(item)
        elif isinstance(item, Mapping):
            try:
                out.append(from_record(dict(item)))
            except (ValueError, TypeError) as exc:
                raise ConfigError(f"bad event record {dict(item)!r}: {exc}") from exc
        else:
            names = ", ".join(t.__name__ for t in _EVENT_TYPES)
            raise ConfigError(
                f"event {item!r} of type {type(item).__name__} is not valid; "
                f"choose one of: {names}, or a record dict from to_record"
            )
    return out


def event_time(event: Event) -> int:
    """The earliest timestamp an event carries (ns); 0 for metrics without a time."""
    if isinstance(event, MemorySample):
        return event.t
    if isinstance(event, Metric):
        return event.t
    return event.start


def as_float_array(value: Any) -> np.ndarray:
    """A trace's numeric data as floats, whatever form the figure holds it in.

    A figure that went through JSON, pickle or ``copy.deepcopy`` holds numpy data as plotly's
    typed-array spec ``{"dtype": "f8", "bdata": <base64>}`` instead of an array.
    """
    if value is None:
        return np.empty(0, dtype=float)
    if isinstance(value, Mapping) and "bdata" in value:
        raw = base64.b64decode(value["bdata"])
        return np.frombuffer(raw, dtype=np.dtype(str(value["dtype"])).newbyteorder("<")).astype(
            float
        )
    return np.asarray(value, dtype=float)


def validate_ranks(ranks: Iterable[int] | None) -> list[int] | None:
    if ranks is None:
        return None
    out = []
    for r in ranks:
        if isinstance(r, bool) or not isinstance(r, (int, np.integer)) or r < 0:
            raise ConfigError(f"ranks contains {r!r}; ranks are integers >= 0")
        out.append(int(r))
    return sorted(set(out))
