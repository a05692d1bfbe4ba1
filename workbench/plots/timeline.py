"""Timeline (Gantt) of compute phases and collectives, two lanes per rank.

Each rank has a compute lane (``PhaseSpan``, colored by base phase, so "forward[mb=1]" and
"forward[mb=2]" share the forward color) and, right under it, a comm lane (``CommEvent``,
colored by op). Overlap of backward with DDP bucket all-reduces, TP's per-layer all-reduces,
FSDP's all-gathers / reduce-scatters and pipeline bubbles (gaps in the compute lane) are then
visible at a glance; hovering a collective shows op, bytes, duration and bus bandwidth.
A grey ``wait`` bar over the start of a collective is the time that rank waited in it for
its latest peer (``trace/stragglers.py``), apart from the transfer.
Phase names are written inside the compute bars wide enough to hold them, and every step
is named on a top axis over its span, its start dotted across the lanes.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import plotly.graph_objects as go

from workbench.plots.event_input import coerce_events, event_time, validate_ranks
from workbench.plots.figure_patch import FigureLike, Patch, figure_state, initial_meta
from workbench.plots.phase_axis import MAX_STEP_TICKS
from workbench.plots.style import GB, base_phase, format_bytes, op_color, phase_color
from workbench.trace.events import CommEvent, Event, PhaseSpan
from workbench.trace.stragglers import WaitMatcher

__all__ = ["comm_timeline_figure", "lane_names", "update_comm_timeline"]

KIND = "timeline"
_CATEGORICAL = frozenset({"y"})
_STEPS = "timeline/steps"


def lane_names(rank: int) -> tuple[str, str]:
    """The (compute, comm) lane labels of a rank on the y axis."""
    return f"rank {rank} compute", f"rank {rank} comm"


def comm_timeline_figure(
    events: Iterable[Event | Mapping[str, Any]] = (),
    *,
    ranks: Iterable[int] | None = None,
    t0: int | None = None,
) -> go.Figure:
    """Gantt chart of phases and collectives per rank; times in ms since ``t0``.

    ``t0`` (ns) pins the origin; otherwise it is the earliest event of the first batch.
    ``ranks`` limits the figure to those ranks and lays out their lanes up front. Memory
    samples and metrics are ignored.
    """
    wanted = validate_ranks(ranks)
    fig = go.Figure()
    # "steps": step -> [first start, last end] in ms over every rank (the top axis's labels)
    state = {"kind": KIND, "t0": t0, "ranks": wanted, "lanes": wanted or [], "steps": {}}
    state["waits"] = None
    fig.update_layout(
        title="Compute phases and collectives per rank",
        template="plotly_white",
        barmode="overlay",
        bargap=0.25,
        hovermode="closest",
        legend={"title": {"text": "phase / collective"}},
        margin={"l": 120, "r": 30, "t": 90, "b": 50},
        # A name that does not fit its bar is left out rather than shrunk to nothing.
        uniformtext={"minsize": 10, "mode": "hide"},
        xaxis={"title": {"text": "time since first event (ms)"}, "zeroline": False},
        xaxis2=_step_axis({}),
        yaxis={"title": {"text": "rank · lane"}, "type": "category", "autorange": "reversed"},
        meta=initial_meta(state),
    )
    fig.update_layout(_lane_layout(state["lanes"]))
    # plotly draws an axis only for traces on it: an empty bar trace carries the step axis.
    fig.add_trace(
        go.Bar(
            name="steps",
            orientation="h",
            x=[],
            y=[],
            base=[],
            hovertext=[],
            xaxis="x2",
            showlegend=False,
            hoverinfo="skip",
            meta={"key": _STEPS},
        )
    )
    return update_comm_timeline(fig, events)


def update_comm_timeline(
    fig: FigureLike, events: Iterable[Event | Mapping[str, Any]]
) -> FigureLike:
    """Append NEW phase spans and collectives to ``fig`` in place (one batch); returns ``fig``."""
    state = figure_state(fig, KIND)
    wanted = state["ranks"]
    spans = [
        e
        for e in coerce_events(events)
        if isinstance(e, PhaseSpan | CommEvent) and (wanted is None or e.rank in wanted)
    ]
    if not spans:
        return fig
    if state["t0"] is None:
        state["t0"] = min(event_time(e) for e in spans)
    t0 = state["t0"]
    patch = Patch(fig, categorical=_CATEGORICAL)
    lanes_before = len(state["lanes"])
    # time spent inside a collective waiting for a late peer, drawn over its start once
    # the last peer's event has arrived (in this batch or a later one)
    matcher = WaitMatcher(state.get("waits"))
    for e in spans:
        if e.rank not in state["lanes"]:
            state["lanes"].append(e.rank)
        compute, comm = lane_names(e.rank)
        start_ms = (e.start - t0) / 1e6
        length_ms = (e.end - e.start) / 1e6
        _widen_step(state["steps"], e.step, start_ms, start_ms + length_ms)
        if isinstance(e, PhaseSpan):
            base = base_phase(e.phase)
            key = f"timeline/phase/{base}"
            if not patch.has(key):
                patch.create(key, _bar(base, phase_color(base), "phase"))
            text = f"<b>{e.phase}</b> · {length_ms:.3f} ms<br>rank {e.rank} · step {e.step}"
            patch.add(key, y=compute, base=start_ms, x=length_ms, hovertext=text)
        else:
            key = f"timeline/op/{e.op}"
            if not patch.has(key):
                patch.create(key, _bar(e.op, op_color(e.op), "comm"))
            patch.add(key, y=comm, base=start_ms, x=length_ms, hovertext=comm_hover(e))
            world = len(wanted) if wanted else len(state["lanes"])
            _add_waits(patch, e.op, matcher.add(e, world) or {}, t0)
    if len(state["lanes"]) != lanes_before:
        state["lanes"].sort()
        patch.layout.update(_lane_layout(state["lanes"]))
    state["waits"] = matcher.state
    patch.assign["xaxis2"] = _step_axis(state["steps"])
    patch.assign["xaxis.minor"] = _step_starts(state["steps"])
    patch.assign["meta"] = initial_meta(state)
    return patch.apply(fig)


def _add_waits(patch: Patch, op: str, waits: dict[int, tuple[int, int]], t0: int) -> None:
    """A grey "wait" bar at the start of each member's collective that waited."""
    for rank, (start, wait) in sorted(waits.items()):
        if wait <= 0:
            continue
        if not patch.has("timeline/wait"):
            patch.create("timeline/wait", _bar("wait", "#bbbbbb", "comm"))
        text = f"<b>wait</b> for a late peer · {wait / 1e6:.3f} ms of {op}<br>rank {rank}"
        base = (start - t0) / 1e6
        patch.add("timeline/wait", y=lane_names(rank)[1], base=base, x=wait / 1e6, hovertext=text)


