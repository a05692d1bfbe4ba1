"""Timeline (Gantt) of compute phases and collectives, two lanes per rank.

Each rank has a compute lane (``PhaseSpan``, colored by base phase, so "forward[mb=1]" and
"forward[mb=2]" share the forward color) and, right under it, a comm lane (``CommEvent``,
colored by op). Overlap of backward with DDP bucket all-reduces, TP's per-layer all-reduces,
FSDP's all-gathers / reduce-scatters and pipeline bubbles (gaps in the compute lane) are then
visible at a glance; hovering a collective shows op, bytes, duration and bus bandwidth.
A grey ``wait`` bar over the start of a collective is the time that rank waited in it for
its latest peer (``trace/stragglers.py``), apart from the transfer.
Phase names are written inside the compute bars wide enough to hold them, what each
collective moved (bytes, bus bandwidth) inside its bar when it is wide enough, and steps are
named on a top axis over their spans (as many as fit), their starts dotted across the lanes.

The x axis is *busy* time: a pause longer than ``IDLE_MS`` in which no rank did anything
(a teacher between two clicks) is cut down to ``KEPT_MS`` and marked by a dashed line, so a
25 ms step stays visible after a minute of talking. The cuts are kept in the figure's state
(raw start, raw end, ms removed), so a late event lands where its time belongs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import plotly.graph_objects as go

from workbench.plots.event_input import coerce_events, event_time, validate_ranks
from workbench.plots.figure_patch import FigureLike, Patch, figure_state, initial_meta
from workbench.plots.phase_axis import spaced
from workbench.plots.style import GB, base_phase, format_bytes, op_color, phase_color
from workbench.trace.events import CommEvent, Event, PhaseSpan
from workbench.trace.stragglers import WaitMatcher

__all__ = ["IDLE_MS", "KEPT_MS", "comm_timeline_figure", "lane_names", "update_comm_timeline"]

KIND = "timeline"
_CATEGORICAL = frozenset({"y"})
_STEPS = "timeline/steps"
# A pause with no event on any rank longer than this is cut out of the time axis, down to
# KEPT_MS (a step of a small model takes ~25 ms; between two clicks pass seconds).
IDLE_MS = 50.0
KEPT_MS = 1.0
_CUT = {"type": "line", "yref": "paper", "y0": 0, "y1": 1}
_CUT_LINE = {"color": "#888888", "width": 1, "dash": "dash"}


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
    origin = None if t0 is None else str(t0)  # a string, as below
    state = {"kind": KIND, "t0": origin, "ranks": wanted, "lanes": wanted or [], "steps": {}}
    state["waits"] = None
    # busy time: "cuts" are [raw start ms, raw end ms, ms removed]; "end" the latest raw end
    state["cuts"], state["end"] = [], None
    fig.update_layout(
        title="Compute phases and collectives per rank",
        template="plotly_white",
        barmode="overlay",
        bargap=0.25,
        hovermode="closest",
        # Under the plot, in rows: at the right, with its group titles, it outgrew the
        # lanes' height and scrolled, hiding "wait" or "all_reduce" (issue 49).
        legend={
            "orientation": "h",
            "yref": "container",
            "y": 0,
            "yanchor": "bottom",
            "x": 0,
            "title": {"text": "phase / collective"},
        },
        margin={"l": 120, "r": 30, "t": 90, "b": 120},
        # A name that does not fit its bar is left out rather than shrunk to nothing.
        uniformtext={"minsize": 10, "mode": "hide"},
        xaxis={"title": {"text": _time_title(0, 0.0)}, "zeroline": False},
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
        # a string: a notebook's JSON goes through JavaScript numbers, and nanoseconds since
        # the epoch (above 2**53) would come back changed from a reload (issue 49)
        state["t0"] = str(min(event_time(e) for e in spans))
    t0 = int(state["t0"])
    patch = Patch(fig, categorical=_CATEGORICAL)
    ordered = sorted(((e.start - t0) / 1e6, (e.end - t0) / 1e6) for e in spans)
    _cut_idle(patch, state, ordered)
    busy = _busy_clock(state["cuts"])
    lanes_before = len(state["lanes"])
    # time spent inside a collective waiting for a late peer, drawn over its start once
    # the last peer's event has arrived (in this batch or a later one)
    matcher = WaitMatcher(state.get("waits"))
    for e in spans:
        if e.rank not in state["lanes"]:
            state["lanes"].append(e.rank)
        compute, comm = lane_names(e.rank)
        start_ms = busy((e.start - t0) / 1e6)
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
            patch.add(
                key, y=comm, base=start_ms, x=length_ms, hovertext=comm_hover(e), text=_moved(e)
            )
            world = len(wanted) if wanted else len(state["lanes"])
            _add_waits(patch, e.op, matcher.add(e, world) or {}, t0, busy)
    if len(state["lanes"]) != lanes_before:
        state["lanes"].sort()
        patch.layout.update(_lane_layout(state["lanes"]))
    state["waits"] = matcher.state
    patch.assign["xaxis2"] = _step_axis(state["steps"])
    patch.assign["xaxis.minor"] = _step_starts(state["steps"])
    cut = sum(c[1] - c[0] for c in state["cuts"]) / 1e3
    patch.assign["xaxis.title.text"] = _time_title(len(state["cuts"]), cut)
    patch.assign["meta"] = initial_meta(state)
    return patch.apply(fig)


def _time_title(cuts: int, seconds: float) -> str:
    if not cuts:
        return "busy time (ms) since the first event"
    pauses = "1 pause" if cuts == 1 else f"{cuts} pauses"
    return f"busy time (ms) · {pauses} ({seconds:.1f} s) cut out, each dashed"


def _cut_idle(patch: Patch, state: dict[str, Any], spans: list[tuple[float, float]]) -> None:
    """Record each pause (no event on any rank for over ``IDLE_MS``) after the latest end
    seen, and draw a dashed line where it is cut. ``spans`` are raw ms, by start."""
    cuts, end = state["cuts"], state["end"]
    for start, stop in spans:
        if end is not None and start - end > IDLE_MS:
            removed = start - end - KEPT_MS
            cuts.append([end, start, removed])
            at = _busy_clock(cuts)(end) + KEPT_MS / 2
            patch.shapes.append({**_CUT, "xref": "x", "x0": at, "x1": at, "line": _CUT_LINE})
        end = stop if end is None else max(end, stop)
    state["end"] = end


def _busy_clock(cuts: list[list[float]]) -> Any:
    """Raw ms since t0 -> busy ms: less what every cut before that time removed (a time
    inside a cut, from a late event, is put at the cut's end)."""

    def busy(raw: float) -> float:
        removed = 0.0
        for start, stop, gone in cuts:
            if raw <= start:
                break
            removed += gone if raw >= stop else gone * (raw - start) / (stop - start)
        return raw - removed

    return busy


def _moved(e: CommEvent) -> str:
    """What a collective moved, written inside its bar (hidden when it does not fit)."""
    rate = e.busbw / GB
    speed = f"{rate:.1f} GB/s" if rate >= 1 else f"{rate * 1e3:.0f} MB/s"
    return f"{format_bytes(e.bytes)} · {speed}"


def _add_waits(
    patch: Patch, op: str, waits: dict[int, tuple[int, int]], t0: int, busy: Any
) -> None:
    """A grey "wait" bar at the start of each member's collective that waited."""
    for rank, (start, wait) in sorted(waits.items()):
        if wait <= 0:
            continue
        if not patch.has("timeline/wait"):
            patch.create("timeline/wait", _bar("wait", "#bbbbbb", "comm"))
        text = f"<b>wait</b> for a late peer · {wait / 1e6:.3f} ms of {op}<br>rank {rank}"
        base = busy((start - t0) / 1e6)
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
    # read as "waitreduce". Collectives are named by the legend and the hover; their bars
    # carry what they moved (per bar, ``_moved``), at their end, clear of a wait bar.
    named = group == "phase"
    moved = name != "wait" and not named
    return go.Bar(
        name=name,
        orientation="h",
        marker={"color": color, "line": {"width": 0.5, "color": "white"}},
        opacity=0.9 if named else 0.85,
        legendgroup=group,
        legendgrouptitle={"text": "compute" if named else "collectives"},
        hoverinfo="text",  # hovertext, not the name written in the bar
        text=name if named else None,  # one string for every bar: no per-bar array to grow
        textposition="inside" if named or moved else "none",
        insidetextanchor="end" if moved else "middle",
        textangle=0,
        textfont={"color": "white", "size": 11 if named else 10},
        meta={"lane": group},
    )


def _widen_step(steps: dict[str, list[float]], step: int, start: float, end: float) -> None:
    span = steps.setdefault(str(step), [start, end])
    span[0], span[1] = min(span[0], start), max(span[1], end)


def _labelled(steps: dict[str, list[float]]) -> list[tuple[int, list[float]]]:
    """The steps in order, those whose "step N" labels fit side by side (``spaced``)."""
    ordered = sorted(((int(k), v) for k, v in steps.items()), key=lambda kv: kv[0])
    if not ordered:
        return []
    extent = max(b for _, (_, b) in ordered) - min(a for _, (a, _) in ordered)
    centers = [(a + b) / 2 for _, (a, b) in ordered]
    return [ordered[i] for i in spaced(centers, extent)]


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
        "height": 230 + 48 * max(len(lanes), 2),  # the legend's rows under the plot
    }
