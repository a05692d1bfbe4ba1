"""Event figures carry their own state and grow in place, one batched patch per update.

Every event figure keeps what it needs to grow (time origin, rank -> axes, sample counts)
in ``layout.meta["workbench"]`` and tags each trace with ``meta={"key": ...}``. That makes
the figure itself the only state: an update function needs the figure and the new events,
never the history, and a ``go.FigureWidget`` built from the figure keeps working.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np
from plotly.basedatatypes import BaseFigure

from workbench.errors import ConfigError, choices_error
from workbench.plots.event_input import as_float_array

__all__ = ["NUMERIC", "FigureLike", "Patch", "figure_state", "initial_meta", "trace_index"]

# go.Figure and go.FigureWidget share this API (both are BaseFigure). Naming go.FigureWidget
# here would import ipywidgets/anywidget, which the plots layer must not pull in.
FigureLike = BaseFigure

_STATE_KEY = "workbench"


def figure_state(fig: FigureLike, kind: str) -> dict[str, Any]:
    """A copy of the figure's workbench state; the figure must have been built for ``kind``."""
    if not isinstance(fig, BaseFigure):
        raise ConfigError(
            f"fig={type(fig).__name__} is not valid; pass the go.Figure (or a FigureWidget "
            f"made from it) that the matching *_figure function returned"
        )
    meta = fig.layout.meta
    state = meta.get(_STATE_KEY) if isinstance(meta, dict) else None
    found = state.get("kind") if isinstance(state, dict) else None
    if found != kind:
        raise choices_error("figure kind (layout.meta) for this update", found, [kind])
    # Deep enough copy: values are plain JSON (dicts, lists, numbers).
    return _copy(state)


def _copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_copy(v) for v in value]
    return value


def initial_meta(state: dict[str, Any]) -> dict[str, Any]:
    return {_STATE_KEY: state}


def trace_index(fig: FigureLike) -> dict[str, int]:
    """Trace key -> position in ``fig.data`` for traces the workbench created."""
    index = {}
    for i, trace in enumerate(fig.data):
        meta = trace.meta
        if isinstance(meta, dict) and "key" in meta:
            index[str(meta["key"])] = i
    return index


# Properties stored as float arrays; everything else (labels, hover text) as numpy str arrays.
NUMERIC = frozenset({"x", "y", "base"})


class Patch:
    """Everything one update changes, applied to the figure in one batch.

    Traces are addressed by key. ``add(key, prop=value, ...)`` appends one point to an existing
    trace or to a trace created in this patch by ``create``; ``replace`` overwrites props of
    derived traces (a peak marker, a median line). ``categorical`` names props in ``NUMERIC``
    that hold labels for this figure (the timeline's lane names in ``y``).

    ``layout`` is merged into the figure's layout (``update_layout``); ``assign`` maps layout
    paths (``"xaxis2"``, ``"xaxis.minor"``, ``"annotations"``) to values that replace what is
    there whole. Rewriting derived layout (ticks, labels, the state in ``meta``) on every
    update goes through ``assign``: plotly's merge walks every old and new property, which
    for a few axes and annotations costs ten times the assignment.
    """

    def __init__(self, fig: FigureLike, *, categorical: frozenset[str] = frozenset()) -> None:
        self.index = trace_index(fig)
        self.categorical = categorical
        self.new: dict[str, Any] = {}
        self.points: dict[str, dict[str, list[Any]]] = {}
        self.replace: dict[str, dict[str, Any]] = {}
        self.layout: dict[str, Any] = {}
        self.assign: dict[str, Any] = {}
        self.shapes: list[dict[str, Any]] = []
        self.annotations: list[dict[str, Any]] = []

    def has(self, key: str) -> bool:
        return key in self.index or key in self.new

    def create(self, key: str, trace: Any) -> None:
        """Register a new trace (style only; its data comes from ``add``)."""
        trace.update(meta={**(trace.meta or {}), "key": key})  # the trace's own setter
        self.new[key] = trace

    def add(self, key: str, **values: Any) -> None:
        props = self.points.setdefault(key, {})
        for prop, value in values.items():
            props.setdefault(prop, []).append(value)

    def set(self, key: str, **values: Any) -> None:
        self.replace.setdefault(key, {}).update(values)

    def _array(self, prop: str, old: Any, new: list[Any]) -> Any:
        if prop in NUMERIC and prop not in self.categorical:
            return np.concatenate((as_float_array(old), np.asarray(new, dtype=float)))
        # Labels as a numpy str array: plotly validates those with one array copy instead of
        # a Python loop per element, which is most of the cost of an update otherwise.
        head = np.asarray(old if old is not None else (), dtype=str)
        return np.concatenate((head, np.asarray(new, dtype=str)))

    def apply(self, fig: FigureLike) -> FigureLike:
        """Apply in place. Reads happen before ``batch_update`` because inside it a
        FigureWidget still returns the pre-batch values."""
        updates: dict[int, dict[str, Any]] = {}
        for key, props in self.points.items():
            if key in self.new:
                self.new[key].update({p: self._array(p, None, v) for p, v in props.items()})
            else:
                trace = fig.data[self.index[key]]
                updates[self.index[key]] = {
                    p: self._array(p, trace[p], v) for p, v in props.items()
                }
        for key, props in self.replace.items():
            if key in self.new:
                self.new[key].update(props)
            else:
                updates.setdefault(self.index[key], {}).update(props)
        layout = dict(self.layout)
        # add_shape inside batch_update reads the stale tuple and drops earlier additions,
        # so new shapes/annotations are joined here and assigned once.
        if self.shapes:
            layout["shapes"] = [s.to_plotly_json() for s in fig.layout.shapes] + self.shapes
        if self.annotations:
            old = [a.to_plotly_json() for a in fig.layout.annotations]
            layout["annotations"] = old + self.annotations
        if self.new:
            fig.add_traces(list(self.new.values()))
        with _batch(fig):
            for i, props in updates.items():
                fig.data[i].update(props)
            if layout:
                fig.update_layout(layout)
            for path, value in self.assign.items():
                fig.layout[path] = value
        return fig


@contextlib.contextmanager
def _batch(fig: FigureLike) -> Iterator[None]:
    batch = getattr(fig, "batch_update", None)
    if batch is None:
        yield
    else:
        with batch():
            yield