def comm_hover(e: CommEvent) -> str:
    """Hover text of one collective: op, size, time, bandwidths, where it ran."""
    where = f"rank {e.rank} · step {e.step}"
    if e.phase:
        where += f" · during {e.phase}"
    return (
        f"<b>{e.op}</b> · {format_bytes(e.bytes)} ({e.bytes} bytes) · "
        f"{(e.end - e.start) / 1e6:.3f} ms<br>"
        f"busbw {e.busbw / GB:.3f} GB/s · algbw {e.algbw / GB:.3f} GB/s<br>"
        f"{where} · {e.source} · group of {e.group_size}"
    )


def _bar(name: str, color: str, group: str) -> go.Bar:
    # Names are written in the compute lane's bars only: on the comm lane a grey wait bar
    # lies over the start of its collective, and the two names printed over each other
    # read as "waitreduce". Collectives are named by the legend and the hover.
    named = group == "phase"
    return go.Bar(
        name=name,
        orientation="h",
        marker={"color": color, "line": {"width": 0.5, "color": "white"}},
        opacity=0.9 if named else 0.85,
        legendgroup=group,
        legendgrouptitle={"text": "compute" if named else "collectives"},
        hoverinfo="text",  # hovertext, not the name written in the bar
        text=name if named else None,  # one string for every bar: no per-bar array to grow
        textposition="inside" if named else "none",
        insidetextanchor="middle",
        textangle=0,
        textfont={"color": "white", "size": 11},
        meta={"lane": group},
    )


def _widen_step(steps: dict[str, list[float]], step: int, start: float, end: float) -> None:
    span = steps.setdefault(str(step), [start, end])
    span[0], span[1] = min(span[0], start), max(span[1], end)


def _labelled(steps: dict[str, list[float]]) -> list[tuple[int, list[float]]]:
    """The steps in order, every k-th so that at most ``MAX_STEP_TICKS`` are named."""
    ordered = sorted(((int(k), v) for k, v in steps.items()), key=lambda kv: kv[0])
    return ordered[:: max(1, math.ceil(len(ordered) / MAX_STEP_TICKS))]


def _step_axis(steps: dict[str, list[float]]) -> dict[str, Any]:
    """A top axis over the time axis with no traces of its own: "step N" over each step."""
    named = _labelled(steps)
    axis = {"overlaying": "x", "matches": "x", "side": "top", "showgrid": False}
    axis |= {"zeroline": False, "ticks": ""}
    if not named:
        # FigureWidget's front end draws nothing of a figure with an empty tickvals array
        return axis | {"showticklabels": False}
    return axis | {
        "tickmode": "array",
        "tickvals": [(a + b) / 2 for _, (a, b) in named],
        "ticktext": [f"<b>step {step}</b>" for step, _ in named],
    }


def _step_starts(steps: dict[str, list[float]]) -> dict[str, Any]:
    """Dotted grid lines where each named step starts (the minor grid of the time axis)."""
    starts = [a for step, (a, _) in _labelled(steps) if step != min(map(int, steps))]
    if not starts:  # as in _step_axis: no empty tickvals
        return {}
    return {
        "tickmode": "array",
        "tickvals": starts,
        "showgrid": True,
        "gridcolor": "#555555",
        "griddash": "dot",
    }


def _lane_layout(ranks: list[int]) -> dict[str, Any]:
    lanes = [name for rank in sorted(ranks) for name in lane_names(rank)]
    return {
        "yaxis": {"categoryorder": "array", "categoryarray": lanes},
        "height": 160 + 48 * max(len(lanes), 2),
    }
