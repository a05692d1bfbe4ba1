"""Planner figures: per-GPU memory breakdown, scaling curves, memory against model size.

Pure functions from planner results to ``go.Figure``; the planner widget wraps them in a
``FigureWidget`` and updates the same traces in place. Colors match the measured memory
figure (weights = params, temporary = other) so a plan and a run read side by side.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import plotly.graph_objects as go

from workbench.planner import (
    HardwareSpec,
    ModelSpec,
    ParallelSpec,
    Plan,
    ScalingPoint,
    TrainingSpec,
    evaluate,
)
from workbench.plots.style import CATEGORY_COLORS

__all__ = [
    "MEMORY_PARTS",
    "memory_breakdown_figure",
    "memory_parts_gb",
    "memory_vs_model_size_figure",
    "scaling_figure",
]

_GB = 1e9

# (attribute of MemoryBreakdown, legend label, color from the shared palette)
MEMORY_PARTS: tuple[tuple[str, str, str], ...] = (
    ("weights", "weights", CATEGORY_COLORS["params"]),
    ("grads", "gradients", CATEGORY_COLORS["grads"]),
    ("optimizer", "optimizer state", CATEGORY_COLORS["optimizer"]),
    ("activations", "activations", CATEGORY_COLORS["activations"]),
    ("temporary", "temporary buffers", CATEGORY_COLORS["other"]),
)


def memory_parts_gb(plan: Plan) -> dict[str, float]:
    """GB per GPU by category, in stacking order."""
    return {attr: getattr(plan.memory, attr) / _GB for attr, _, _ in MEMORY_PARTS}


def memory_breakdown_figure(
    plans: Plan | Sequence[Plan],
    labels: Sequence[str] | None = None,
    *,
    title: str | None = None,
) -> go.Figure:
    """Stacked bars of per-GPU memory, one bar per plan, with each card's usable memory."""
    items = [plans] if isinstance(plans, Plan) else list(plans)
    names = list(labels) if labels is not None else [p.layout() for p in items]
    fig = go.Figure()
    for attr, label, color in MEMORY_PARTS:
        fig.add_trace(
            go.Bar(
                name=label,
                x=names,
                y=[getattr(p.memory, attr) / _GB for p in items],
                marker_color=color,
                hovertemplate=f"{label}: %{{y:.2f}} GB<extra></extra>",
            )
        )
    fig.add_trace(
        go.Scatter(
            name="usable memory",
            x=names,
            y=[p.memory.capacity / _GB for p in items],
            mode="markers+lines",
            line={"dash": "dash", "color": "#D62728"},
            marker={"symbol": "line-ew-open", "size": 28, "color": "#D62728"},
            hovertemplate="usable: %{y:.1f} GB<extra></extra>",
        )
    )
    verdicts = ", ".join("fits" if p.fits else "OOM" for p in items)
    fig.update_layout(
        barmode="stack",
        title=title or f"Per-GPU memory ({verdicts})",
        yaxis_title="GB per GPU",
        legend={"traceorder": "normal"},
        margin={"t": 50, "b": 40, "l": 60, "r": 20},
    )
    return fig


def scaling_figure(
    points: Sequence[ScalingPoint] | Mapping[str, Sequence[ScalingPoint]],
    *,
    title: str = "Scaling",
) -> go.Figure:
    """Throughput (left axis, with the linear ideal) and scaling efficiency (right axis)
    against GPU count; ``x`` marks GPU counts where the layout runs out of memory."""
    series = dict(points) if isinstance(points, Mapping) else {"": list(points)}
    fig = go.Figure()
    for name, pts in series.items():
        for trace in _scaling_traces(name, list(pts)):
            fig.add_trace(trace)
    gpus = sorted({p.gpus for pts in series.values() for p in pts})
    fig.update_layout(
        title=title,
        xaxis={"title": "GPUs", "type": "log", **_gpu_ticks(gpus)},
        yaxis={"title": "tokens/s"},
        yaxis2={
            "title": "scaling efficiency",
            "overlaying": "y",
            "side": "right",
            "range": [0, 1.05],
            # whole quarters: plotly's own ticks on [0, 1.05] fell at 7/32/57/82 %
            "tickmode": "array",
            "tickvals": [0, 0.25, 0.5, 0.75, 1],
            "tickformat": ".0%",
            "showgrid": False,
        },
        # under the plot: at the right it covered the efficiency axis' title and ticks
        legend={"orientation": "h", "yref": "container", "y": 0, "yanchor": "bottom", "x": 0},
        margin={"t": 50, "b": 110, "l": 70, "r": 70},
    )
    return fig


