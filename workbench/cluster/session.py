"""``TrainingSession``: the client side of the step machine.

Dispatches phases and steps to every rank at once, keeps one cursor per rank so each call
returns only new events, and keeps all events in rank order for figures and export. Plain
object, no widgets: the stepper widget is a view over it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from workbench.cluster import remote_run
from workbench.cluster.cluster import Cluster
from workbench.errors import ConfigError
from workbench.parallel.models import get_config
from workbench.parallel.spec import RunSpec
from workbench.trace import Event, from_record, to_perfetto

__all__ = ["RankStatus", "TrainingSession", "validate_layout"]

Listener = Callable[[list[Event]], None]


def validate_layout(spec: RunSpec, world_size: int) -> None:
    """Impossible layouts fail here, on the client, with the message naming the fix,
    instead of as the same error raised on every engine."""
    dims = spec.dims(world_size)
    dims.validate_for(get_config(spec.model, seed=spec.seed))
    spec.check_batch(dims)


@dataclass(slots=True)
class RankStatus:
    rank: int
    step: int = 0
    next_phase: str = "data"
    loss: float | None = None
    error: str | None = None


@dataclass(slots=True)
class _State:
    spec: RunSpec
    phases: list[str] = field(default_factory=list)
    cursors: dict[int, int] = field(default_factory=dict)
    status: dict[int, RankStatus] = field(default_factory=dict)
    events: list[Event] = field(default_factory=list)


class TrainingSession:
    """Build a run on every rank and advance it by phases or steps."""

    def __init__(self, cluster: Cluster, spec: RunSpec, *, timeout: float | None = 300.0) -> None:
        self.cluster = cluster
        self.timeout = timeout
        self._state = _State(spec=spec)
        self._listeners: list[Listener] = []
        self._reference: list[float] = []
        self.built = False

    def __repr__(self) -> str:
        s = self._state
        steps = {st.step for st in s.status.values()} or {0}
        return (
            f"<TrainingSession strategy={s.spec.strategy!r} model={s.spec.model!r} "
            f"ranks={self.cluster.world_size} step={max(steps)} events={len(s.events)}>"
        )

    # -- state ---------------------------------------------------------------------------
    @property
    def spec(self) -> RunSpec:
        return self._state.spec

    @property
    def phases(self) -> list[str]:
        return list(self._state.phases)

    @property
    def events(self) -> list[Event]:
        return list(self._state.events)

    @property
    def status(self) -> list[RankStatus]:
        return [self._state.status[r] for r in sorted(self._state.status)]

    @property
    def step_index(self) -> int:
        return min((st.step for st in self._state.status.values()), default=0)

    @property
    def next_phase(self) -> str:
        statuses = self.status
        return statuses[0].next_phase if statuses else "data"

    def subscribe(self, listener: Listener) -> Callable[[], None]:
        """Call ``listener(new_events)`` after every increment; returns an unsubscribe."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener) if listener in self._listeners else None

    # -- driving -------------------------------------------------------------------------
    def build(self, **changes: Any) -> None:
        """(Re)build the run on every rank, optionally with changed ``RunSpec`` fields."""
        if changes:
            valid = set(asdict(self._state.spec))
            unknown = sorted(set(changes) - valid)
            if unknown:
                raise ConfigError(f"unknown option(s) {unknown}; valid options: {sorted(valid)}")
            spec = replace(self._state.spec, **changes)
        else:
            spec = self._state.spec
        validate_layout(spec, self.cluster.world_size)
        self._state = _State(spec=spec)
        self._reference = []
        results = self.cluster.run(remote_run.build_run, asdict(spec), timeout=self.timeout)
        self._state.phases = list(results[0]["phases"])
        self._absorb(results)
        self.built = True

    def _ensure_built(self) -> None:
        if not self.built:
            self.build()

    def phase(self, count: int = 1) -> list[Event]:
        """Advance every rank by ``count`` phases; returns the new events."""
        self._ensure_built()
        return self._call(remote_run.run_phases, count)

    def step(self, count: int = 1) -> list[Event]:
        """Finish the current step (and ``count - 1`` more) on every rank; new events."""
        self._ensure_built()
        return self._call(remote_run.run_steps, count)

    def run(
        self,
        count: int,
        *,
        on_step: Callable[[int, int], None] | None = None,
        should_stop: Callable[[], bool] | None = None,
    ) -> int:
        """Run ``count`` whole steps one at a time; returns how many ran (Pause stops early)."""
        done = 0
        for _ in range(count):
            if should_stop is not None and should_stop():
                break
            self.step(1)
            done += 1
            if on_step is not None:
                on_step(done, count)
        return done

    def reset(self) -> None:
        """Back to step 0 with fresh weights and empty records (same options)."""
        self.build()

    def close(self) -> None:
        if self.built and self.cluster.state == "running":
            self.cluster.run(remote_run.close_run, timeout=60)
        self.built = False

    def reference_losses(self, steps: int | None = None) -> list[float]:
        """Single-device losses on the same global batches (computed on rank 0's engine)."""
        steps = self.step_index if steps is None else steps
        if len(self._reference) < steps:
            # Compute ahead so a long Run N does not recompute the reference every refresh.
            ahead = max(steps, 2 * len(self._reference), 8)
            self._reference = self.cluster.run(
                remote_run.run_reference,
                asdict(self.spec),
                ahead,
                ranks=[0],
                timeout=self.timeout,
            )[0]
        return self._reference[:steps]

    def export_trace(self, path: str | Path) -> Path:
        """Write every rank's events as a Perfetto / Chrome trace JSON file."""
        out = Path(path)
        to_perfetto(self._state.events, out)
        return out

    # -- internals -----------------------------------------------------------------------
    def _call(self, fn: Callable[..., dict[str, Any]], count: int) -> list[Event]:
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ConfigError(f"count={count!r} is not valid; it must be an integer >= 1")
        ranks = sorted(self._state.status) or list(range(self.cluster.world_size))
        cursors = {r: self._state.cursors.get(r, 0) for r in ranks}
        # Each rank gets its own cursor: one call per rank, dispatched concurrently.
        client = self.cluster.client
        futures = [
            client[self.cluster.ranks[r].engine_id].apply_async(fn, count, cursors[r])
            for r in ranks
        ]
        results = self.cluster.collect(
            [self.cluster.ranks[r] for r in ranks], futures, self.timeout
        )
        return self._absorb(results)

    def _absorb(self, results: list[dict[str, Any]]) -> list[Event]:
        new: list[Event] = []
        for rank, result in enumerate(results):
            status = self._state.status.setdefault(rank, RankStatus(rank=rank))
            status.step = int(result["step"])
            status.next_phase = str(result["next_phase"])
            status.loss = result["loss"]
            status.error = None
            self._state.cursors[rank] = int(result["cursor"])
            new.extend(from_record(r) for r in result["records"])
        self._state.events.extend(new)
        for listener in list(self._listeners):
            listener(new)
        return new
