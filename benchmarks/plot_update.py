"""Cost of growing the live figures by one step vs rebuilding them, at step 100.

The stepper appends each step's events (~30 for 2 ranks) to its memory, timeline and loss
figures. This measures, side by side on the same machine, the median time to apply that
increment with the update functions and to rebuild the three figures from all 101 steps, for
go.Figure and (when anywidget is installed) go.FigureWidget.

    .venv/bin/python benchmarks/plot_update.py [--steps 100] [--repeats 7]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import plotly.graph_objects as go

from workbench.plots import (
    comm_timeline_figure,
    demo_events,
    loss_figure,
    memory_figure,
    update_comm_timeline,
    update_loss_figure,
    update_memory_figure,
)

BUILDERS: list[tuple[Callable, Callable]] = [
    (lambda ev: memory_figure(ev, capacity=256 << 20), update_memory_figure),
    (comm_timeline_figure, update_comm_timeline),
    (loss_figure, update_loss_figure),
]


def _median_s(fn: Callable[[], object], prepare: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        state = prepare()
        start = time.perf_counter()
        fn(state)  # type: ignore[call-arg]
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100, help="history before the increment")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()

    events = demo_events(args.steps + 1, 2)
    history = [e for e in events if e.step < args.steps]
    increment = [e for e in events if e.step == args.steps]

    def fresh() -> list[go.Figure]:
        # Built, not copied: deepcopy/JSON turn arrays into other forms the live figure
        # never holds, which would time a different update.
        return [build(history) for build, _ in BUILDERS]

    def rebuild(_: object) -> None:
        for build, _ in BUILDERS:
            build(events)

    def update(figs: list[go.Figure]) -> None:
        for fig, (_, upd) in zip(figs, BUILDERS, strict=True):
            upd(fig, increment)

    kinds: list[tuple[str, Callable[[], object]]] = [
        ("go.Figure", fresh),
    ]
    try:
        go.FigureWidget()
        kinds.append(("go.FigureWidget", lambda: [go.FigureWidget(f) for f in fresh()]))
    except ImportError as exc:  # anywidget missing: widgets are the ui layer's concern
        print(f"(FigureWidget skipped: {exc})")

    t_rebuild = _median_s(rebuild, lambda: None, args.repeats)
    print(
        f"step {args.steps}: history {len(history)} events, increment {len(increment)} events, "
        f"median of {args.repeats}"
    )
    print(f"  rebuild memory+timeline+loss from scratch: {t_rebuild * 1e3:8.2f} ms")
    for name, prepare in kinds:
        t_update = _median_s(update, prepare, args.repeats)
        print(
            f"  update {name:<16} with one step:  {t_update * 1e3:8.2f} ms"
            f"   (rebuild / update = {t_rebuild / t_update:.1f}x)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
