"""``Stepper``: step a distributed training run phase by phase, with live figures.

The state (which run, where every rank is, every event) lives in a ``TrainingSession``;
``Stepper`` adds figures and a widget view over it. Everything the buttons do is a method.
"""

from __future__ import annotations

import weakref
from pathlib import Path
from typing import Any

import plotly.graph_objects as go

from workbench import validate
from workbench.cluster import Cluster
from workbench.errors import ClusterError, ConfigError
from workbench.parallel.pp_schedules import analytic_bubble, check_schedule, measured_bubble
from workbench.parallel.run_spec import RUN_OPTIONS, RunSpec
from workbench.plots import comm_timeline_figure, loss_figure, memory_figure
from workbench.session.current import make_current
from workbench.session.run_state import RankStatus
from workbench.session.training import TrainingSession, validate_layout
from workbench.session.user_training import UserTrainingSession, is_user_run, user_spec
from workbench.trace import Event
from workbench.trace.policy import RecordPolicy, record_policy
from workbench.trace.store import step_ranges
from workbench.trace.summary import StepSummaries

__all__ = ["Stepper"]

_current: list[weakref.ref[Stepper]] = []  # the most recently created stepper


def _check_arguments(
    timeout: object,
    capacity: object,
    reference: object,
    checkpoint_dir: object,
    checkpoint_every: object,
    keep_last: object,
) -> None:
    """The Stepper's own settings (the run's are RunSpec's), before any work starts."""
    validate.seconds("timeout", timeout, none_means="no limit")
    validate.integer(
        "capacity", capacity, minimum=1, none_means="no capacity line", what="a number of bytes"
    )
    validate.boolean("reference", reference)
    if checkpoint_dir is not None and not isinstance(checkpoint_dir, str | Path):
        raise validate.invalid(
            "checkpoint_dir", checkpoint_dir, "not a path", "use a str or Path, or None"
        )
    validate.integer(
        "checkpoint_every",
        checkpoint_every,
        minimum=1,
        none_means="only explicit saves",
        what="a number of steps",
    )
    validate.integer(
        "keep_last",
        keep_last,
        minimum=1,
        none_means="keep every checkpoint",
        what="a number of checkpoints",
    )


def _step_range(steps: object) -> tuple[int, int]:
    """``(first, last)`` (inclusive) or a ``range`` of steps."""
    if isinstance(steps, range) and steps.step == 1 and len(steps):
        return steps.start, steps.stop - 1
    if (
        isinstance(steps, tuple)
        and len(steps) == 2
        and all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in steps)
        and steps[0] <= steps[1]
    ):
        return steps[0], steps[1]
    raise validate.invalid(
        "steps",
        steps,
        "not a step range",
        "use (first, last) with 0 <= first <= last, a range(first, stop), or None (the whole run)",
    )


