"""Loss (or any scalar metric) per step, one line per rank, with a reference curve.

The reference is typically the single-device run of the same model and data: a data- or
tensor-parallel run that is correct lies on top of it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import plotly.graph_objects as go

from workbench.errors import ConfigError
from workbench.plots.event_input import coerce_events, validate_ranks
from workbench.plots.figure_patch import FigureLike, Patch, figure_state, initial_meta
from workbench.trace.events import Event, Metric

__all__ = ["RANK_COLORS", "loss_figure", "update_loss_figure"]

KIND = "loss"
RANK_COLORS = ("#4C78A8", "#F58518", "#54A24B", "#E45756", "#72B7B2", "#B279A2", "#FF9DA6")


def loss_figure(
    events: Iterable[Event | Mapping[str, Any]] = (),
    *,
    reference: Sequence[float] | None = None,
    ranks: Iterable[int] | None = None,
    name: str = "loss",
) -> go.Figure:
    """Metric ``name`` per step for each rank (``ranks=[0]`` for rank 0 only).

    ``reference[i]`` is the reference value at step ``i`` (steps count from 0), drawn dashed.
    """
    wanted = validate_ranks(ranks)
    if not isinstance(name, str) or not name:
        raise ConfigError(f"name={name!r} is not valid; give the metric name, e.g. 'loss'")
    fig = go.Figure()
    fig.update_layout(
        title=f"{name.capitalize()} per step",
        template="plotly_white",
        hovermode="x unified",
        # Steps are whole numbers; never let plotly put ticks at 0.5.
        xaxis={"title": {"text": "step"}, "tickformat": "d", "rangemode": "tozero"},
        yaxis={"title": {"text": name}},
        legend={"title": {"text": "run"}},
        meta=initial_meta({"kind": KIND, "name": name, "ranks": wanted}),
    )
    if reference is not None:
        values = np.asarray(list(reference), dtype=float)
        if values.ndim != 1:
            raise ConfigError("reference must be a flat list of floats, one per step")
        fig.add_trace(
            go.Scatter(
                name="single device",
                x=np.arange(len(values), dtype=float),
                y=values,
                mode="lines",
                line={"color": "#222222", "dash": "dash", "width": 2},
                hovertemplate="single device: %{y:.6g}<extra></extra>",
                meta={"key": "loss/reference"},
            )
        )
    return update_loss_figure(fig, events)


def update_loss_figure(fig: FigureLike, events: Iterable[Event | Mapping[str, Any]]) -> FigureLike:
    """Append NEW metric values to ``fig`` in place (one batch); returns ``fig``."""
    state = figure_state(fig, KIND)
    wanted = state["ranks"]
    metrics = [
        e
        for e in coerce_events(events)
        if isinstance(e, Metric)
        and e.name == state["name"]
        and (wanted is None or e.rank in wanted)
    ]
    if not metrics:
        return fig
    patch = Patch(fig)
    for m in metrics:
        key = f"loss/rank/{m.rank}"
        if not patch.has(key):
            color = RANK_COLORS[m.rank % len(RANK_COLORS)]
            patch.create(
                key,
                go.Scatter(
                    name=f"rank {m.rank}",
                    mode="lines+markers",
                    line={"color": color, "width": 2},
                    marker={"size": 5},
                    hovertemplate=f"rank {m.rank}: %{{y:.6g}}<extra></extra>",
                    meta={"rank": m.rank},
                ),
            )
        patch.add(key, x=m.step, y=m.value)
    return patch.apply(fig)
