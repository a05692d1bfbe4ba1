"""ipywidgets views over plain state objects (stepper, planner, dashboard).

Imported lazily by ``workbench.Stepper`` / ``workbench.PlannerWidget`` /
``workbench.Dashboard``; nothing below ``ui/`` imports ipywidgets.
"""

__all__: list[str] = []
