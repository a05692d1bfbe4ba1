"""Memory per rank: stacked bytes by category over the step, peak marked, OOM line optional.

One subplot per rank (rank 0 on top), one stacked area per category. The x axis is either the
sample number on that rank (every sample equally wide, so a short optimizer phase is as
readable as a long backward), labelled with the phase of each run of samples and the step it
opens, or the time since the first event. Step boundaries are dotted on both; the module label
of each sample is in the hover text. Each rank's y range leaves room above its peak for the
peak's label, so the label is never cut by the panel's frame.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import plotly.graph_objects as go

from workbench.errors import ConfigError, choices_error
from workbench.plots.event_input import coerce_events, validate_ranks
from workbench.plots.figure_patch import FigureLike, Patch, figure_state, initial_meta
from workbench.plots.phase_axis import band_name, band_ticks, boundary_grid, extend_bands
from workbench.plots.style import CATEGORIES, MIB, category_color, format_bytes
from workbench.trace.events import Event, MemorySample

__all__ = ["X_MODES", "memory_figure", "update_memory_figure"]

X_MODES = ("sample", "time")
KIND = "memory"
_ALWAYS = CATEGORIES[:4]  # "other" gets a trace only once a rank reports some
_OOM_COLOR = "#D62728"
_GAP = 0.12  # vertical gap between rank subplots (room for two lines of tick labels)
# Share of each rank's y range above its highest point (peak or capacity): the peak label
# (about 20 px) sits there, inside the panel even with 8 ranks at the default height.
_HEADROOM = 0.25
PEAK_LABEL = "peak"  # MemoryTracer's label of a phase's own activation high


def memory_figure(
    events: Iterable[Event | Mapping[str, Any]] = (),
    *,
    capacity: int | None = None,
    ranks: Iterable[int] | None = None,
    x: str = "sample",
    t0: int | None = None,
) -> go.Figure:
    """Stacked memory by category per rank.

    ``capacity`` (bytes per device) draws the OOM line on every rank; ``ranks`` limits the
    figure to those ranks (and lays them out before any event arrives); ``x`` is "sample"
    or "time"; ``t0`` (ns) pins the time origin, which otherwise is the earliest event of the
    first batch, so figures that should line up can share it. Non-memory events are ignored.
    """
    if x not in X_MODES:
        raise choices_error("x", x, X_MODES)
    if capacity is not None and (isinstance(capacity, bool) or capacity <= 0):
        raise ConfigError(f"capacity={capacity!r} is not valid; give bytes per device (> 0)")
    wanted = validate_ranks(ranks)
    title = "Memory per rank by category"
    if capacity is not None:
        title += f" (device capacity {format_bytes(capacity)})"
    fig = go.Figure()
    fig.update_layout(
        title=title,
        template="plotly_white",
        hovermode="closest",
        legend={"title": {"text": "category"}, "traceorder": "normal"},
        margin={"l": 70, "r": 30, "t": 60, "b": 70},
        height=_height(max(len(wanted or ()), 1)),
        meta=initial_meta(
            {
                "kind": KIND,
                "x": x,
                "t0": None if t0 is None else str(t0),  # a string: see timeline.py
                "capacity": capacity,
                "ranks": wanted,
                "axes": {},  # rank -> axis number (1 = "x"/"y", 2 = "x2"/"y2", ...)
                "count": {},  # rank -> samples so far (the next sample's x in "sample" mode)
                "bands": {},  # rank -> [[step, phase, first x, last x], ...] (phase_axis)
                "peak": {},  # rank -> [x, total bytes, step, phase]
            }
        ),
    )
    fig.update_xaxes(title_text=_x_title(x))
    fig.update_yaxes(title_text="MiB")
    if wanted:
        patch = Patch(fig)
        state = figure_state(fig, KIND)
        for rank in wanted:
            _add_rank(patch, state, rank)
        _layout_ranks(patch, state)
        _assign_annotations(patch, state)
        patch.assign["meta"] = initial_meta(state)
        patch.apply(fig)
    return update_memory_figure(fig, events)


def update_memory_figure(
    fig: FigureLike, events: Iterable[Event | Mapping[str, Any]]
) -> FigureLike:
    """Append NEW memory samples to ``fig`` in place (one batch); returns ``fig``."""
    state = figure_state(fig, KIND)
    wanted = state["ranks"]
    samples = [
        e
        for e in coerce_events(events)
        if isinstance(e, MemorySample) and (wanted is None or e.rank in wanted)
    ]
    if not samples:
        return fig
    if state["t0"] is None:
        state["t0"] = str(min(s.t for s in samples))
    patch = Patch(fig)
    new_peaks: set[str] = set()
    for s in samples:
        rank = str(s.rank)
        if rank not in state["axes"]:
            _add_rank(patch, state, s.rank)
        inside = s.label == PEAK_LABEL  # a phase's own high, between two end samples
        if state["x"] == "time":
            xv = (s.t - int(state["t0"])) / 1e6
        else:  # half-way to the sample that ends its phase (the next one on this rank)
            xv = state["count"][rank] - (0.5 if inside else 0)
        if inside:
            _add_inner_peak(patch, state, s, xv)
        else:
            state["count"][rank] += 1
            extend_bands(state["bands"][rank], s.step, band_name(s.phase, s.label), xv)
            _add_sample(patch, state, s, xv)
        peak = state["peak"].get(rank)
        if peak is None or s.total > peak[1]:
            state["peak"][rank] = [xv, s.total, s.step, s.phase]
            new_peaks.add(rank)
    for rank in sorted(new_peaks, key=int):
        _set_peak(patch, state, rank)
    # Ticks, ranges and labels follow from the state alone, so every update rewrites them
    # (a few short arrays per rank): a figure grown in pieces equals one built at once.
    _layout_ranks(patch, state)
    _assign_annotations(patch, state)
    patch.assign["meta"] = initial_meta(state)
    return patch.apply(fig)


def _add_sample(patch: Patch, state: dict[str, Any], s: MemorySample, xv: float) -> None:
    """One point on every category's stacked area of the sample's rank."""
    where = f"rank {s.rank} · step {s.step} · {s.phase or 'no phase'}"
    if s.label:
        where += f" · {s.label}"
    if not patch.has(_key(s.rank, CATEGORIES[0])):
        # Fixed stacking order: params at the bottom, activations on top.
        for category in _ALWAYS:
            patch.create(_key(s.rank, category), _area(s.rank, category, state, patch))
        patch.create(_key(s.rank, "peak"), _peak(s.rank, state))
    for category in CATEGORIES:
        value = getattr(s, category)
        key = _key(s.rank, category)
        if not patch.has(key):
            if value == 0:
                continue  # "other" gets a trace (on top) at its first bytes
            patch.create(key, _area(s.rank, category, state, patch))
        patch.add(
            key,
            x=xv,
            y=value / MIB,
            hovertext=f"{where}<br>{category}: {format_bytes(value)}"
            f" · total {format_bytes(s.total)}",
        )


def _add_inner_peak(patch: Patch, state: dict[str, Any], s: MemorySample, xv: float) -> None:
    """A marker at a phase's own high (the tracer's "peak" sample): the activations peaked
    inside the phase and were freed before its end sample, which the steps do not show."""
    key = _key(s.rank, "inner peak")
    if not patch.has(key):
        patch.create(key, _inner_peak(s.rank, state, patch))
    text = (
        f"rank {s.rank} · step {s.step} · highest inside {s.phase or 'no phase'}"
        f"<br>total {format_bytes(s.total)} · activations {format_bytes(s.activations)}"
    )
    patch.add(key, x=xv, y=s.total / MIB, hovertext=text)


def _peak_label(state: dict[str, Any], rank: str) -> tuple[str, bool]:
    total = state["peak"][rank][1]
    over = state["capacity"] is not None and total > state["capacity"]
    return f"peak {format_bytes(total)}" + (" > capacity (OOM)" if over else ""), over


def _set_peak(patch: Patch, state: dict[str, Any], rank: str) -> None:
    """Move the rank's peak marker to its new highest total (red past the capacity)."""
    px, total, step, phase = state["peak"][rank]
    label, over = _peak_label(state, rank)
    patch.set(
        _key(int(rank), "peak"),
        x=[px],
        y=[total / MIB],
        hovertext=[f"rank {rank} · step {step} · {phase}<br>{label}"],
        marker={"color": _OOM_COLOR if over else "#222222"},
    )


