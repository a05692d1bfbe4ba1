"""Loss (or any scalar metric) per step, one line per rank, with a reference curve.

The reference is typically the single-device run of the same model and data: a data- or
tensor-parallel run that is correct lies on top of it. Ranks whose curves are identical (every
step, every value: DDP reports the same loss everywhere) share one legend entry, "ranks 0–1
identical", since the line drawn last hides the others.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import plotly.graph_objects as go

from workbench.errors import ConfigError
from workbench.plots.event_input import as_float_array, coerce_events, validate_ranks
from workbench.plots.figure_patch import FigureLike, Patch, figure_state, initial_meta
from workbench.trace.events import Event, Metric

__all__ = ["RANK_COLORS", "loss_figure", "rank_span", "update_loss_figure"]

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
        # Steps are whole numbers: ticks at whole steps only (``_step_ticks``); plotly's own
        # choice puts ticks at 0.5, which "d" then prints as a second "0" or "1".
        xaxis={
            "title": {"text": "step"},
            "tickformat": "d",
            "rangemode": "tozero",
            **_step_ticks(0),
        },
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
        fig.update_layout(xaxis=_step_ticks(len(values) - 1))
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
                    marker={"size": 5, "color": color},
                    meta={"rank": m.rank},
                ),
            )
        patch.add(key, x=m.step, y=m.value)
    curves = _curves(fig, patch)
    _name_identical(curves, patch)
    last = max((float(x.max()) for x, _ in curves.values() if x.size), default=0.0)
    reference = fig.data[patch.index["loss/reference"]] if patch.has("loss/reference") else None
    if reference is not None:
        last = max(last, len(reference.x) - 1)
    for prop, value in _step_ticks(int(last)).items():
        patch.assign[f"xaxis.{prop}"] = value
    return patch.apply(fig)


def _step_ticks(last: int) -> dict[str, Any]:
    """A whole-number tick spacing (1, 2, 5, 10, 20, ...) giving at most 10 ticks to ``last``."""
    dtick = 1
    while last / dtick > 10:
        dtick = int(dtick * (2.5 if str(dtick)[0] == "2" else 2))  # 1, 2, 5, 10, 20, 50
    return {"tick0": 0, "dtick": dtick}


def rank_span(ranks: Sequence[int]) -> str:
    """``[0, 1, 2]`` -> ``"0–2"``, ``[0, 1, 3]`` -> ``"0–1, 3"`` (sorted, runs by a dash)."""
    runs: list[list[int]] = []
    for rank in sorted(ranks):
        if runs and rank == runs[-1][-1] + 1:
            runs[-1].append(rank)
        else:
            runs.append([rank])
    return ", ".join(f"{r[0]}–{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)


def _curves(fig: FigureLike, patch: Patch) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Every rank's (steps, values) as they will be once ``patch`` is applied."""
    out = {}
    for key in sorted({*patch.index, *patch.new}):
        if not key.startswith("loss/rank/"):
            continue
        old = fig.data[patch.index[key]] if key in patch.index else None
        new = patch.points.get(key, {})

        x, y = (
            np.concatenate(
                (
                    as_float_array(old[prop] if old is not None else None),
                    np.asarray(new.get(prop, []), dtype=float),
                )
            )
            for prop in ("x", "y")
        )
        out[int(key.rsplit("/", 1)[1])] = (x, y)
    return out


def _name_identical(curves: dict[int, tuple[np.ndarray, np.ndarray]], patch: Patch) -> None:
    """One legend entry and one hover line for each set of ranks with identical curves;
    every rank of a set stays drawn (a legend click hides or shows them together)."""
    groups: list[list[int]] = []
    for rank, (x, y) in sorted(curves.items()):
        for group in groups:
            gx, gy = curves[group[0]]
            if np.array_equal(x, gx) and np.array_equal(y, gy):
                group.append(rank)
                break
        else:
            groups.append([rank])
    for group in groups:
        label = f"rank {group[0]}" if len(group) == 1 else f"ranks {rank_span(group)}"
        # The line drawn on top is the group's last rank: in the leader's color it matches
        # the legend's swatch (each rank gets its own color back once the curves part).
        color = RANK_COLORS[group[0] % len(RANK_COLORS)]
        for rank in group:
            leader = rank == group[0]
            patch.set(
                f"loss/rank/{rank}",
                name=f"{label} identical" if leader and len(group) > 1 else f"rank {rank}",
                legendgroup=label,
                showlegend=leader,
                hoverinfo="all" if leader else "skip",
                hovertemplate=f"{label}: %{{y:.6g}}<extra></extra>",
                line={"color": color, "width": 2},
                marker={"size": 5, "color": color},
            )
