"""``TrainingSession``: the client side of the step machine. Dispatches phases and steps
to every rank at once, keeps one cursor per rank so each call returns only new events, and
keeps all events in rank order for figures and export. No widgets: the stepper is a view.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from workbench import validate
from workbench.cluster.cluster import Cluster
from workbench.cluster.state import ClusterState
from workbench.engine import train_run
from workbench.errors import (
    CheckpointError,
    ClusterError,
    CollectiveTimeout,
    ConfigError,
    EngineDied,
    RankError,
)
from workbench.parallel.run_spec import RunSpec
from workbench.session.elastic_run import session_grow
from workbench.session.rank_failures import closed_group, error_fields, rank_failure
from workbench.session.roll_back import recover_and_roll_back, roll_back, where_the_run_was
from workbench.session.run_state import (
    Listener,
    RankStatus,
    RunState,
    autosave_settings,
    check_checkpoint_options,
    checkpoint_root,
    validate_layout,
)
from workbench.trace import Event, from_record, to_perfetto
from workbench.trace.policy import RecordPolicy, record_policy
from workbench.trace.store import EventStore

__all__ = ["RankStatus", "TrainingSession", "validate_layout"]  # re-exported for the stepper


class TrainingSession:
    """Build a run on every rank and advance it by phases or steps."""

    def __init__(
        self,
        cluster: Cluster,
        spec: RunSpec,
        *,
        timeout: float | None = 300.0,
        checkpoint_dir: str | Path | None = None,
        checkpoint_every: int | None = None,
        keep_last: int | None = 3,
        checkpoint_key: bytes | None = None,
        elastic: bool = False,
        record: RecordPolicy | str | None = None,
        run_dir: str | Path | None = None,
    ) -> None:
        check_checkpoint_options(checkpoint_dir, checkpoint_every, keep_last, checkpoint_key)
        # Summaries of every step, detail as ``record`` says; an unwritable run_dir fails
        # here, before anything is built.
        self._store = EventStore(run_dir, record_policy(record))
        self.elastic = validate.boolean("elastic", elastic)  # lost ranks: go on without them
        self._elastic_base: tuple[RunSpec, int] | None = None  # spec and size before a shrink
        self.cluster = cluster
        self.timeout = timeout
        self.checkpoint_dir = (
            None if checkpoint_dir is None else str(Path(checkpoint_dir).absolute())
        )
        self.checkpoint_every = checkpoint_every
        self.keep_last = keep_last
        # Signs checkpoints' manifests; default: the per-user key file (checkpoint.trust).
        self.checkpoint_key = checkpoint_key
        self.last_recovery: str | None = None  # what the last recovery rolled back
        self._interrupted = False
        # The engines (id, pid, rendezvous port) the run was built on: when they change
        # (a restart, a recovery) the run is gone from the engines and is rebuilt.
        self._built_on: tuple[tuple[int, int, int], ...] = ()
        self._state = RunState(spec=spec)
        self._listeners: list[Listener] = []
        self._reference: list[float] = []
        self.built = False

    def __repr__(self) -> str:
        s, steps = self._state, {st.step for st in self._state.status.values()} or {0}
        return (
            f"<TrainingSession strategy={s.spec.strategy!r} model={s.spec.model!r} "
            f"ranks={self.cluster.world_size} step={max(steps)} "
            f"events={len(self._store)}>"
        )

    # -- state ---------------------------------------------------------------------------
    @property
    def spec(self) -> RunSpec:
        return self._state.spec

    @property
    def run_ranks(self) -> list[int]:
        """Where the run lives: rank 0 for ``single`` (one device on any cluster), else all."""
        return [0] if self.spec.strategy == "single" else list(range(self.cluster.world_size))

    @property
    def phases(self) -> list[str]:
        return list(self._state.phases)

    @property
    def events(self) -> list[Event]:
        """The events kept in detail (the recording policy's steps), oldest first."""
        return self._store.events()

    @property
    def store(self) -> EventStore:
        """The run's summaries and recorded detail (read-only use: figures, export)."""
        return self._store

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
            validate.option_names("rebuild", changes, asdict(self._state.spec))
            spec = replace(self._state.spec, **changes)
        else:
            spec = self._state.spec
        validate_layout(spec, self.cluster.world_size)
        self._state = RunState(spec=spec)
        self._store.clear()
        self._reference = []
        self.build_remote(spec)

    def autosave_settings(self) -> dict[str, Any] | None:
        """What the engines need to checkpoint every ``checkpoint_every`` steps, or None."""
        dir_, every, keep = self.checkpoint_dir, self.checkpoint_every, self.keep_last
        return autosave_settings(dir_, every, keep, self._key)

    def build_remote(self, spec: RunSpec, *, keep_events: bool = True) -> None:
        results = self._build_on_engines(
            train_run.build_run, asdict(spec), self.autosave_settings()
        )
        self._built(results, keep_events=keep_events)

    def _build_on_engines(self, fn: Callable[..., Any], *args: Any) -> list[dict[str, Any]]:
        """Run a build on every rank; a rank-local failure closes the group on every rank
        (``fail_together``), so the next build re-creates it first."""
        if self._regroup:  # a failed rank closed the process group: a fresh one first
            self.cluster.recover_sync()
            self._regroup = False
        try:
            return self.cluster.run(fn, *args, ranks=self.run_ranks, timeout=self.timeout)
        except RankError as exc:
            self._regroup = closed_group(exc)
            self.built = False
            raise rank_failure(exc, self._state.status, self.cluster) from None

    @property
    def _regroup(self) -> bool:
        """A failing rank closed the group (kept on the cluster: every session regroups)."""
        return self.cluster.group_closed

    @_regroup.setter
    def _regroup(self, value: bool) -> None:
        self.cluster.group_closed = value

    def adopt(self, results: list[dict[str, Any]]) -> None:
        """Take up the run the engines already hold (``train_run.describe_run`` of each
        run rank, in rank order): its phases, where each rank stands and the events they still
        hold, as if this session had built it (``Stepper.attach``)."""
        self._state = RunState(spec=self._state.spec)
        self._built(results, keep_events=True)

    def _built(self, results: list[dict[str, Any]], *, keep_events: bool) -> None:
        """Once every rank built: phases, cursors, baseline events, the engines holding it."""
        self._state.phases = list(results[0]["phases"])
        self._state.cursors = {}
        # A rebuild for a roll-back: its baseline samples are not news.
        self._absorb(results, keep=keep_events)
        self._interrupted = False
        self.built = True
        self._built_on = self._engines()

    def _engines(self) -> tuple[tuple[int, int, int], ...]:
        return tuple((r.engine_id, r.pid, r.master_port) for r in self.cluster.ranks)

    def _ensure_built(self) -> None:
        if not self.built:
            self.build()
        elif self._engines() != self._built_on:
            # restarted or recovered since the run was built: the run is gone from the
            # engines (which have a fresh process group); rebuild it from its last checkpoint
            self._regroup = self._interrupted = False
            message = roll_back(self)
            self.last_recovery = f"the cluster was restarted since the run was built: {message}"

    def phase(self, count: int = 1) -> list[Event]:
        """Advance every rank by ``count`` phases; returns the new events."""
        self._ensure_built()
        return self._call(train_run.run_phases, count)

    def step(self, count: int = 1) -> list[Event]:
        """Finish the current step (and ``count - 1`` more) on every rank; new events."""
        self._ensure_built()
        return self._call(train_run.run_steps, count)

    def run(
        self,
        count: int,
        *,
        on_step: Callable[[int, int], None] | None = None,
        should_stop: Callable[[], bool] | None = None,
        recover: bool = False,
        max_recoveries: int = 3,
    ) -> int:
        """Run ``count`` whole steps one at a time; returns how many ran (Pause stops early).

        With ``recover=True`` a dead engine or a hung collective is recovered from
        automatically (``recover()``: replace, re-create the group, roll back to the last
        checkpoint) and the run continues until the step it was asked to reach; the
        roll-back is kept in ``last_recovery``. Steps redone after a roll-back are counted.
        """
        target = self.step_index + count  # 0 when not built yet: step() builds
        done = recoveries = 0
        while self.step_index < target:
            if should_stop is not None and should_stop():
                break
            try:
                self.step(1)
            except (EngineDied, CollectiveTimeout):
                if not recover or recoveries >= max_recoveries:
                    raise
                recoveries += 1
                self.recover()
                continue
            done += 1
            if on_step is not None:
                on_step(min(done, count), count)
        return done

    # -- checkpoints ---------------------------------------------------------------------
    def _key(self) -> bytes:
        # Read here (the kernel's host) and handed to every rank, so all sign and check with
        # one key; checked (owner, mode) at every save and load, never cached.
        if self.checkpoint_key is not None:
            return self.checkpoint_key
        from workbench.parallel.checkpoint.trust import checkpoint_key

        return checkpoint_key()

    def save(self, path: str | Path | None = None, *, keep_last: int | None = None) -> str:
        """Checkpoint every rank (DCP, sharded as the strategy shards) at a step boundary;
        returns the checkpoint directory. Default root: ``checkpoint_dir``."""
        self._ensure_built()
        root = checkpoint_root(path, self.checkpoint_dir)
        results = self._call_each(
            train_run.save_run,
            root,
            keep_last if keep_last is not None else self.keep_last,
            self._key(),
        )
        return str(results[0]["path"])

    def load(self, step: int | None = None, *, path: str | Path | None = None) -> dict[str, Any]:
        """Load a checkpoint (default: the newest) into the run on every rank, under this
        session's layout (DCP reshards); events after its step are dropped. Returns its
        metadata."""
        self._ensure_built()
        root = checkpoint_root(path, self.checkpoint_dir)
        results = self._call_each(train_run.load_run, root, step, self._key(), rebuild_events=True)
        return dict(results[0]["meta"])

    def checkpoints(self, path: str | Path | None = None) -> list[dict[str, Any]]:
        """Complete checkpoints under the root, oldest first (read on rank 0's host)."""
        root = checkpoint_root(path, self.checkpoint_dir)
        try:
            metas = self.cluster.run(train_run.list_run_checkpoints, root, ranks=[0], timeout=60)[0]
        except EngineDied:  # rank 0 is gone: read the directory from here
            from workbench.parallel.checkpoint import list_checkpoints

            metas = list_checkpoints(root)
        return [{k: v for k, v in m.items() if k != "spec"} for m in metas]

    def recover(self, shrink: bool | None = None) -> str:
        """After a dead engine or a hang: replace dead or stuck engines (``shrink``, default
        ``elastic``: go on without the dead ones), re-create the group, rebuild the run, load
        the last checkpoint. Returns (and keeps in ``last_recovery``) what was done."""
        self.last_recovery = recover_and_roll_back(self, shrink)
        return self.last_recovery

    grow = session_grow  # add ranks at a checkpoint boundary (``elastic_run.py``)

    def reset(self) -> None:
        """Back to step 0 with fresh weights and empty records (same options)."""
        self.build()

    def close(self) -> None:
        if (
            self.built
            and self.cluster.state == ClusterState.RUNNING
            and not self.cluster.stuck_ranks
        ):
            self.cluster.run(train_run.close_run, ranks=self.run_ranks, timeout=60)
        self.built = False

    def reference_losses(self, steps: int | None = None) -> list[float]:
        """Single-device losses on the same global batches (computed on rank 0's engine)."""
        steps = self.step_index if steps is None else steps
        if len(self._reference) < steps:
            # Compute ahead so a long Run N does not recompute the reference every refresh.
            ahead = max(steps, 2 * len(self._reference), 8)
            self._reference = self.cluster.run(
                train_run.run_reference, asdict(self.spec), ahead, ranks=[0], timeout=self.timeout
            )[0]
        return self._reference[:steps]

    def export_trace(self, path: str | Path) -> Path:
        """Write every rank's events as a Perfetto / Chrome trace JSON file."""
        out = Path(path)
        to_perfetto(self._store.events(), out)
        return out

    # -- internals -----------------------------------------------------------------------
    def _call(self, fn: Callable[..., dict[str, Any]], count: int) -> list[Event]:
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ConfigError(f"count={count!r} is not valid; it must be an integer >= 1")
        if self._interrupted:
            raise ClusterError(
                "the last step was interrupted part-way on the engines; roll back with "
                "`session.recover()` / `%wb restart` (to the last checkpoint) or reset()"
            )
        results = self._call_each(fn, count)  # raises when an automatic checkpoint failed
        return self._absorb(results)

    def _call_each(self, fn: Callable[..., Any], *args: Any, rebuild_events: bool = False) -> Any:
        """Call ``fn(*args, cursor)`` on every rank with its own cursor, concurrently.

        A dead engine or a hang is re-raised with what the run was doing."""
        if self._regroup:
            raise ClusterError(
                "a rank failed part-way through the last call and closed the process group "
                "on every rank, so that none waits for it; roll back with session.recover() "
                "/ `%wb restart` (to the last checkpoint) or start over with reset()"
            )
        ranks = sorted(self._state.status) or self.run_ranks
        cursors = {r: self._state.cursors.get(r, 0) for r in ranks}
        self.cluster.client  # noqa: B018  (fails fast when the controller died or stopped)
        args = {r: (*args, cursors[r]) for r in ranks}
        try:  # a dead engine, also one that dies while it runs, is EngineDied
            by_rank = self.cluster.dispatch.run_each(fn, args, self.timeout, fail_together=True)
        except KeyboardInterrupt:
            self._interrupted = True
            raise
        except (EngineDied, CollectiveTimeout) as exc:
            raise type(exc)(f"{exc}\n{where_the_run_was(self, exc)}", **error_fields(exc)) from None
        except RankError as exc:
            self._regroup = closed_group(exc)  # the failing rank closed it (fail_together)
            raise rank_failure(exc, self._state.status, self.cluster) from None
        results = [by_rank[r] for r in ranks]
        errors = [r for r in results if r.get("error")] if isinstance(results[0], dict) else []
        if errors:  # every rank agreed on a failed save / load (also an automatic one after
            # a step): the run is as it was, with the steps it completed
            self._absorb(results)
            raise CheckpointError(str(errors[0]["error"]), ranks=errors[0].get("failed_ranks"))
        if rebuild_events:
            step = int(results[0]["step"])
            self.drop_events_from(step)
        if fn is not train_run.run_steps and fn is not train_run.run_phases:
            self._absorb(results)
        return results

    def drop_events_from(self, step: int) -> None:
        """A roll-back: events of step ``step`` and later did not happen any more."""
        self._store.drop_from(step)

    def _absorb(self, results: list[dict[str, Any]], *, keep: bool = True) -> list[Event]:
        new: list[Event] = []
        for rank, result in enumerate(results):
            status = self._state.status.setdefault(rank, RankStatus(rank=rank))
            status.step = int(result["step"])
            status.next_phase = str(result["next_phase"])
            status.loss = result["loss"]
            status.error = None
            self._state.cursors[rank] = int(result["cursor"])
            new.extend(from_record(r) for r in result["records"])
        if keep:
            self._store.add(new)
        for listener in list(self._listeners):
            listener(new)
        return new
