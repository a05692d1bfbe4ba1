"""``TrainingSession``: the client side of the step machine. Dispatches phases and steps
to every rank at once, keeps one cursor per rank so each call returns only new events, and
keeps all events in rank order for figures and export. No widgets: the stepper is a view.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from workbench import validate
from workbench.cluster.cluster import Cluster
from workbench.cluster.state import ClusterState
from workbench.config import MAX_ENGINES
from workbench.engine import train_run
from workbench.errors import (
    CheckpointError,
    ClusterError,
    CollectiveTimeout,
    ConfigError,
    EngineDied,
    HostLost,
    RankError,
)
from workbench.parallel.run_spec import RunSpec
from workbench.session.elastic_run import check_resizable, resized_spec, usable_after_loss
from workbench.session.rank_failures import closed_group, error_fields, rank_failure
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
            train_run.build_run, asdict(spec), self.autosave_settings(), asdict(self._store.policy)
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
            message = self._roll_back()
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
                self.step_toward(target)
            except (EngineDied, CollectiveTimeout):
                if not recover or recoveries >= max_recoveries:
                    raise
                recoveries += 1
                self.recover()
                continue
            done += 1
            if on_step is not None:
                on_step(min(done, count), count)
        if self.step_index < target:  # paused: the window's detail went out as rows
            self.fill_window()
        return done

    def step_toward(self, target: int) -> list[Event]:
        """One whole step of a run that ends at step ``target`` (``run`` and the widget's
        Run N): the steps that will have left the recent window by then and that the
        policy does not keep come back from the engines as one summary row each, not as
        events. Call ``fill_window()`` when the run stops before ``target``."""
        self._ensure_built()
        return self._call(train_run.run_steps_toward, 1, target - self._store.policy.recent - 1)

    def fill_window(self) -> None:
        """After a run stopped before its target (Pause): the detail of its last steps went
        out as rows; fetch it back from the engines (each keeps the policy's last
        ``recent`` such steps). Nothing to do when the window has its detail."""
        recent = self._store.policy.recent
        last = self.step_index - 1
        kept = set(self._store.window_steps())
        missing = [s for s in range(max(last - recent + 1, 0), last + 1) if s not in kept]
        if not self.built or not recent or not missing:
            return
        results = self.cluster.run(
            train_run.recent_detail, missing[0], ranks=self.run_ranks, timeout=self.timeout
        )
        self._store.add_detail([from_record(r) for res in results for r in res["records"]])

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
        cluster = self.cluster
        shrink = self.elastic if shrink is None else validate.boolean("shrink", shrink)
        started = time.perf_counter()
        if shrink and cluster.state == ClusterState.DEGRADED:  # go on with the ranks left
            message = self._shrink_and_roll_back()
        else:
            cluster_report = ""
            if (
                cluster.state == ClusterState.DEGRADED
                or cluster.stuck_ranks
                or cluster.group_closed
            ):
                cluster_report = str(cluster.recover_sync())  # also re-opens the process group
            message = self._roll_back() + (f"; {cluster_report}" if cluster_report else "")
        # the whole way back to training, checkpoint loaded: what a fault's cost counts
        cluster.timings["recover_and_roll_back_s"] = time.perf_counter() - started
        self.last_recovery = message
        return message

    def grow(self, n: int = 1, *, hosts: object = None) -> str:
        """Add ``n`` ranks (on ``hosts`` when given) at a checkpoint boundary (saved now unless
        the last one is at this step) and continue at the bigger world size with the same
        global batch: the inverse of a shrink (``elastic_run.py`` says how the layout
        changes). Returns (and keeps in ``last_recovery``) what was done."""
        from workbench.cluster.hosts.host_placement import check_hosts

        validate.integer("n", n, minimum=1, maximum=MAX_ENGINES, what="a number of ranks to add")
        if hosts is not None:  # before the checkpoint below: a bad value changes nothing
            hosts = check_hosts("hosts", hosts, self.cluster.config.launcher)
        check_resizable(self.spec, "grow()")
        cluster = self.cluster
        if self.checkpoint_dir is None:
            raise ConfigError(
                "grow() adds ranks at a checkpoint boundary and this session has no "
                "checkpoint_dir; make it with TrainingSession(..., checkpoint_dir=...)"
            )
        world, spec = cluster.world_size, self.spec
        if self.built and self.next_phase != (self.phases or ["data"])[0]:
            raise ConfigError(
                f"grow() waits for a step boundary; the run is part-way through step "
                f"{self.step_index} (next phase {self.next_phase!r}): finish it with step()"
            )
        saved = [m["step"] for m in self.checkpoints()]
        if self.built and (not saved or saved[-1] != self.step_index):
            self.save()  # the checkpoint boundary the new ranks start from
        report = cluster.grow_sync(n, hosts=hosts)
        base = self._elastic_base
        if base is not None and base[1] == cluster.world_size:
            new_spec, note = base[0], "back to the spec the run started with"
            self._elastic_base = None
        else:
            new_spec, note = resized_spec(spec, world, cluster.world_size)
        why = f"grown from {world} to {cluster.world_size} ranks ({report}); {note}"
        self.last_recovery = self._resize_and_roll_back(new_spec, why)
        return self.last_recovery

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
    def _call(self, fn: Callable[..., dict[str, Any]], count: int, *more: Any) -> list[Event]:
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ConfigError(f"count={count!r} is not valid; it must be an integer >= 1")
        if self._interrupted:
            raise ClusterError(
                "the last step was interrupted part-way on the engines; roll back with "
                "`session.recover()` / `%wb restart` (to the last checkpoint) or reset()"
            )
        results = self._call_each(fn, count, *more)  # raises when an autosave failed
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
            raise type(exc)(f"{exc}\n{self._where_the_run_was(exc)}", **error_fields(exc)) from None
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
        if fn not in (train_run.run_steps, train_run.run_phases, train_run.run_steps_toward):
            self._absorb(results)
        return results

    def drop_events_from(self, step: int) -> None:
        """A roll-back: events of step ``step`` and later did not happen any more."""
        self._store.drop_from(step)

    def _absorb(self, results: list[dict[str, Any]], *, keep: bool = True) -> list[Event]:
        new: list[Event] = []
        rows: list[dict[str, Any]] = []  # summary rows of steps sent without their detail
        for rank, result in enumerate(results):
            status = self._state.status.setdefault(rank, RankStatus(rank=rank))
            status.step = int(result["step"])
            status.next_phase = str(result["next_phase"])
            status.loss = result["loss"]
            status.error = None
            self._state.cursors[rank] = int(result["cursor"])
            new.extend(from_record(r) for r in result["records"])
            rows.extend(result.get("rows") or ())
        if keep:
            self._store.add_rows(rows)
            self._store.add(new)
        for listener in list(self._listeners):
            listener(new)
        return new

    # -- roll-backs and resizes (the run rebuilt after a failure or at a new world size) ---
    def _roll_back(self) -> str:
        """Rebuild the run on every rank and load the last checkpoint (fresh weights
        without one); says what was rolled back to where."""
        statuses = self.status
        before = max((st.step for st in statuses), default=0)
        first = self.phases[0] if self.phases else "data"
        # Read now: rebuilding below resets every rank's status.
        partial = any(st.next_phase != first for st in statuses)
        self.build_remote(self.spec, keep_events=False)
        available = self.checkpoints() if self.checkpoint_dir is not None else []
        if available:
            meta = self.load()
            to = f"the checkpoint of step {meta['step']}"
            step = int(meta["step"])
        else:
            self.drop_events_from(0)
            to = "step 0 (no checkpoint: fresh weights)"
            step = 0
        lost = max(before - step, 0)
        redone = f"{lost} completed step(s)" + (" and the step in progress" if partial else "")
        return f"rolled back from step {before} to {to}; {redone} will be redone"

    def _where_the_run_was(self, error: BaseException | None = None) -> str:
        """Where every rank was and the last checkpoint: the context of a dead engine or a
        hang (``error``). The checkpoints are listed by rank 0 unless it stays blocked in a
        collective (on a lost host's ranks it waits until the group's timeout)."""
        statuses = self.status
        where = ", ".join(f"rank {s.rank} at step {s.step} (next {s.next_phase})" for s in statuses)
        saved = ""
        grace = 0.0 if isinstance(error, HostLost) else 2.0
        if 0 in self.cluster.dispatch.stuck.still_pending(grace):
            saved = "; checkpoints not listed (rank 0 is still blocked in a collective)"
        elif self.checkpoint_dir is not None:
            try:
                found = self.checkpoints()
            except Exception:
                found = None
            if found:
                saved = f"; last checkpoint: step {found[-1]['step']}"
            elif found is not None:
                saved = "; no checkpoint yet"
        return (
            f"The run had completed {self.step_index} step(s) ({where}){saved}. Resume with "
            "`%wb restart` or session.recover(): it rolls back to the last checkpoint."
        )

    def _shrink_and_roll_back(self) -> str:
        """Drop the lost ranks (and survivors the layout cannot use), re-form the group at
        the smaller world size, rebuild the run there and load the last checkpoint."""
        check_resizable(self.spec, "a shrink")
        cluster = self.cluster
        world, spec = cluster.world_size, self.spec
        dead = cluster.lost_ranks()
        orphans = usable_after_loss(spec, world, dead)  # before anything is changed
        new_spec, note = resized_spec(spec, world, world - len(dead) - len(orphans))
        if self._elastic_base is None:  # what a grow back to this size restores
            self._elastic_base = (spec, world)
        report = cluster.recover_sync(shrink=True, drop=tuple(orphans))
        why = f"shrunk from {world} to {cluster.world_size} ranks ({report}); {note}"
        return self._resize_and_roll_back(new_spec, why)

    def _resize_and_roll_back(self, spec: RunSpec, why: str) -> str:
        """Rebuild the run on the cluster's current ranks under ``spec`` and load the last
        checkpoint into it (DCP reshards it to the new layout); says what was done."""
        world, old = self.cluster.world_size, self._state
        # the old ranks' statuses and cursors go with the old world; _roll_back reads the
        # step reached from the survivors' before it rebuilds
        survivors = {r: s for r, s in old.status.items() if r < world}
        self._state = RunState(spec=spec, phases=old.phases, status=survivors)
        self._reference = []
        return f"{why}; {self._roll_back()}"
