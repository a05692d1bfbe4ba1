"""Figures of a whole run from its per-step summaries: flat cost at any length.

Each curve is bucketed into at most ``buckets`` points (``trace.summary.envelope``): the
line is the bucket's mean (memory: its max) and a shaded band spans the bucket's min to max,
as W&B and plotly-resampler draw long series, so a spike inside a bucket stays visible. A
run no longer than ``buckets`` steps is drawn point for point. The detail of recorded steps
is what ``Stepper.figures(steps=(a, b))`` draws.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import plotly.graph_objects as go

from workbench.plots.loss import RANK_COLORS
from workbench.plots.style import CATEGORIES, MIB, category_color, format_bytes, op_color
from workbench.trace.summary import StepSummaries, envelope

__all__ = ["BUCKETS", "summary_figures"]

BUCKETS = 1000
# plotly_white's look without its template: validating the template (a deep copy of it)
# took half of each figure's build, and these are rebuilt at every live refresh.
_WHITE: dict[str, Any] = {
    "template": go.layout.Template(),
    "paper_bgcolor": "white",
    "plot_bgcolor": "white",
    "font": {"color": "#2a3f5f"},
}
_GRID = {"gridcolor": "#EBF0F8", "zerolinecolor": "#EBF0F8", "linecolor": "#EBF0F8"}


def _band(
    traces: list[go.Scatter], x: Any, lo: Any, hi: Any, color: str, group: str, **axes: Any
) -> None:
    """A shaded min-max band (two traces: the upper edge, then the lower filled to it)."""
    for y, fill in ((hi, None), (lo, "tonexty")):
        traces.append(
            go.Scatter(
                x=x,
                y=y,
                mode="lines",
                line={"width": 0, "color": color},
                fill=fill,
                opacity=0.25,
                fillcolor=color,
                hoverinfo="skip",
                showlegend=False,
                legendgroup=group,
                **axes,
            )
        )


def _note(steps: int, buckets: int) -> str:
    if steps <= buckets:
        return f"{steps} steps, every step"
    return f"{steps} steps in {buckets} buckets of {-(-steps // buckets)}: line mean, band min–max"


def loss_summary_figure(
    summaries: StepSummaries, *, reference: Sequence[float] | None = None, buckets: int = BUCKETS
) -> go.Figure:
    traces: list[go.Scatter] = []
    for rank in summaries.ranks:
        steps, values = summaries.column(rank, "metric:loss")
        env = envelope(steps, values, buckets)
        color = RANK_COLORS[rank % len(RANK_COLORS)]
        _band(traces, env["x"], env["min"], env["max"], color, f"rank {rank}")
        traces.append(
            go.Scatter(
                x=env["x"],
                y=env["mean"],
                name=f"rank {rank}",
                legendgroup=f"rank {rank}",
                mode="lines",
                line={"color": color, "width": 2},
                hovertemplate=f"rank {rank} · step %{{x:.0f}}: %{{y:.6g}}<extra></extra>",
            )
        )
    if reference is not None and len(reference):
        ref = np.asarray(list(reference), dtype=float)
        env = envelope(np.arange(len(ref)), ref, buckets)
        traces.append(
            go.Scatter(
                x=env["x"],
                y=env["mean"],
                name="single device",
                mode="lines",
                line={"color": "#222222", "dash": "dash", "width": 2},
            )
        )
    # One constructor call: plotly validates (and copies the template) once per figure.
    return go.Figure(
        data=traces,
        layout=dict(
            title=f"Loss per step ({_note(summaries.steps, buckets)})",
            **_WHITE,
            xaxis={"title": {"text": "step"}, "rangemode": "tozero", **_GRID},
            yaxis={"title": {"text": "loss"}, **_GRID},
            meta={"kind": "loss-summary"},
        ),
    )


def memory_summary_figure(
    summaries: StepSummaries,
    *,
    capacity: int | None = None,
    ranks: Iterable[int] | None = None,
    buckets: int = BUCKETS,
) -> go.Figure:
    """Peak bytes per category per step, stacked, one panel per rank (the bucket's max)."""
    shown = sorted(ranks) if ranks is not None else summaries.ranks
    shown = [r for r in shown if r in summaries.ranks] or shown
    traces: list[go.Scatter] = []
    n = max(len(shown), 1)
    layout: dict[str, Any] = {"shapes": []}
    gap = 0.08
    height = (1 - gap * (n - 1)) / n
    for row, rank in enumerate(shown):
        suffix = "" if row == 0 else str(row + 1)
        axes = {"xaxis": f"x{suffix}", "yaxis": f"y{suffix}"}
        for category in CATEGORIES:
            steps, values = summaries.column(rank, f"peak:{category}")
            if not np.nansum(values):
                continue
            env = envelope(steps, values, buckets)
            color = category_color(category)
            traces.append(
                go.Scatter(
                    x=env["x"],
                    y=env["max"] / MIB,
                    name=category,
                    legendgroup=category,
                    showlegend=row == 0,
                    mode="lines",
                    stackgroup=f"rank{rank}",
                    line={"width": 0.5, "color": color},
                    fillcolor=color,
                    hovertemplate=f"rank {rank} · step %{{x:.0f}} · {category}: "
                    "%{y:.1f} MiB<extra></extra>",
                    **axes,
                )
            )
        steps, total = summaries.column(rank, "peak:total")
        if len(total) and np.isfinite(total).any():
            i = int(np.nanargmax(total))
            traces.append(
                go.Scatter(
                    x=[float(steps[i])],
                    y=[float(total[i]) / MIB],
                    name="peak",
                    legendgroup="peak",
                    showlegend=row == 0,
                    mode="markers+text",
                    text=[f"peak {format_bytes(int(total[i]))} (step {int(steps[i])})"],
                    textposition="top center",
                    marker={"symbol": "triangle-down", "size": 10, "color": "#222222"},
                    cliponaxis=False,
                    **axes,
                )
            )
        top = 1 - row * (height + gap)
        layout.update(
            {
                f"xaxis{suffix}": {
                    **_GRID,
                    "anchor": f"y{suffix}",
                    "matches": None if row == 0 else "x",
                    "title": {"text": "step" if row == n - 1 else ""},
                },
                f"yaxis{suffix}": {
                    **_GRID,
                    "anchor": f"x{suffix}",
                    "domain": [max(top - height, 0), top],
                    "title": {"text": f"rank {rank}<br>MiB"},
                    "rangemode": "tozero",
                },
            }
        )
        if capacity is not None:
            layout["shapes"].append(
                {
                    "type": "line",
                    "xref": f"x{suffix} domain",
                    "x0": 0,
                    "x1": 1,
                    "yref": f"y{suffix}",
                    "y0": capacity / MIB,
                    "y1": capacity / MIB,
                    "line": {"color": "#D62728", "dash": "dash", "width": 2},
                }
            )
    layout.update(
        title=f"Peak memory per step by category ({_note(summaries.steps, buckets)})",
        **_WHITE,
        height=160 + 240 * n,
        meta={"kind": "memory-summary"},
    )
    return go.Figure(data=traces, layout=layout)


def timing_summary_figure(
    summaries: StepSummaries, *, ranks: Iterable[int] | None = None, buckets: int = BUCKETS
) -> go.Figure:
    """Step time and seconds in each collective op per step, per rank."""
    traces: list[go.Scatter] = []
    for rank in sorted(ranks) if ranks is not None else summaries.ranks:
        series = [("step time", "step_s", RANK_COLORS[rank % len(RANK_COLORS)], "solid")]
        series += [(op, f"comm_s:{op}", op_color(op), "dot") for op in summaries.ops(rank)]
        for label, column, color, dash in series:
            steps, values = summaries.column(rank, column)
            if not len(values) or not np.isfinite(values).any():
                continue
            env = envelope(steps, values * 1e3, buckets)
            name = f"rank {rank} {label}"
            _band(traces, env["x"], env["min"], env["max"], color, name)
            traces.append(
                go.Scatter(
                    x=env["x"],
                    y=env["mean"],
                    name=name,
                    legendgroup=name,
                    mode="lines",
                    line={"color": color, "width": 1.5, "dash": dash},
                    hovertemplate=f"{name} · step %{{x:.0f}}: %{{y:.3g}} ms<extra></extra>",
                )
            )
    return go.Figure(
        data=traces,
        layout=dict(
            title=f"Step time and collectives per step ({_note(summaries.steps, buckets)})",
            **_WHITE,
            xaxis={"title": {"text": "step"}, "rangemode": "tozero", **_GRID},
            yaxis={"title": {"text": "ms per step"}, "rangemode": "tozero", **_GRID},
            meta={"kind": "timing-summary"},
        ),
    )


def summary_figures(
    summaries: StepSummaries,
    *,
    capacity: int | None = None,
    ranks: Iterable[int] | None = None,
    reference: Sequence[float] | None = None,
    buckets: int = BUCKETS,
) -> dict[str, go.Figure]:
    """The stepper's three figures (``memory``, ``comm``, ``loss``) from summaries."""
    wanted = None if ranks is None else list(ranks)
    return {
        "memory": memory_summary_figure(
            summaries, capacity=capacity, ranks=wanted, buckets=buckets
        ),
        "comm": timing_summary_figure(summaries, ranks=wanted, buckets=buckets),
        "loss": loss_summary_figure(summaries, reference=reference, buckets=buckets),
    }
