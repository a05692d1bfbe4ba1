"""The dashboard's figure: memory of every engine process, grouped by rank.

Input is what the engine probe returns per rank (``{"rss": bytes, "cuda_allocated": bytes,
...}``); the CUDA series appears only when some rank has device memory allocated.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import plotly.graph_objects as go

from workbench.plots.style import MIB

__all__ = ["engine_memory_figure"]

_SERIES = {"process RSS": "rss", "CUDA allocated": "cuda_allocated"}


def engine_memory_figure(memory: Mapping[int, Mapping[str, Any]]) -> go.Figure:
    """Grouped bars, MiB per rank: process RSS and (with CUDA) allocated device memory."""
    fig = go.Figure(
        layout={
            "title": "Engine memory per rank",
            "template": "plotly_white",
            "barmode": "group",
            "height": 280,
            "xaxis": {"title": {"text": "rank"}, "dtick": 1},
            "yaxis": {"title": {"text": "MiB"}},
        }
    )
    ranks = sorted(memory)
    for name, key in _SERIES.items():
        values = [memory[r].get(key, 0) / MIB for r in ranks]
        if key != "rss" and not any(values):
            continue
        fig.add_bar(x=ranks, y=values, name=name)
    return fig
