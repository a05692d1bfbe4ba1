"""The stepper widget: controls, per-rank status and live plotly figures.

A view only: every button calls a ``Stepper`` method, and figures grow from the increments
the session hands its listeners (never the whole history). Figure updates are batched and
throttled so a long Run N stays smooth; Run N yields to the kernel between steps so Pause
is heard.
"""

from __future__ import annotations

import asyncio
import html
import time
from typing import TYPE_CHECKING, Any, Protocol

import ipywidgets as widgets
import plotly.graph_objects as go

from workbench.errors import WorkbenchError
from workbench.parallel.models import PRESETS
from workbench.parallel.options import PRECISIONS
from workbench.parallel.pp import SCHEDULES
from workbench.parallel.run_spec import OPTIMIZERS, STRATEGIES
from workbench.plots import (
    comm_timeline_figure,
    loss_figure,
    memory_figure,
    update_comm_timeline,
    update_loss_figure,
    update_memory_figure,
)
from workbench.trace import Event
from workbench.ui.fit_width import WidthWatch, responsive

if TYPE_CHECKING:
    from workbench.parallel.run_spec import RunSpec
    from workbench.session.run_state import RankStatus
    from workbench.session.training import TrainingSession

__all__ = ["StepperView"]


class Stepper(Protocol):
    """What the view asks of the ``Stepper`` it is bound to. ``stepper.py`` builds the
    view; the view names only this, so the two modules do not import each other."""

    session: TrainingSession
    capacity: int | None
    reference: bool

    @property
    def spec(self) -> RunSpec: ...
    @property
    def status(self) -> list[RankStatus]: ...
    def phase(self, count: int = 1) -> list[Event]: ...
    def step(self, count: int = 1) -> list[Event]: ...
    def reset(self) -> None: ...
    def rebuild(self, **changes: Any) -> None: ...
    def reference_losses(self) -> list[float]: ...
    def figures(self, steps: tuple[int, int] | range | None = None) -> dict[str, go.Figure]: ...


# Minimum seconds between figure refreshes during Run N (events are buffered in between
# and flushed at the end); slower refreshes stretch the interval further (see _flush).
THROTTLE_S = 0.25
_KEYS = ("memory", "comm", "loss")  # Stepper.figures()' keys, in tab order
# The compact layout: a 300 px column of controls beside the figures (which take the
# rest of the row; min_width 0 lets the row shrink below the figures' drawn width).
LABEL_WIDTH = "100px"
SIDE_WIDTH = "300px"
_OPTIONS_GRID = {"grid_template_columns": "1fr", "grid_gap": "0px", "width": "100%"}
_BUTTON_ROWS = {"display": "flex", "flex_flow": "row wrap", "width": "100%"}
_SIDE_COLUMN = {"width": SIDE_WIDTH, "min_width": SIDE_WIDTH, "overflow": "hidden"}
_ROOT_ROW = {"width": "100%", "align_items": "flex-start", "overflow": "hidden"}
_BUTTON = {"width": "94px", "margin": "2px"}
# The status table: without padding its header reads "rankstepnext phaseloss". Scoped to
# the table's class so cells stay plain <td>s; numbers (rank, step, loss) align right.
_STATUS_CSS = (
    "<style>.wb-status th,.wb-status td{padding:1px 14px 1px 0;text-align:right;"
    "font-variant-numeric:tabular-nums}"
    ".wb-status th:nth-child(3),.wb-status td:nth-child(3){text-align:left}</style>"
)


def _with(choices: Any, value: Any) -> list[Any]:
    """The choices plus the current value (your own model's label, a custom layout)."""
    out = list(choices)
    return out if value in out else [*out, value]


