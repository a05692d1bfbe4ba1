"""The planner's fault-cost curve: seconds lost per hour against the checkpoint interval.

One line per cause (saving checkpoints, work redone after a failure, detection and
recovery) and their total; a dotted line at Young / Daly's interval, where the total's
minimum should sit (``planner/fault_cost.py``).
"""

from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go

from workbench.planner.fault_cost import FaultCost

__all__ = ["fault_cost_figure"]

_PARTS = (
    ("saving_s", "saving checkpoints", "#1f77b4"),
    ("redone_s", "work redone after a failure", "#ff7f0e"),
    ("downtime_s", "detection + recovery", "#2ca02c"),
    ("total_s", "total", "#222222"),
)


def fault_cost_figure(
    costs: Sequence[FaultCost],
    *,
    young_daly_s: float | None = None,
    title: str = "What failures cost, per hour of training",
) -> go.Figure:
    """Seconds lost per hour for each checkpoint interval in ``costs`` (as many as given,
    in the order given: the x axis is the interval in steps)."""
    if not costs:
        raise ValueError("costs is empty: give fault_cost() results for at least one interval")
    fig = go.Figure()
    steps = [c.checkpoint_every for c in costs]
    for attr, label, color in _PARTS:
        fig.add_trace(
            go.Scatter(
                x=steps,
                y=[getattr(c, attr) for c in costs],
                name=label,
                mode="lines",
                line={"color": color, "width": 3 if attr == "total_s" else 1.5},
            )
        )
    if young_daly_s is not None:
        step_s = costs[0].interval_s / costs[0].checkpoint_every
        fig.add_vline(
            x=young_daly_s / step_s,
            line={"dash": "dot", "color": "#888888"},
            annotation_text="Young / Daly",
        )
    fig.update_layout(
        title=title,
        xaxis={"title": "checkpoint every N steps", "type": "log"},
        yaxis={"title": "seconds lost per hour"},
        margin={"t": 50, "b": 40, "l": 70, "r": 20},
    )
    return fig
