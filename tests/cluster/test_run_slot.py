"""The engine's run slot (engine/run_slot.py): one set-up for a built-in and a user run.

Run on real engines: the cell tracer, the status thread and the run live in an engine's
process, and a run's set-up must leave them as they were when the build fails.
"""

from __future__ import annotations

from typing import Any

import pytest

from workbench.cluster import Cluster
from workbench.parallel import RunSpec

pytestmark = pytest.mark.engines


def _failed_traced_build() -> tuple[bool, bool, bool]:
    """(cell tracer on before, on after a traced build raised, a run left installed)."""
    from workbench.engine import run_slot
    from workbench.engine.state import engine_state

    def build(recorder: Any) -> Any:
        raise RuntimeError("injected build failure")

    before = engine_state().cell_tracer is not None
    with pytest.raises(RuntimeError, match="injected"):
        run_slot.install(build, True, None)
    return before, engine_state().cell_tracer is not None, engine_state().run is not None


def test_a_traced_build_that_fails_traces_cells_again(cluster: Cluster) -> None:
    # A traced run pauses the cell tracer (it records its own collectives); a build that
    # raised leaves no run, so the cells must be traced again (the built-in run's own
    # set-up forgot this before both runs shared one).
    assert cluster.run(_failed_traced_build) == [(True, True, False)] * cluster.world_size


def _slot_after_build(spec_fields: dict[str, Any]) -> tuple[int, str | None, bool]:
    from workbench.engine import run_slot, train_run
    from workbench.engine.state import engine_state

    train_run.build_run(spec_fields, {"root": "/nonexistent", "every": 1000})
    installed = run_slot.current_run()
    summary = run_slot.summary(0)
    autosave = engine_state().autosave
    train_run.close_run()
    gone = engine_state().run is None
    return installed.step + summary["step"], autosave["root"] if autosave else None, gone


def test_a_built_run_is_installed_in_the_slot_and_closed_from_it(cluster: Cluster) -> None:
    from dataclasses import asdict

    spec = RunSpec(model="mlp-tiny", strategy="dp", batch_size=8)
    assert (
        cluster.run(_slot_after_build, asdict(spec), timeout=300)
        == [(0, "/nonexistent", True)] * cluster.world_size
    )