def _option_controls(stepper: Stepper) -> dict[str, Any]:
    """One control per run option, showing the stepper's spec; your own model's factories
    are fixed (their controls disabled)."""
    spec = stepper.spec
    options = {
        "strategy": widgets.Dropdown(
            options=_with(STRATEGIES, spec.strategy), value=spec.strategy, description="strategy"
        ),
        "model": widgets.Dropdown(
            options=_with(sorted(PRESETS), spec.model), value=spec.model, description="model"
        ),
        "batch_size": widgets.BoundedIntText(
            value=spec.batch_size, min=1, max=4096, description="batch"
        ),
        "optimizer": widgets.Dropdown(
            options=_with(OPTIMIZERS, spec.optimizer), value=spec.optimizer, description="optimizer"
        ),
        "precision": widgets.Dropdown(
            options=PRECISIONS, value=spec.precision, description="precision"
        ),
        "overlap": widgets.Checkbox(value=spec.overlap, description="overlap (DDP)"),
        "checkpointing": widgets.Checkbox(
            value=spec.checkpointing is not False, description="activation ckpt"
        ),
        "microbatches": widgets.BoundedIntText(
            value=spec.microbatches, min=1, max=64, description="micro-batches"
        ),
        "schedule": widgets.Dropdown(
            options=sorted(SCHEDULES), value=spec.schedule, description="schedule"
        ),
    }
    if spec.model not in PRESETS:  # your own model: its factories are fixed here
        for name in ("model", "optimizer"):
            options[name].disabled = True
        # Blocks given by name or class: the checkbox cannot say which, so it shows them.
        options["checkpointing"].disabled = not isinstance(spec.checkpointing, bool)
    for control in options.values():
        # One label width for the whole grid: the default (80px) cuts "micro-batches".
        control.style.description_width = LABEL_WIDTH
        control.layout = widgets.Layout(width="auto", margin="1px 2px")
    return options


