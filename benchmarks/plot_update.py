"""Cost of growing the live figures by one step vs rebuilding them, at step 100 (and 400).

The stepper appends each step's events (~30 for 2 ranks) to its memory, timeline and loss
figures. This measures, side by side on the same machine, the median time to apply that
increment with the update functions and to rebuild the three figures from all 101 steps, for
go.Figure and go.FigureWidget (when anywidget is installed). Synthetic events
(``synthetic_events``), no engines: the live-plot benchmark measures the same on a real run.

    .venv/bin/python -m benchmarks.plot_update [--quick]
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import plotly.graph_objects as go

from benchmarks.common import BenchResult, Row, Target, run_main
from workbench.plots import (
    comm_timeline_figure,
    loss_figure,
    memory_figure,
    synthetic_events,
    update_comm_timeline,
    update_loss_figure,
    update_memory_figure,
)

__all__ = ["NAME", "TITLE", "measure", "run"]

NAME = "plot_update"
TITLE = "Live figures: one step's increment vs a rebuild (synthetic events)"

BUILDERS: list[tuple[Callable, Callable]] = [
    (lambda ev: memory_figure(ev, capacity=256 << 20), update_memory_figure),
    (comm_timeline_figure, update_comm_timeline),
    (loss_figure, update_loss_figure),
]


def _median_s(fn: Callable[[object], object], prepare: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        state = prepare()
        start = time.perf_counter()
        fn(state)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(steps: int = 100, repeats: int = 7) -> dict[str, object]:
    """Median seconds to rebuild, and to update each kind of figure, at step ``steps``."""
    events = synthetic_events(steps + 1, 2)
    history = [e for e in events if e.step < steps]
    increment = [e for e in events if e.step == steps]

    def fresh() -> list[go.Figure]:
        # Built, not copied: deepcopy/JSON turn arrays into other forms the live figure
        # never holds, which would time a different update.
        return [build(history) for build, _ in BUILDERS]

    def rebuild(_: object) -> None:
        for build, _ in BUILDERS:
            build(events)

    def update(figs: object) -> None:
        for fig, (_, upd) in zip(figs, BUILDERS, strict=True):  # type: ignore[call-overload]
            upd(fig, increment)

    kinds: list[tuple[str, Callable[[], object]]] = [("go.Figure", fresh)]
    skipped = ""
    try:
        go.FigureWidget()
        kinds.append(("go.FigureWidget", lambda: [go.FigureWidget(f) for f in fresh()]))
    except ImportError as exc:  # anywidget missing: widgets are the ui layer's concern
        skipped = f"FigureWidget skipped: {exc}"
    return {
        "steps": steps,
        "history_events": len(history),
        "increment_events": len(increment),
        "repeats": repeats,
        "rebuild_s": _median_s(rebuild, lambda: None, repeats),
        "update_s": {name: _median_s(update, prepare, repeats) for name, prepare in kinds},
        "skipped": skipped,
    }


def run(quick: bool = False) -> BenchResult:
    # Two history lengths in a full run: does one step's update cost grow with history?
    points = [(100, 3)] if quick else [(100, 9), (400, 5)]
    measured = [measure(steps=steps, repeats=repeats) for steps, repeats in points]
    first = measured[0]
    result = BenchResult(
        NAME,
        TITLE,
        ran="memory + comm timeline + loss figures (2 ranks, "
        f"{first['increment_events']} events per step) at step "
        + " and ".join(str(m["steps"]) for m in measured)
        + ": update_*() with one step vs building the 3 figures from all events, median of "
        + "/".join(str(m["repeats"]) for m in measured),
        details={f"step_{m['steps']}": m for m in measured},
    )
    target = Target("<", 1.0, "< 1 (growing beats rebuilding)")
    for m in measured:
        rebuild = float(m["rebuild_s"])  # type: ignore[arg-type]
        for name, seconds in m["update_s"].items():  # type: ignore[union-attr]
            result.rows.append(
                Row.compare(
                    f"apply one step to 3 {name}s at step {m['steps']}",
                    "ms",
                    seconds * 1e3,
                    rebuild * 1e3,
                    raw_label="rebuild",
                    target=target,
                    samples=int(m["repeats"]),  # type: ignore[call-overload]
                )
            )
    if first["skipped"]:
        result.notes.append(str(first["skipped"]))
    return result


if __name__ == "__main__":
    raise SystemExit(run_main(run))
