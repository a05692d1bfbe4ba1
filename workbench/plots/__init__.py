"""Plotly figures of trace events: memory, timeline, loss, bandwidth.

Pure functions from events (objects or ``to_record`` dicts) to ``go.Figure``, plus
``update_*`` functions that grow an existing figure (or a ``FigureWidget`` made from it) in
place with NEW events only. Never imports IPython or ipywidgets.
"""

from workbench.plots.bandwidth import bandwidth_figure, update_bandwidth_figure
from workbench.plots.engines import engine_memory_figure
from workbench.plots.loss import loss_figure, update_loss_figure
from workbench.plots.memory import memory_figure, update_memory_figure
from workbench.plots.planner import (
    memory_breakdown_figure,
    memory_vs_model_size_figure,
    scaling_figure,
)
from workbench.plots.style import (
    CATEGORIES,
    CATEGORY_COLORS,
    OP_COLORS,
    PHASE_COLORS,
    base_phase,
    format_bytes,
    op_color,
    phase_color,
)
from workbench.plots.synthetic import synthetic_events
from workbench.plots.timeline import comm_timeline_figure, update_comm_timeline
from workbench.plots.update import extend_figure

__all__ = [
    "CATEGORIES",
    "CATEGORY_COLORS",
    "OP_COLORS",
    "PHASE_COLORS",
    "bandwidth_figure",
    "base_phase",
    "comm_timeline_figure",
    "engine_memory_figure",
    "extend_figure",
    "format_bytes",
    "loss_figure",
    "memory_breakdown_figure",
    "memory_figure",
    "memory_vs_model_size_figure",
    "op_color",
    "phase_color",
    "scaling_figure",
    "synthetic_events",
    "update_bandwidth_figure",
    "update_comm_timeline",
    "update_loss_figure",
    "update_memory_figure",
]