def _assign_annotations(patch: Patch, state: dict[str, Any]) -> None:
    # Never an empty list: FigureWidget's front end draws nothing of a figure whose layout
    # holds an empty array. Labels only ever get added, so none means none before either.
    annotations = _annotations(state)
    if annotations:
        patch.assign["annotations"] = annotations


def _annotations(state: dict[str, Any]) -> list[dict[str, Any]]:
    """Every rank's capacity label and peak label, in rank order.

    The peak label sits just above the marker, inside the headroom ``_layout_ranks`` keeps
    above the peak; near either end of the x range it is anchored on that side, so it is not
    cut at the left or right edge either."""
    out: list[dict[str, Any]] = []
    bands = [b for b in state["bands"].values() if b]
    lo = min((b[0][2] for b in bands), default=0)
    span = max((b[-1][3] for b in bands), default=0) - lo
    for rank in sorted(state["axes"], key=int):
        xa, ya = _axis_names(state["axes"][rank])
        capacity = state["capacity"]
        if capacity is not None:
            out.append(
                {
                    "name": f"capacity rank {rank}",
                    "xref": f"{xa} domain",
                    "x": 1,
                    "xanchor": "right",
                    "yref": ya,
                    "y": capacity / MIB,
                    "yanchor": "bottom",
                    "text": f"capacity {format_bytes(capacity)}: OOM above",
                    "showarrow": False,
                    "font": {"color": _OOM_COLOR, "size": 11},
                }
            )
        if rank not in state["peak"]:
            continue
        px, total = state["peak"][rank][:2]
        label, over = _peak_label(state, rank)
        where = (px - lo) / span if span > 0 else 0.5
        out.append(
            {
                "name": f"peak rank {rank}",
                "xref": xa,
                "x": px,
                "xanchor": "left" if where < 0.15 else "right" if where > 0.85 else "center",
                "yref": ya,
                "y": total / MIB,
                "yanchor": "bottom",
                "yshift": 7,  # clear of the marker's triangle
                "text": label,
                "showarrow": False,
                "bgcolor": "rgba(255, 255, 255, 0.8)",  # readable over a step boundary
                "font": {"color": _OOM_COLOR if over else "#222222", "size": 11},
            }
        )
    return out


