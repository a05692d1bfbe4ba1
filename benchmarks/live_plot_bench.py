"""Live plot cost on a real run: Run N with the stepper widget attached vs the session alone,
the time to apply one step's increment to the live FigureWidgets, and the bytes engines send
per step.

    .venv/bin/python -m benchmarks.live_plot_bench [--quick]
"""

from __future__ import annotations

import pickle
import time

from benchmarks.common import BenchResult, Row, Target, interleaved, median, run_main

__all__ = ["NAME", "TITLE", "run"]

NAME = "live_plot"
TITLE = "Live plots: Run N with the widget vs TrainingSession.run alone; per-step cost"
TARGET = Target("<=", 1.05)


def run(quick: bool = False) -> BenchResult:
    from workbench.cluster import Cluster
    from workbench.trace import to_record
    from workbench.ui.stepper import Stepper
    from workbench.ui.stepper_view import THROTTLE_S, StepperView

    n_steps, repeats, singles = (10, 1, 5) if quick else (100, 3, 30)
    model, strategy, batch = "gpt-tiny", "dp", 8
    cluster = Cluster(n=2, backend="gloo")
    try:
        cluster.start_sync()
        stepper = Stepper(model=model, strategy=strategy, cluster=cluster, batch_size=batch)
        session = stepper.session
        session.build()
        view = StepperView(stepper)
        session.run(3)  # warm-up (DDP rebuilds its buckets after the first iteration)

        refreshes: list[tuple[int, float, float]] = []  # (count, seconds in refreshes, run)

        def with_widget() -> float:
            before = len(view.flush_times)
            start = time.perf_counter()
            view._run_blocking(n_steps)  # what Run N does (the kernel's path also yields)
            elapsed = time.perf_counter() - start
            flushes = view.flush_times[before:]
            refreshes.append((len(flushes), sum(flushes), elapsed))
            return elapsed

        def session_alone() -> float:
            view._unsubscribe()
            try:
                start = time.perf_counter()
                session.run(n_steps)
                return time.perf_counter() - start
            finally:
                view._unsubscribe = session.subscribe(view._on_events)

        samples = interleaved(
            {"widget": with_widget, "session": session_alone}, repeats=repeats, warmup=0
        )
        # Single steps: each one's increment is flushed at once (no throttling outside a run).
        sizes: list[int] = []
        unsubscribe = session.subscribe(
            lambda new: sizes.append(len(pickle.dumps([to_record(e) for e in new])))
        )
        flushes_before = len(view.flush_times)
        step_times = []
        try:
            for _ in range(singles):
                start = time.perf_counter()
                stepper.step()
                step_times.append(time.perf_counter() - start)
        finally:
            unsubscribe()
        flush_times = view.flush_times[flushes_before:]
        history = len(session.events)
        events_per_step = len(session.events) / max(1, session.step_index)
        session.close()
    finally:
        cluster.stop_sync()

    widget, alone = median(samples["widget"]), median(samples["session"])
    result = BenchResult(
        NAME,
        TITLE,
        ran=f"Stepper({model!r}, {strategy!r}, batch_size={batch}) on a 2-engine gloo cluster; "
        f"Run {n_steps} through StepperView (FigureWidgets, refresh throttled to "
        f"{THROTTLE_S} s) vs TrainingSession.run({n_steps}) with the view unsubscribed, "
        f"interleaved, {repeats} each; then {singles} single steps (each flushed at once) "
        f"at {history} events of history",
        details={
            "run_s": samples,
            "flush_s": flush_times,
            "step_s": step_times,
            "bytes_per_step": sizes,
            "refreshes_during_runs": refreshes,
        },
    )
    result.rows.append(
        Row.compare(
            f"Run {n_steps}: widget attached vs session alone",
            "s",
            widget,
            alone,
            raw_label="session",
            target=TARGET,
            samples=repeats,
        )
    )
    count, spent, elapsed = sorted(refreshes, key=lambda r: r[2])[len(refreshes) // 2]
    result.rows[-1].note = (
        f"median widget run: {count} figure refreshes took {spent:.2f} s of {elapsed:.2f} s "
        f"({spent / elapsed:.0%})"
    )
    flush, step = median(flush_times), median(step_times)
    result.rows.append(
        Row.compare(
            "one step's increment onto the live figures vs the step",
            "ms",
            flush * 1e3,
            step * 1e3,
            raw_label="step()",
            target=None,
            samples=len(flush_times),
            note="StepperView._flush (3 FigureWidgets + status) vs the whole stepper.step() "
            "round trip it follows; during Run N refreshes are throttled",
        )
    )
    result.rows.append(
        Row(
            metric="bytes sent from engines per step (pickled records, both ranks)",
            unit="B",
            workbench=float(median(sizes)),
            samples=len(sizes),
            note=f"{events_per_step:.0f} events per step",
        )
    )
    return result


if __name__ == "__main__":
    raise SystemExit(run_main(run))