class Stepper:
    """Drive one run on every rank of ``cluster`` (default: the running one).

    >>> stepper = Stepper(model="gpt-tiny", strategy="dp", batch_size=8)   # doctest: +SKIP
    >>> stepper.phase(); stepper.step(); stepper.run(10)                   # doctest: +SKIP
    >>> stepper                      # in a notebook: the widget           # doctest: +SKIP
    """

    def __init__(
        self,
        model: Any = "gpt-tiny",
        strategy: str = "dp",
        *,
        cluster: Cluster | None = None,
        capacity: int | None = None,
        reference: bool = False,
        timeout: float | None = 300.0,
        checkpoint_dir: str | Path | None = None,
        checkpoint_every: int | None = None,
        keep_last: int | None = 3,
        elastic: bool = False,
        record: RecordPolicy | str | None = None,
        run_dir: str | Path | None = None,
        **options: Any,
    ) -> None:
        if cluster is not None and not isinstance(cluster, Cluster):
            raise validate.invalid(
                "cluster",
                cluster,
                "not a Cluster",
                "use a workbench.Cluster, or None (the running one)",
            )
        _check_arguments(timeout, capacity, reference, checkpoint_dir, checkpoint_every, keep_last)
        record_policy(record)  # a bad policy fails here, before any engine works
        validate.boolean("elastic", elastic)
        if elastic and is_user_run(model, options):  # a shrink resizes built-in runs only
            raise validate.invalid(
                "elastic",
                elastic,
                "a run of your own model keeps its world size",
                "leave elastic=False; recover() then replaces the lost engines",
            )
        # Your own model: ``model=make_model, data=..., loss=..., optimizer=...`` (see
        # workbench.session.user_training); a preset name otherwise.
        user = user_spec(model, strategy, options) if is_user_run(model, options) else None
        if user is None:  # a typo is the workbench's error naming the nearest option
            validate.option_names("Stepper", options, RUN_OPTIONS)
        spec = RunSpec(model=model, strategy=strategy, **options) if user is None else None
        self.cluster = cluster if cluster is not None else Cluster.current()
        checkpoints: dict[str, Any] = {
            "checkpoint_dir": checkpoint_dir,
            "checkpoint_every": checkpoint_every,
            "keep_last": keep_last,
            "record": record,  # which steps keep full detail (summaries: every step)
            "run_dir": run_dir,  # where the detail of steps past the window goes
        }
        if spec is not None:
            validate_layout(spec, self.cluster.world_size)  # fail here, before any work
            self.session: TrainingSession = TrainingSession(
                self.cluster, spec, timeout=timeout, elastic=elastic, **checkpoints
            )
        else:
            self.session = UserTrainingSession(
                self.cluster,
                user,  # type: ignore[arg-type]
                timeout=timeout,
                **checkpoints,
            )
        self.capacity = capacity
        self.reference = reference
        self._view: Any | None = None
        _current[:] = [weakref.ref(self)]
        make_current(self.session)  # the session `%wb restart` / `%wb grow` carry along

    @classmethod
    def current(cls) -> Stepper:
        """The most recently created stepper (what ``%wb step`` and ``%wb plot`` drive)."""
        stepper = _current[0]() if _current else None
        if stepper is None:
            raise ConfigError(
                "no stepper yet; create one with "
                "`stepper = workbench.Stepper(model='gpt-tiny', strategy='dp')`"
            )
        return stepper

    @classmethod
    def attach(cls, cluster: Cluster | None = None, **settings: Any) -> Stepper:
        """The run the engines of ``cluster`` (default: the current one, e.g. a kept cluster
        just attached with ``%wb attach``) still hold, taken up by a new stepper: the same
        options, its step index and phase, and the events the engines still hold (those of
        the run's last call; the recorder lets go of what a kernel acknowledged). ``settings`` are
        the stepper's own (``timeout``, ``checkpoint_dir``, ``checkpoint_every``,
        ``keep_last``, ``capacity``...), which the engines do not hold. A run of your own
        model is not taken up (its factories lived in the kernel that built it): build it
        again."""
        from workbench.engine.train_run import describe_run

        cluster = cluster if cluster is not None else Cluster.current()
        found = cluster.run(describe_run)
        if found[0] is None:
            raise ClusterError(
                "no training run on this cluster's engines to take up; create one with "
                "`stepper = wb.Stepper(model='gpt-tiny', strategy='dp')`"
            )
        if found[0]["spec"] is None:
            raise ClusterError(
                "the engines hold a run of your own model, which cannot be taken up (its "
                "model, data and loss factories lived in the kernel that built it); build "
                "it again with wb.Stepper(model=make_model, ...) and load its checkpoint"
            )
        stepper = cls(cluster=cluster, **found[0]["spec"], **settings)
        stepper.session.adopt([r for r in found if r is not None])
        return stepper

    def __repr__(self) -> str:
        return f"<workbench.Stepper {self.session!r}>"

    # -- the run -------------------------------------------------------------------------
    @property
    def spec(self) -> RunSpec:
        return self.session.spec

    @property
    def events(self) -> list[Event]:
        """The events of every rank kept in full detail (phases, memory, collectives,
        losses): the steps ``record=`` keeps, read back from the run directory and the
        recent window. A short run keeps them all."""
        return self.session.events

    @property
    def summaries(self) -> StepSummaries:
        """Per-step summaries of every step of every rank (``summaries.rows()``)."""
        return self.session.store.summaries

    @property
    def status(self) -> list[RankStatus]:
        return self.session.status

    def phase(self, count: int = 1) -> list[Event]:
        """Advance every rank by one phase (``count`` phases); returns the new events."""
        return self.session.phase(count)

    def step(self, count: int = 1) -> list[Event]:
        """Run to the end of the current step (``count`` steps); returns the new events."""
        return self.session.step(count)

    def run(self, count: int, *, recover: bool = False) -> int:
        """Run ``count`` whole steps; returns how many ran. ``recover=True`` recovers from
        a dead engine or a hung collective and continues from the last checkpoint."""
        return self.session.run(count, recover=recover)

    def reset(self) -> None:
        """Fresh weights, step 0, no events — same options."""
        self.session.reset()

    def rebuild(self, **changes: Any) -> None:
        """Change options (strategy, batch_size, overlap, ...) and rebuild on every rank."""
        self.session.build(**changes)

    def reference_losses(self) -> list[float]:
        return self.session.reference_losses()

    def close(self) -> None:
        self.session.close()

    # -- checkpoints ---------------------------------------------------------------------
    def save(self, path: str | Path | None = None, *, keep_last: int | None = None) -> str:
        """Checkpoint the run on every rank (DCP); returns the checkpoint directory."""
        return self.session.save(path, keep_last=keep_last)

    def load(self, step: int | None = None, *, path: str | Path | None = None) -> dict[str, Any]:
        """Load a checkpoint (default: the newest) on every rank; returns its metadata."""
        return self.session.load(step, path=path)

    def checkpoints(self, path: str | Path | None = None) -> list[dict[str, Any]]:
        return self.session.checkpoints(path)

    @property
    def elastic(self) -> bool:
        """Whether a lost rank is dropped (the run shrinks, same global batch) rather than
        replaced, when the run recovers."""
        return self.session.elastic

    def recover(self, shrink: bool | None = None) -> str:
        """Replace dead / free stuck engines (``shrink``, default ``elastic``: go on
        without the dead ones) and roll back to the last checkpoint; says what was done."""
        return self.session.recover(shrink)

    def grow(self, n: int = 1, *, hosts: object = None) -> str:
        """Add ``n`` ranks (on ``hosts`` when given) at a checkpoint boundary and continue
        at the bigger world size with the same global batch: the inverse of a shrink."""
        return self.session.grow(n, hosts=hosts)

    # -- output --------------------------------------------------------------------------
    def bubble(self) -> list[dict[str, Any]]:
        """Each rank's pipeline bubble: its idle fraction inside the schedule, measured from
        the trace (steps after the first), beside the analytic one for its schedule
        (``workbench.parallel.pp_schedules``: (p-1)/(m+p-1) for GPipe and 1F1B, ...)."""
        spec = self.spec
        world = self.cluster.world_size
        dims = spec.dims(world) if isinstance(spec, RunSpec) else spec.layout(world).dims(world)
        if dims.pp < 2:
            raise ConfigError(
                f"bubble() measures a pipeline; this run has pp={dims.pp} "
                "(use strategy='pp', or a layout with pp >= 2)"
            )
        v = check_schedule(spec.schedule, spec.stages_per_rank, spec.microbatches, dims.pp)
        analytic = analytic_bubble(spec.schedule, dims.pp, spec.microbatches, v)
        rows = measured_bubble(self.events, range(world), analytic)
        if not any(r.steps for r in rows):
            raise ConfigError(
                "no pipeline step in the trace yet; run a step first (stepper.step()) "
                "with trace=True"
            )
        return [{"schedule": spec.schedule, **r.as_dict()} for r in rows]

    def figures(self, steps: tuple[int, int] | range | None = None) -> dict[str, go.Figure]:
        """Plain plotly figures: memory, comm, loss.

        A run still all in the recent window is drawn in full detail; a longer one from
        its per-step summaries, bucketed to min/max envelopes (a flat cost at any length).
        ``steps=(first, last)`` zooms into recorded steps: their full detail."""
        store = self.session.store
        ranks = self.session.run_ranks  # one panel for ``single``: rank 0 alone trains
        reference = self.reference_losses() if self.reference else None
        if steps is None and not store.whole_run_in_window():
            from workbench.plots.run_summary import summary_figures

            return summary_figures(
                store.summaries, capacity=self.capacity, ranks=ranks, reference=reference
            )
        if steps is None:
            events = store.events()
        else:
            first, last = _step_range(steps)
            events = store.events(first, last)
            if not any(first <= s <= last for s in store.recorded_steps()):
                raise ConfigError(
                    f"steps={steps!r} is not valid: no step in it was recorded in detail; "
                    f"recorded steps: {step_ranges(store.recorded_steps())} (record= chooses "
                    "them; figures() without steps draws the whole run from summaries)"
                )
        return {
            "memory": memory_figure(events, capacity=self.capacity, ranks=ranks),
            "comm": comm_timeline_figure(events, ranks=ranks),
            "loss": loss_figure(events, reference=reference),
        }

    def export_memory_snapshot(self, dir: str | Path) -> list[Path]:
        """Write one PyTorch memory snapshot per rank to ``dir``
        (``memory_snapshot_rank<r>.pickle``: pytorch.org/memory_viz opens it,
        ``torch.cuda._memory_viz`` reads it), its actions tagged with phase, step and
        category. On CUDA: the allocator's recorded history; elsewhere: built from the
        memory samples of the recorded steps. Returns the paths, rank order."""
        from workbench.session.memory_export import export_memory_snapshot

        return export_memory_snapshot(self.session, dir)

    def export_trace(self, path: str | Path) -> Path:
        """Write a Perfetto / Chrome trace of every rank's events; returns the path."""
        return self.session.export_trace(path)

    # -- the widget ----------------------------------------------------------------------
    @property
    def widget(self) -> Any:
        """The ipywidgets view (built on first use)."""
        if self._view is None:
            from workbench.ui.stepper_view import StepperView

            self._view = StepperView(self)
        return self._view.root

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any] | None:
        return self.widget._repr_mimebundle_(**kwargs)  # type: ignore[no-any-return]