def _key(rank: int, what: str) -> str:
    return f"memory/{rank}/{what}"


def _axis_names(n: int) -> tuple[str, str]:
    return ("x", "y") if n == 1 else (f"x{n}", f"y{n}")


def _area(rank: int, category: str, state: dict[str, Any], patch: Patch) -> go.Scatter:
    xa, ya = _axis_names(state["axes"][str(rank)])
    color = category_color(category)
    # One legend entry per category, shared by all ranks through the legend group.
    first = not any(k.endswith(f"/{category}") for k in (*patch.index, *patch.new))
    return go.Scatter(
        name=category,
        legendgroup=category,
        showlegend=first,
        mode="lines",
        stackgroup=f"rank{rank}",
        # what was measured: each sample's bytes held until the next sample (a phase's
        # end), not a ramp between them; a phase's own high is a marker (_inner_peak)
        line={"width": 0.5, "color": color, "shape": "hv"},
        fillcolor=color,
        xaxis=xa,
        yaxis=ya,
        hoverinfo="text",
        meta={"rank": rank, "category": category},
    )


def _inner_peak(rank: int, state: dict[str, Any], patch: Patch) -> go.Scatter:
    xa, ya = _axis_names(state["axes"][str(rank)])
    first = not any(k.endswith("/inner peak") for k in (*patch.index, *patch.new))
    return go.Scatter(
        name="highest inside a phase",
        legendgroup="inner peak",
        showlegend=first,
        mode="markers",
        marker={"symbol": "line-ew", "size": 12, "line": {"width": 2, "color": "#222222"}},
        hoverinfo="text",
        xaxis=xa,
        yaxis=ya,
        meta={"rank": rank, "category": "inner peak"},
    )


