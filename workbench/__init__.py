"""workbench: a JupyterLab workbench for distributed PyTorch training.

``%load_ext workbench`` registers the ``%wb`` magics; everything they do is also a plain
Python API here. Heavy modules load lazily so ``import workbench`` stays cheap and the core
layers (trace, planner, parallel) never pull in the notebook stack.
"""

from __future__ import annotations

import sys
import types
from typing import Any

from workbench.errors import (
    CheckpointError,
    ClusterError,
    CollectiveTimeout,
    ConfigError,
    EngineDied,
    ParallelError,
    RankError,
    WorkbenchError,
)
from workbench.lazy import lazy_getattr

__version__ = "0.1.0"

# name -> module that defines it; resolved on first attribute access.
_LAZY: dict[str, str] = {
    "Cluster": "workbench.cluster",
    "compare": "workbench.compare",
    "export": "workbench.export",
    "fault_cost": "workbench.planner",
    "fault_times": "workbench.session.fault_times",
    "Stepper": "workbench.ui.stepper",
    "Dashboard": "workbench.ui.dashboard",
    "PlannerWidget": "workbench.ui.planner",
    "plan": "workbench.planner",
    "plan_from": "workbench.parallel.planning.plan_from",
    "traced": "workbench.engine.traced",
}

__all__ = [
    "CheckpointError",
    "Cluster",
    "ClusterError",
    "CollectiveTimeout",
    "ConfigError",
    "Dashboard",
    "EngineDied",
    "ParallelError",
    "PlannerWidget",
    "RankError",
    "Stepper",
    "WorkbenchError",
    "__version__",
    "compare",
    "export",
    "fault_cost",
    "fault_times",
    "load_ipython_extension",
    "plan",
    "plan_from",
    "traced",
]


_lazy = lazy_getattr(__name__, _LAZY, globals())


def __getattr__(name: str) -> Any:
    if name == "trace":  # the subpackage, torch-free until used: wb.trace.schedule(...)
        import importlib

        return importlib.import_module("workbench.trace")
    return _lazy(name)


class _Package(types.ModuleType):
    """``workbench.export`` and ``workbench.compare`` are functions of modules of the same
    name: importing the module (the CLI, ``%wb export``) would set the package's attribute
    to the module, and a later ``wb.export(...)`` would call a module. The function stays."""

    def __setattr__(self, name: str, value: Any) -> None:
        module = isinstance(value, types.ModuleType) and value.__name__ == _LAZY.get(name)
        if module and value.__name__.rpartition(".")[2] == name:
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext workbench``: register the ``%wb`` line and cell magics."""
    import time

    started = time.perf_counter()
    from workbench.magics import load_ipython_extension as _load

    _load(ipython, import_s=time.perf_counter() - started)


def unload_ipython_extension(ipython: Any) -> None:
    from workbench.magics import unload_ipython_extension as _unload

    _unload(ipython)
