"""One entry point for live views: feed every new event to every figure.

The stepper pulls new records from the engines once per phase and calls ``extend_figure``
on each of its figures; each figure takes the events it draws and ignores the rest.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from workbench.errors import ConfigError, choices_error
from workbench.plots.bandwidth import update_bandwidth_figure
from workbench.plots.figure_patch import FigureLike
from workbench.plots.loss import update_loss_figure
from workbench.plots.memory import update_memory_figure
from workbench.plots.timeline import update_comm_timeline
from workbench.trace.events import Event

__all__ = ["UPDATERS", "extend_figure"]

UPDATERS: dict[str, Callable[[Any, Any], Any]] = {
    "memory": update_memory_figure,
    "timeline": update_comm_timeline,
    "loss": update_loss_figure,
    "bandwidth": update_bandwidth_figure,
}


def extend_figure(fig: FigureLike, events: Iterable[Event | Mapping[str, Any]]) -> FigureLike:
    """Append NEW events to any figure built by a workbench event-figure function."""
    meta = getattr(getattr(fig, "layout", None), "meta", None)
    state = meta.get("workbench") if isinstance(meta, dict) else None
    kind = state.get("kind") if isinstance(state, dict) else None
    if kind is None:
        raise ConfigError(
            "this figure was not built by workbench.plots (no layout.meta['workbench']); "
            "build it with memory_figure, comm_timeline_figure, loss_figure or bandwidth_figure"
        )
    if kind not in UPDATERS:
        raise choices_error("figure kind", kind, UPDATERS)
    return UPDATERS[kind](fig, events)
