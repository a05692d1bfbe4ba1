"""``%wb trace on|off|pull|plot|export``: trace hand-written loops in ``%%wb`` cells.

``on`` makes every following ``%%wb`` cell one traced span with its collectives recorded;
``wb.traced(model, optimizer)`` inside a cell adds memory by category and phases. The
kernel pulls the events by cursor after each traced cell (and on ``pull``/``plot``/
``export``), so the same figures and Perfetto file as the stepper's are drawn from them.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from IPython.core.error import UsageError

if TYPE_CHECKING:  # the magics object is only a parameter here
    from workbench.magics.registry import MagicsState


__all__ = ["TRACE_ACTIONS", "run_trace", "trace_log"]

TRACE_ACTIONS = ("export", "on", "off", "pull", "plot")
PLOTS = ("memory", "comm", "loss")


def trace_log(magics: MagicsState) -> Any:
    """The notebook's ``TraceLog`` for the running cluster (made on first use)."""
    return magics.current_trace_log()


def run_trace(magics: MagicsState, action: str, path: str | None) -> Any:
    """Everything but ``export`` of the current stepper (which step_cmds handles)."""
    log = trace_log(magics)
    if action == "on":
        log.cells = True
        print("workbench: tracing every %%wb cell (collectives; memory inside wb.traced)")
        return None
    if action == "off":
        log.cells = False
        print("workbench: cell tracing off")
        return None
    new = log.pull()
    if action == "pull":
        lost = ", ".join(f"rank {r}: {n}" for r, n in sorted(log.overflow.items()) if n)
        capped = f"; detail let go at the engines' cap ({lost}), summaries kept" if lost else ""
        print(f"workbench: {len(new)} new trace events ({len(log.events)} in all){capped}")
        return None
    if action == "plot":
        if path not in PLOTS:
            raise UsageError(f"%wb trace plot WHAT: choose one of {', '.join(PLOTS)}")
        from workbench.plots import comm_timeline_figure, loss_figure, memory_figure

        ranks = list(range(log.cluster.world_size))
        if path == "memory":
            return memory_figure(log.events, ranks=ranks)
        if path == "comm":
            return comm_timeline_figure(log.events, ranks=ranks)
        return loss_figure(log.events)
    if not path:
        raise UsageError("%wb trace export PATH: give the output file (.json)")
    out = log.export(Path(path))
    print(f"workbench: wrote {len(log.events)} traced events to {out}")
    return None
