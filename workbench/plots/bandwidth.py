"""Collective bus bandwidth vs message size (the nccl-tests picture), log-x.

Small messages are latency bound and large ones bandwidth bound; the curve shows where the
knee is, which is what decides DDP's bucket size. Each measurement is a marker, the median per
size a line.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from numbers import Real
from typing import Any

import numpy as np
import plotly.graph_objects as go

from workbench.errors import ConfigError
from workbench.plots.event_input import as_float_array, coerce_events
from workbench.plots.figure_patch import FigureLike, Patch, figure_state, initial_meta
from workbench.plots.style import GB, format_bytes, op_color
from workbench.trace.events import CommEvent, bus_factor

__all__ = ["bandwidth_figure", "update_bandwidth_figure"]

KIND = "bandwidth"
Point = tuple[int, float]  # (bytes, seconds)


def bandwidth_figure(
    points: Iterable[Point | CommEvent | Mapping[str, Any]] = (),
    *,
    op: str | None = "all_reduce",
    world_size: int | None = None,
) -> go.Figure:
    """Bus bandwidth (GB/s) vs message size (bytes, log scale).

    ``points`` are ``(bytes, seconds)`` measurements of ``op`` over ``world_size`` ranks
    (both needed to turn time into bus bandwidth), or ``CommEvent`` objects / records, which
    carry their own op and group size; events of other ops are ignored (``op=None`` keeps
    every op, one color each). Other event kinds are ignored.
    """
    if world_size is not None and (isinstance(world_size, bool) or world_size < 1):
        raise ConfigError(f"world_size={world_size!r} is not valid; give the ranks (>= 1)")
    what = op or "collective"
    title = f"{what} bus bandwidth vs message size"
    if world_size is not None:
        title += f" ({world_size} ranks)"
    fig = go.Figure()
    fig.update_layout(
        title=title,
        template="plotly_white",
        hovermode="closest",
        # one tick per decade (1k, 10k, 100k, 1M): plotly's own log ticks add minor
        # digits between them, which read as "5, 10k, 2, 5, 100k"
        xaxis={
            "title": {"text": "message size (bytes, log scale)"},
            "type": "log",
            "dtick": 1,
            "exponentformat": "SI",
        },
        yaxis={"title": {"text": "bus bandwidth (GB/s)"}, "rangemode": "tozero"},
        legend={"title": {"text": "op"}},
        meta=initial_meta({"kind": KIND, "op": op, "world_size": world_size}),
    )
    return update_bandwidth_figure(fig, points)


def update_bandwidth_figure(
    fig: FigureLike, points: Iterable[Point | CommEvent | Mapping[str, Any]]
) -> FigureLike:
    """Add NEW measurements to ``fig`` in place and refresh the median lines."""
    state = figure_state(fig, KIND)
    rows = _rows(points, state["op"], state["world_size"])
    if not rows:
        return fig
    patch = Patch(fig)
    fresh: dict[str, list[tuple[float, float]]] = {}
    for op, size, busbw, hover in rows:
        key = f"bandwidth/points/{op}"
        if not patch.has(key):
            patch.create(key, _markers(op))
            patch.create(f"bandwidth/median/{op}", _median_line(op))
        patch.add(key, x=size, y=busbw / GB, hovertext=hover)
        fresh.setdefault(op, []).append((size, busbw / GB))
    for op, new in fresh.items():
        key = f"bandwidth/points/{op}"
        old_x: Any = None
        old_y: Any = None
        if key in patch.index:
            trace = fig.data[patch.index[key]]
            old_x, old_y = trace.x, trace.y
        sizes = np.concatenate((as_float_array(old_x), [s for s, _ in new]))
        values = np.concatenate((as_float_array(old_y), [v for _, v in new]))
        xs = np.unique(sizes)
        medians = np.array([np.median(values[sizes == s]) for s in xs])
        patch.set(f"bandwidth/median/{op}", x=xs, y=medians)
    return patch.apply(fig)


def _rows(
    points: Iterable[Any], op: str | None, world_size: int | None
) -> list[tuple[str, float, float, str]]:
    """(op, bytes, busbw in B/s, hover) for each usable measurement."""
    rows = []
    pairs: list[tuple[Any, Any]] = []
    others: list[Any] = []
    for item in points:
        if isinstance(item, tuple | list) and len(item) == 2:
            pairs.append((item[0], item[1]))
        else:
            others.append(item)
    if pairs:
        if op is None or world_size is None:
            raise ConfigError(
                f"(bytes, seconds) points need op and world_size to compute bus bandwidth; "
                f"got op={op!r}, world_size={world_size!r}: pass bandwidth_figure(points, "
                f"op='all_reduce', world_size=N)"
            )
        factor = bus_factor(op, world_size)
        for size, seconds in pairs:
            if not isinstance(size, Real) or not isinstance(seconds, Real):
                raise ConfigError(
                    f"point ({size!r}, {seconds!r}) is not valid; give (bytes, seconds)"
                )
            if size <= 0 or seconds <= 0:
                raise ConfigError(
                    f"point ({size!r}, {seconds!r}) is not valid; bytes and seconds must be > 0"
                )
            algbw = float(size) / float(seconds)
            busbw = algbw * factor
            hover = _hover(op, size, seconds, algbw, busbw, world_size)
            rows.append((op, float(size), busbw, hover))
    for e in coerce_events(others):
        if not isinstance(e, CommEvent) or e.bytes <= 0 or (op is not None and e.op != op):
            continue
        hover = _hover(e.op, e.bytes, e.duration_s, e.algbw, e.busbw, e.group_size)
        rows.append((e.op, float(e.bytes), e.busbw, hover))
    return rows


def _hover(op: str, size: float, seconds: float, algbw: float, busbw: float, n: int) -> str:
    return (
        f"<b>{op}</b> · {format_bytes(size)} · {seconds * 1e3:.3f} ms · {n} ranks<br>"
        f"busbw {busbw / GB:.3f} GB/s · algbw {algbw / GB:.3f} GB/s"
    )


def _markers(op: str) -> go.Scatter:
    return go.Scatter(
        name=f"{op} (each run)",
        legendgroup=op,
        mode="markers",
        marker={"color": op_color(op), "size": 7, "opacity": 0.55},
        hoverinfo="text",
        meta={"op": op},
    )


def _median_line(op: str) -> go.Scatter:
    return go.Scatter(
        name=f"{op} (median)",
        legendgroup=op,
        mode="lines+markers",
        line={"color": op_color(op), "width": 2},
        hovertemplate=f"{op} median: %{{y:.3f}} GB/s at %{{x:.4s}}B<extra></extra>",
        meta={"op": op},
    )