class StepperView:
    """Widgets bound to one ``Stepper``."""

    def __init__(self, stepper: Stepper) -> None:
        self.stepper = stepper
        self._pending: list[Event] = []
        self._last_flush = 0.0
        self._running = False
        self._pause = False
        self._reverting = False
        self.flush_times: list[float] = []  # seconds per figure refresh (for benchmarks)
        self.options = _option_controls(stepper)
        for name, control in self.options.items():
            control.observe(lambda change, n=name: self._on_option(n, change), names="value")
        self._make_buttons()
        ranks = stepper.session.run_ranks
        self.memory = responsive(memory_figure(capacity=stepper.capacity, ranks=ranks))
        self.comm = responsive(comm_timeline_figure(ranks=ranks))
        self.loss = responsive(loss_figure(reference=[] if stepper.reference else None))
        self.figures = (self.memory, self.comm, self.loss)  # in tab order
        for figure in self.figures:
            _autosize(figure)
        self.tabs = widgets.Tab(
            children=list(self.figures), titles=("memory", "communication", "loss")
        )
        self.tabs.observe(self._on_tab, names="selected_index")
        # Controls beside the figure, so a teacher at 1,280 x 800 (a projector) clicks and
        # sees the result on one screen: options one per row, buttons in rows of two or
        # three, the status table under them, the figures' tabs taking the rest.
        option_box = widgets.GridBox(list(self.options.values()), layout=_OPTIONS_GRID)
        controls = widgets.Box(
            [
                self.phase_button,
                self.step_button,
                self.run_count,
                self.run_button,
                self.pause_button,
                self.reset_button,
                self.progress,
            ],
            layout=_BUTTON_ROWS,
        )
        side = widgets.VBox([option_box, controls, self.status, self.message], layout=_SIDE_COLUMN)
        self.tabs.layout = widgets.Layout(flex="1 1 auto", min_width="0", width="auto")
        # the figures re-measure their tab when the row's width changes (the file browser
        # opened or closed): see fit_width
        row = widgets.HBox([side, self.tabs], layout=_ROOT_ROW)
        self.root = widgets.VBox([row, WidthWatch()], layout={"width": "100%"})
        self._unsubscribe = stepper.session.subscribe(self._on_events)
        if stepper.session.events:
            self._pending.extend(stepper.session.events)
        self._flush(force=True)

    def _make_buttons(self) -> None:
        self.phase_button = widgets.Button(
            description="Phase ▶",
            button_style="primary",
            tooltip="advance every rank by one phase",
            layout=_BUTTON,
        )
        self.step_button = widgets.Button(
            description="Step ▶▶", tooltip="finish the step", layout=_BUTTON
        )
        self.run_count = widgets.BoundedIntText(
            value=10, min=1, max=100000, layout={"width": "94px", "margin": "2px"}
        )
        self.run_count.add_class("wb-run-count")  # N of Run N (the browser tests find it)
        self.run_button = widgets.Button(
            description="Run N", tooltip="run N whole steps", layout=_BUTTON
        )
        self.pause_button = widgets.Button(description="Pause", disabled=True, layout=_BUTTON)
        self.reset_button = widgets.Button(
            description="Reset", button_style="warning", layout=_BUTTON
        )
        self.progress = widgets.IntProgress(
            value=0, min=0, max=1, description="", layout={"width": "192px", "margin": "6px 2px"}
        )
        self.status = widgets.HTML()
        self.message = widgets.HTML()
        self.phase_button.on_click(lambda _b: self._guard(self.stepper.phase))
        self.step_button.on_click(lambda _b: self._guard(self.stepper.step))
        self.run_button.on_click(lambda _b: self._start_run(self.run_count.value))
        self.pause_button.on_click(lambda _b: self._request_pause())
        self.reset_button.on_click(lambda _b: self._guard(self._reset))

    # -- events -> figures ---------------------------------------------------------------
    def _on_events(self, events: list[Event]) -> None:
        self._pending.extend(events)
        self._flush(force=not self._running)

    def _flush(self, *, force: bool = False) -> None:
        now = time.monotonic()
        # A refresh re-sends each figure's arrays, so its cost grows with the history: wait
        # at least 40x the last refresh, which keeps figure updates near 2.5% of a long Run N.
        last_cost = self.flush_times[-1] if self.flush_times else 0.0
        if not force and now - self._last_flush < max(THROTTLE_S, 40 * last_cost):
            return
        pending, self._pending = self._pending, []
        started = time.perf_counter()
        if pending and not self.stepper.session.store.whole_run_in_window():
            # A run past the recent window is drawn from its summaries, bucketed: each
            # refresh sends at most a few thousand points, however long the run.
            figures = self.stepper.figures()
            self._replace_figures(
                [(w, figures[k]) for w, k in zip(self.figures, _KEYS, strict=True)]
            )
        elif pending:
            update_memory_figure(self.memory, pending)
            update_comm_timeline(self.comm, pending)
            update_loss_figure(self.loss, pending)
            if self.stepper.reference:
                self._update_reference()
        self._render_status()
        self.flush_times.append(time.perf_counter() - started)
        self._last_flush = now

    def _update_reference(self) -> None:
        values = self.stepper.reference_losses()
        for trace in self.loss.data:
            if isinstance(trace.meta, dict) and trace.meta.get("key") == "loss/reference":
                trace.x = list(range(len(values)))
                trace.y = values

    def _render_status(self) -> None:
        rows = "".join(
            f"<tr><td>{s.rank}</td><td>{s.step}</td><td>{html.escape(s.next_phase)}</td>"
            f"<td>{'' if s.loss is None else f'{s.loss:.6f}'}</td></tr>"
            for s in self.stepper.status
        )
        spec = self.stepper.spec
        phases = self.stepper.session.phases
        where = (
            f"phases: {html.escape(' → '.join(phases))}"
            if phases
            # Nothing runs on the engines until the first action builds the model there.
            else "<i>built on every rank by the first Phase ▶, Step ▶▶ or Run N</i>"
        )
        self.status.value = (
            f"{_STATUS_CSS}<b>{html.escape(spec.strategy)}</b> · {html.escape(spec.model)} · "
            f"{where}<table class='wb-status' style='border-collapse:collapse'><tr><th>rank</th>"
            f"<th>step</th><th>next phase</th><th>loss</th></tr>{rows}</table>"
        )

    # -- actions -------------------------------------------------------------------------
    def _guard(self, action: Any, *args: Any) -> Any:
        """Run an action; show a failure in the widget instead of raising into the void."""
        self.message.value = ""
        try:
            return action(*args)
        except WorkbenchError as exc:
            self.message.value = (
                f"<pre style='color:#b00020;white-space:pre-wrap'>{html.escape(str(exc))}</pre>"
            )
            return None
        finally:
            self._flush(force=True)

    def _reset(self) -> None:
        self.stepper.reset()
        self._rebuild_figures()

    def _rebuild_figures(self) -> None:
        ranks = self.stepper.session.run_ranks
        fresh = [
            (self.memory, memory_figure(capacity=self.stepper.capacity, ranks=ranks)),
            (self.comm, comm_timeline_figure(ranks=ranks)),
            (self.loss, loss_figure(reference=[] if self.stepper.reference else None)),
        ]
        self._replace_figures(fresh)
        self._pending = []

    def _replace_figures(self, fresh: list[tuple[go.FigureWidget, go.Figure]]) -> None:
        for widget, figure in fresh:
            with widget.batch_update():
                widget.data = ()
                widget.layout = figure.layout
                widget.add_traces(list(figure.data))
                widget.layout.autosize = True
                # the old x range came back from the front end into the layout: a fresh
                # figure measures its own (the timeline stayed seconds wide after Reset)
                widget.update_xaxes(autorange=True)

    def _on_tab(self, change: dict[str, Any]) -> None:
        index = change["new"]
        if index is not None and 0 <= index < len(self.figures):
            _refit(self.figures[index])

    def _on_option(self, name: str, change: dict[str, Any]) -> None:
        if self._running or self._reverting:
            return
        if self._guard(self._apply_option, name, change["new"]) is None:
            # Invalid combination: the message stays, the control goes back.
            self._reverting = True
            try:
                self.options[name].value = change["old"]
            finally:
                self._reverting = False

    def _apply_option(self, name: str, value: Any) -> bool:
        self.stepper.rebuild(**{name: value})
        self._rebuild_figures()
        return True

    def _request_pause(self) -> None:
        self._pause = True

    def _set_running(self, running: bool) -> None:
        self._running = running
        for button in (self.phase_button, self.step_button, self.run_button, self.reset_button):
            button.disabled = running
        self.pause_button.disabled = not running

    def _start_run(self, count: int) -> None:
        """Run N steps; inside a kernel this yields between steps so Pause is processed."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if loop is None:
            self._guard(self._run_blocking, count)
        else:
            loop.create_task(self._run_async(count))

    def _run_blocking(self, count: int) -> None:
        self._begin(count)
        try:
            self.stepper.session.run(count, on_step=self._on_step, should_stop=lambda: self._pause)
        finally:
            self._end()

    async def _run_async(self, count: int) -> None:
        self._begin(count)
        session = self.stepper.session
        target = session.step_index + count
        try:
            for _ in range(count):
                if self._pause:
                    break
                await asyncio.to_thread(session.step_toward, target)
                self._on_step(self.progress.value + 1, count)
            await asyncio.to_thread(session.fill_window)  # paused: the window's detail
        except WorkbenchError as exc:
            self.message.value = (
                f"<pre style='color:#b00020;white-space:pre-wrap'>{html.escape(str(exc))}</pre>"
            )
        finally:
            self._end()

    def _begin(self, count: int) -> None:
        self._pause = False
        self.message.value = ""
        self.progress.max = count
        self.progress.value = 0
        self._set_running(True)

    def _on_step(self, done: int, total: int) -> None:
        self.progress.value = done

    def _end(self) -> None:
        self._set_running(False)
        self._flush(force=True)


# -- figure width -----------------------------------------------------------------------------
# The FigureWidget front end draws its first frame before it is attached to the page, so it
# cannot measure its container and falls back to plotly's 700 px. With ``autosize`` set
# explicitly, every later relayout (each figure update sends one) measures the container
# again, so the figure fills the tab once data arrives. A figure in a hidden tab cannot be
# measured; ``_refit`` re-measures it when its tab is shown.


def _autosize(figure: go.FigureWidget) -> None:
    figure.plotly_relayout({"autosize": True})  # the figure's own method: one relayout


def _refit(figure: go.FigureWidget) -> None:
    """Make the front end measure the (now visible) container again.

    Two separate relayouts on purpose: setting the same value again sends nothing, and a
    batched off-then-on collapses to no change.
    """
    figure.plotly_relayout({"autosize": False})
    figure.plotly_relayout({"autosize": True})