def _peak(rank: int, state: dict[str, Any]) -> go.Scatter:
    xa, ya = _axis_names(state["axes"][str(rank)])
    return go.Scatter(
        name="peak",
        legendgroup="peak",
        showlegend=state["axes"][str(rank)] == 1,
        mode="markers",  # its label is a layout annotation (see _annotations)
        marker={"symbol": "triangle-down", "size": 11, "color": "#222222"},
        cliponaxis=False,  # the marker's triangle reaches above the highest point
        hoverinfo="text",
        xaxis=xa,
        yaxis=ya,
        meta={"rank": rank, "category": "peak"},
    )


def _add_rank(patch: Patch, state: dict[str, Any], rank: int) -> None:
    """Give a new rank its axes and, with a capacity, its OOM line."""
    number = len(state["axes"]) + 1
    state["axes"][str(rank)] = number
    state["count"][str(rank)] = 0
    state["bands"][str(rank)] = []
    xa, ya = _axis_names(number)
    capacity = state["capacity"]
    if capacity is not None:
        patch.shapes.append(
            {
                "type": "line",
                "name": f"capacity rank {rank}",
                "xref": f"{xa} domain",
                "x0": 0,
                "x1": 1,
                "yref": ya,
                "y0": capacity / MIB,
                "y1": capacity / MIB,
                "line": {"color": _OOM_COLOR, "width": 2, "dash": "dash"},
            }
        )


def _layout_ranks(patch: Patch, state: dict[str, Any]) -> None:
    """Stack the rank subplots top to bottom in rank order; x axes zoom together."""
    order = sorted(state["axes"], key=int)
    n = len(order)
    height = (1 - _GAP * (n - 1)) / n
    for row, rank in enumerate(order):
        number = state["axes"][rank]
        top = 1 - row * (height + _GAP)
        suffix = "" if number == 1 else str(number)
        bands = state["bands"][rank]
        ticks = band_ticks(bands) if state["x"] == "sample" else boundary_grid(bands)
        patch.assign[f"xaxis{suffix}"] = {
            "anchor": f"y{suffix}",
            "domain": [0, 1],
            "matches": None if number == 1 else "x",
            "title": {"text": _x_title(state["x"]) if row == n - 1 else ""},
            **ticks,
        }
        patch.assign[f"yaxis{suffix}"] = {
            "anchor": f"x{suffix}",
            "domain": [max(top - height, 0), top],
            "title": {"text": f"rank {rank}<br>MiB"},
            "rangemode": "tozero",
            **_y_range(state, rank),
        }
    patch.layout["height"] = _height(n)


def _y_range(state: dict[str, Any], rank: str) -> dict[str, Any]:
    """From 0 to the rank's peak or the capacity line, whichever is higher, plus headroom;
    plotly's own range (nothing set) until there is either."""
    peak = state["peak"].get(rank)
    highest = max(peak[1] if peak else 0, state["capacity"] or 0)
    if highest <= 0:
        return {"autorange": True}
    return {"autorange": False, "range": [0, highest / MIB / (1 - _HEADROOM)]}


def _height(ranks: int) -> int:
    # two ranks in 560 px: the stepper's figure beside its controls on a 800 px screen
    return 120 + 220 * ranks


def _x_title(mode: str) -> str:
    if mode == "sample":
        return "phase of each memory sample · dotted: step boundaries (hover: module, bytes)"
    return "time since first event (ms) · dotted: step boundaries (hover: step, phase)"