def _gpu_ticks(gpus: list[int]) -> dict[str, Any]:
    """GPU counts as whole numbers at powers of two (8, 64, 512 when the range is wide):
    plotly's log ticks print minor digits, so 512 read as "5"."""
    if not gpus or min(gpus) < 1:
        return {}
    low, high = math.floor(math.log2(min(gpus))), math.ceil(math.log2(max(gpus)))
    powers = [2**e for e in range(low, high + 1)]
    every = max(1, math.ceil(len(powers) / 4))
    if every > 1:  # powers of 2**every from the top down, so the largest count is named
        powers = powers[::-1][::every][::-1]
    return {"tickmode": "array", "tickvals": powers, "ticktext": [str(v) for v in powers]}


def _scaling_traces(name: str, pts: list[ScalingPoint]) -> list[go.Scatter]:
    """One series: tokens/s, the linear ideal from its first point, and efficiency."""
    if not pts:
        return []
    gpus = [p.gpus for p in pts]
    prefix = f"{name} " if name else ""
    ideal = pts[0].tokens_per_s / pts[0].gpus
    return [
        go.Scatter(
            name=f"{prefix}tokens/s",
            x=gpus,
            y=[p.tokens_per_s for p in pts],
            mode="lines+markers",
            marker={"symbol": ["circle" if p.fits else "x" for p in pts], "size": 9},
            customdata=[[p.nodes, p.step_s] for p in pts],
            hovertemplate="%{x} GPUs (%{customdata[0]} nodes): %{y:,.0f} tokens/s, "
            "step %{customdata[1]:.3g} s<extra></extra>",
        ),
        go.Scatter(
            name=f"{prefix}linear",
            x=gpus,
            y=[ideal * g for g in gpus],
            mode="lines",
            line={"dash": "dot", "color": "#9D9D9D"},
            hoverinfo="skip",
        ),
        go.Scatter(
            name=f"{prefix}efficiency",
            x=gpus,
            y=[p.efficiency for p in pts],
            mode="lines+markers",
            yaxis="y2",
            line={"dash": "dash"},
            hovertemplate="%{x} GPUs: %{y:.0%} of linear<extra></extra>",
        ),
    ]


def memory_vs_model_size_figure(
    sizes: Sequence[float],
    hardware: HardwareSpec,
    training: TrainingSpec | None = None,
    layouts: Mapping[str, ParallelSpec] | None = None,
    *,
    seq: int = 2048,
) -> go.Figure:
    """Per-GPU memory against parameter count for several layouts, with the card's limit:
    where each line crosses the limit is the largest model that layout trains."""
    train = training or TrainingSpec(seq=seq)
    chosen = layouts or {
        "1 GPU": ParallelSpec(),
        "DP 8": ParallelSpec(dp=8),
        "ZeRO-3 x8": ParallelSpec(dp=8, zero=3),
    }
    fig = go.Figure()
    xs = [float(s) for s in sizes]
    for name, layout in chosen.items():
        ys = []
        for n in xs:
            model = ModelSpec(name=f"{n / 1e9:g}B", params=round(n), vocab=32000, seq=seq)
            ys.append(evaluate(model, train, layout, hardware).memory.total / _GB)
        fig.add_trace(
            go.Scatter(
                name=name,
                x=[n / 1e9 for n in xs],
                y=ys,
                mode="lines+markers",
                hovertemplate=f"{name}: %{{x:.3g}}B params -> %{{y:.1f}} GB<extra></extra>",
            )
        )
    fig.add_hline(
        y=hardware.usable / _GB,
        line_dash="dash",
        line_color="#D62728",
        annotation_text=f"{hardware.name} usable",
    )
    fig.update_layout(
        title=f"Per-GPU memory vs model size on {hardware.name}",
        xaxis={"title": "parameters (billions)", "type": "log"},
        yaxis={"title": "GB per GPU", "type": "log"},
        margin={"t": 50, "b": 40, "l": 60, "r": 20},
    )
    return fig
