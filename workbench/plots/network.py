"""The cluster doctor's link matrix: one cell per measured pair of ranks, slow ones marked."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import plotly.graph_objects as go

__all__ = ["link_heatmap", "network_figure"]


def network_figure(report: Any) -> go.Figure:
    """The heatmap of a ``cluster.doctor("net")`` report: one-way GB/s per pair."""
    return link_heatmap(
        report.world_size,
        [(p.a, p.b, p.one_way / 1e9) for p in report.pairs],
        flagged=[(p.a, p.b) for p in report.slow],
    )


def link_heatmap(
    world_size: int,
    pairs: Sequence[tuple[int, int, float]],
    *,
    flagged: Sequence[tuple[int, int]] = (),
    unit: str = "GB/s",
    title: str = "one-way bandwidth per pair of ranks",
) -> go.Figure:
    """A symmetric rank x rank heatmap of ``(a, b, value)``; pairs not measured stay empty
    and ``flagged`` pairs (slow links) carry an ``x`` in their cell."""
    z: list[list[float | None]] = [[None] * world_size for _ in range(world_size)]
    text = [[""] * world_size for _ in range(world_size)]
    slow = {tuple(sorted(p)) for p in flagged}
    for a, b, value in pairs:
        mark = " x" if tuple(sorted((a, b))) in slow else ""
        for i, j in ((a, b), (b, a)):
            z[i][j] = value
            text[i][j] = f"{value:.3g}{mark}"
    ranks = [str(r) for r in range(world_size)]
    fig = go.Figure(
        go.Heatmap(
            z=z,
            x=ranks,
            y=ranks,
            text=text,
            texttemplate="%{text}",
            colorscale="Viridis",
            colorbar={"title": unit},
            hovertemplate="ranks %{y}-%{x}: %{z:.3g} " + unit + "<extra></extra>",
        )
    )
    fig.update_layout(
        title=title,
        xaxis={"title": "rank", "type": "category"},
        yaxis={"title": "rank", "type": "category", "autorange": "reversed"},
        width=420 + 20 * world_size,
        height=380 + 20 * world_size,
    )
    return fig
