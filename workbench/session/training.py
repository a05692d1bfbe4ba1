"""``TrainingSession``: the client side of the step machine.

Dispatches phases and steps to every rank at once, keeps one cursor per rank so each call
returns only new events, and keeps all events in rank order for figures and export. Plain
object, no widgets: the stepper widget is a view over it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from workbench.cluster.cluster import Cluster
from workbench.engine import train_run
from workbench.errors import (
    CheckpointError,
    ClusterError,
    CollectiveTimeout,
    ConfigError,
    EngineDied,
    RankError,
)
from workbench.parallel.models import get_config
from workbench.parallel.spec import RunSpec
from workbench.trace import Event, from_record, to_perfetto

__all__ = ["RankStatus", "TrainingSession", "validate_layout"]


# After one rank failed, how long the ranks still running get to finish (a peer freed by the
# failed rank's teardown fails within milliseconds) before they are reported as waiting.
PEER_GRACE_S = 3.0
# A rank that lost its connection to a peer may have lost it to a dead engine: how long the
# controller gets to report that death (ms on one host; the nanny's word travels further).
DEATH_NOTICE_S = 10.0
_LOST_PEER = ("Connection closed by peer", "Connection reset by peer")


def _raised(future: Any) -> bool:
    """A finished remote call that raised (a dead engine is collect()'s business)."""
    try:
        future.get(0)
    except Exception as exc:
        return getattr(exc, "ename", "") != "EngineError"
    return False


def _remote_failure(future: Any) -> str:
    from workbench.cluster.results import format_remote

    try:
        future.get(0)
    except Exception as exc:
        return format_remote(exc)
    return "?"


def _error_fields(exc: Exception) -> dict[str, Any]:
    if isinstance(exc, EngineDied):
        return {"ranks": exc.ranks}
    if isinstance(exc, CollectiveTimeout):
        return {"report": exc.report}
    return {}


Listener = Callable[[list[Event]], None]


def _closed_group(exc: RankError) -> bool:
    """Whether a rank's failure closed the process group (``fail_together`` raises these
    two on every rank); a plain error on every rank leaves the group as it was."""
    return (
        any("RankFailed" in text or "PeerFailed" in text for text in (exc.failures or {}).values())
        or "RankFailed" in str(exc)
        or "PeerFailed" in str(exc)
    )


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
    ) -> None:
        if checkpoint_every is not None and (
            isinstance(checkpoint_every, bool)
            or not isinstance(checkpoint_every, int)
            or checkpoint_every < 1
        ):
            raise ConfigError(
                f"checkpoint_every={checkpoint_every!r} is not valid; it must be an integer "
                ">= 1 or None (no automatic checkpoints)"
            )
        if checkpoint_key is not None and (
            not isinstance(checkpoint_key, bytes) or len(checkpoint_key) < 16
        ):
            raise ConfigError(
                "checkpoint_key must be bytes of at least 16 (random) bytes, or None for the "
                "per-user key file"
            )
        if checkpoint_every is not None and checkpoint_dir is None:
            raise ConfigError("checkpoint_every needs checkpoint_dir= (where to write them)")
        if keep_last is not None and (
            isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 1
        ):
            raise ConfigError(f"keep_last={keep_last!r} is not valid; use an integer >= 1 or None")
        self.cluster = cluster
        self.timeout = timeout
        self.checkpoint_dir = (
            None if checkpoint_dir is None else str(Path(checkpoint_dir).absolute())
        )
        self.checkpoint_every = checkpoint_every
        self.keep_last = keep_last
        # Signs checkpoints' manifests; default: the per-user key file (checkpoint_trust).
        self.checkpoint_key = checkpoint_key
        self.last_recovery: str | None = None  # what the last recovery rolled back
        self._interrupted = False
        # A rank failed part-way and closed the process group on every rank (see
        # fail_together): it is re-created before the run is rebuilt.
        # The engines (id, pid, rendezvous port) the run was built on: when they change
        # (a restart, a recovery) the run is gone from the engines and is rebuilt.
        self._built_on: tuple[tuple[int, int, int], ...] = ()
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
        self._build_remote(spec)

    def _build_remote(self, spec: RunSpec, *, keep_events: bool = True) -> None:
        results = self._build_on_engines(train_run.build_run, asdict(spec), self._autosave())
        self._built(results, keep_events=keep_events)

    def _autosave(self) -> dict[str, Any] | None:
        """What the engines need to checkpoint every ``checkpoint_every`` steps, or None."""
        if self.checkpoint_every is None or self.checkpoint_dir is None:
            return None
        return {
            "root": self.checkpoint_dir,
            "every": self.checkpoint_every,
            "keep_last": self.keep_last,
            "key": self._key(),
        }

    def _build_on_engines(self, fn: Callable[..., Any], *args: Any) -> list[dict[str, Any]]:
        """Run a build on every rank; a rank-local failure closes the group on every rank
        (``fail_together``), so the next build re-creates it first."""
        if self._regroup:  # a failed rank closed the process group: a fresh one first
            self.cluster.recover_sync()
            self._regroup = False
        try:
            return self.cluster.run(fn, *args, timeout=self.timeout)
        except RankError as exc:
            self._regroup = _closed_group(exc)
            self.built = False
            raise self._rank_failure(exc) from None

    @property
    def _regroup(self) -> bool:
        """The cluster's process group was closed by a failing rank: kept on the cluster,
        so every session (and a new one) re-creates the group before its next build."""
        return self.cluster.group_closed

    @_regroup.setter
    def _regroup(self, value: bool) -> None:
        self.cluster.group_closed = value

    def _built(self, results: list[dict[str, Any]], *, keep_events: bool) -> None:
        """Bookkeeping once every rank built its run: phases, cursors, the baseline events
        and which engines hold the run (a restart since then means rebuilding)."""
        self._state.phases = list(results[0]["phases"])
        self._state.cursors = {}
        before = len(self._state.events)
        self._absorb(results)
        if not keep_events:  # a rebuild for a roll-back: its baseline samples are not news
            del self._state.events[before:]
        self._interrupted = False
        self.built = True
        self._built_on = self._engines()

    def _engines(self) -> tuple[tuple[int, int, int], ...]:
        return tuple((r.engine_id, r.pid, r.master_port) for r in self.cluster.ranks)

    def _ensure_built(self) -> None:
        if not self.built:
            self.build()
        elif self._engines() != self._built_on:
            self._resume_on_new_engines()

    def _resume_on_new_engines(self) -> None:
        """The cluster was restarted (or recovered) since the run was built, so the run
        is gone from the engines: rebuild it from its spec and its last checkpoint."""
        self._regroup = False  # the new engines have a fresh process group
        self._interrupted = False
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
        """This user's checkpoint key, read here (the kernel's host) and handed to every
        rank, so engines on other hosts sign and check with the same key."""
        if self.checkpoint_key is None:
            from workbench.parallel.checkpoint_trust import checkpoint_key

            self.checkpoint_key = checkpoint_key()
        return self.checkpoint_key

    def _root(self, path: str | Path | None) -> str:
        root = path if path is not None else self.checkpoint_dir
        if root is None:
            raise ConfigError(
                "no checkpoint directory: pass one (save('ckpt')) or create the session "
                "with checkpoint_dir="
            )
        return str(Path(root).absolute())

    def save(self, path: str | Path | None = None, *, keep_last: int | None = None) -> str:
        """Checkpoint every rank (DCP, sharded as the strategy shards) at a step boundary;
        returns the checkpoint directory. Default root: ``checkpoint_dir``."""
        self._ensure_built()
        root = self._root(path)
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
        root = self._root(path)
        results = self._call_each(train_run.load_run, root, step, self._key(), rebuild_events=True)
        return dict(results[0]["meta"])

    def checkpoints(self, path: str | Path | None = None) -> list[dict[str, Any]]:
        """Complete checkpoints under the root, oldest first (read on rank 0's host)."""
        root = self._root(path)
        try:
            metas = self.cluster.run(train_run.list_run_checkpoints, root, ranks=[0], timeout=60)[0]
        except EngineDied:  # rank 0 is gone: read the directory from here
            from workbench.parallel.checkpoint import list_checkpoints

            metas = list_checkpoints(root)
        return [{k: v for k, v in m.items() if k != "spec"} for m in metas]

    def recover(self) -> str:
        """After a dead engine or a hung collective: recover the cluster (replace dead or
        stuck engines, re-create the process group), rebuild the run on every rank and
        load the last checkpoint. Returns (and keeps in ``last_recovery``) what was
        rolled back to where."""
        cluster_report = ""
        if self.cluster.state == "degraded" or self.cluster.stuck_ranks or self._regroup:
            cluster_report = str(self.cluster.recover_sync())
            self._regroup = False
        message = self._roll_back() + (f"; {cluster_report}" if cluster_report else "")
        self.last_recovery = message
        return message

    def _roll_back(self) -> str:
        """Rebuild the run on every rank and load the last checkpoint (fresh weights
        without one); says what was rolled back to where."""
        statuses = self.status
        before = max((st.step for st in statuses), default=0)
        first = self.phases[0] if self.phases else "data"
        # Read now: rebuilding below resets every rank's status.
        partial = any(st.next_phase != first for st in statuses)
        self._build_remote(self.spec, keep_events=False)
        available = self.checkpoints() if self.checkpoint_dir is not None else []
        if available:
            meta = self.load()
            to = f"the checkpoint of step {meta['step']}"
            step = int(meta["step"])
        else:
            self._drop_events_from(0)
            to = "step 0 (no checkpoint: fresh weights)"
            step = 0
        lost = max(before - step, 0)
        redone = f"{lost} completed step(s)" + (" and the step in progress" if partial else "")
        return f"rolled back from step {before} to {to}; {redone} will be redone"

    def reset(self) -> None:
        """Back to step 0 with fresh weights and empty records (same options)."""
        self.build()

    def close(self) -> None:
        if self.built and self.cluster.state == "running" and not self.cluster.stuck_ranks:
            self.cluster.run(train_run.close_run, timeout=60)
        self.built = False

    def reference_losses(self, steps: int | None = None) -> list[float]:
        """Single-device losses on the same global batches (computed on rank 0's engine)."""
        steps = self.step_index if steps is None else steps
        if len(self._reference) < steps:
            # Compute ahead so a long Run N does not recompute the reference every refresh.
            ahead = max(steps, 2 * len(self._reference), 8)
            self._reference = self.cluster.run(
                train_run.run_reference,
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
        ranks = sorted(self._state.status) or list(range(self.cluster.world_size))
        cursors = {r: self._state.cursors.get(r, 0) for r in ranks}
        client = self.cluster.client
        try:
            self.cluster.ensure_alive()
        except EngineDied as exc:
            raise type(exc)(f"{exc}\n{self._context()}", ranks=exc.ranks) from None
        futures = [
            client[self.cluster.ranks[r].engine_id].apply_async(fn, *args, cursors[r])
            for r in ranks
        ]
        targets = [self.cluster.ranks[r] for r in ranks]
        try:
            self._wait_unless_a_rank_failed(targets, futures)
            results = self.cluster.collect(targets, futures, self.timeout)
        except KeyboardInterrupt:
            self._interrupted = True
            raise
        except (EngineDied, CollectiveTimeout) as exc:
            raise type(exc)(f"{exc}\n{self._context()}", **_error_fields(exc)) from None
        except RankError as exc:
            self._regroup = _closed_group(exc)  # the failing rank closed it (fail_together)
            raise self._rank_failure(exc) from None
        errors = [r for r in results if r.get("error")] if isinstance(results[0], dict) else []
        if errors:  # every rank agreed on a failed save / load (also an automatic one after
            # a step): the run is as it was, with the steps it completed
            self._absorb(results)
            raise CheckpointError(str(errors[0]["error"]), ranks=errors[0].get("failed_ranks"))
        if rebuild_events:
            step = int(results[0]["step"])
            self._drop_events_from(step)
        if fn is not train_run.run_steps and fn is not train_run.run_phases:
            self._absorb(results)
        return results

    def _wait_unless_a_rank_failed(self, targets: list[Any], futures: list[Any]) -> None:
        """Return when every rank finished, or raise ``RankError`` soon after one rank
        failed while others still run: those wait in a collective for the failed rank
        (a gloo collective cannot be interrupted), so they are marked stuck for
        ``recover()`` instead of being waited for until the process-group timeout. The
        failed rank has written its error to the store and dropped its group
        (``fail_together``); a peer that this frees finishes within the grace and names it.
        """
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        failed_at: float | None = None
        while True:
            pending = [f for f in futures if not f.ready()]
            now = time.monotonic()
            if not pending or (deadline is not None and now >= deadline):
                return  # collect() gathers the results or reports the timeout
            if failed_at is None and any(_raised(f) for f in futures if f.ready()):
                failed_at = now
            if failed_at is not None and now - failed_at >= PEER_GRACE_S:
                break
            pending[0].wait(0.02)
        failures: dict[int, str] = {}
        waiting: list[int] = []
        for target, future in zip(targets, futures, strict=True):
            if not future.ready():
                waiting.append(target.rank)
            elif _raised(future):
                failures[target.rank] = _remote_failure(future)
        if not failures:  # an engine died meanwhile: collect() reports it
            return
        # "connection closed by peer" on a survivor is also what a killed engine looks like:
        # give the controller time to hear of a death (from the dead engine's nanny, on its
        # own host, across the network) so that the error names the dead engine
        lost = any(m in f for f in failures.values() for m in _LOST_PEER)
        notice = time.monotonic() + (DEATH_NOTICE_S if lost else 0.0)
        while time.monotonic() < notice:
            if any(
                self.cluster._dead_engine(f, t.engine_id)
                for t, f in zip(targets, futures, strict=True)
            ):
                return  # collect() reports EngineDied
            time.sleep(0.05)
        self.cluster._mark_stuck(targets, futures)
        failed = sorted(failures)
        for rank in waiting:
            failures[rank] = (
                f"rank {rank} still waits (in a collective) for rank(s) {failed}, which failed; "
                "session.recover() / `%wb restart` frees it and rolls back to the last checkpoint"
            )
        raise RankError.from_failures(failures)

    def _rank_failure(self, exc: RankError) -> RankError:
        """The ranks' exceptions, headed by where each failing rank was (host, step, phase)."""
        heads = []
        for rank in sorted(exc.failures):
            status = self._state.status.get(rank, RankStatus(rank=rank))
            host = self.cluster.ranks[rank].host if rank < self.cluster.world_size else "?"
            what = "stopped (a peer failed)" if "PeerFailed" in exc.failures[rank] else "failed"
            heads.append(
                f"rank {rank} on {host} {what} in phase {status.next_phase!r} of step {status.step}"
            )
        error = RankError.from_failures(exc.failures)
        error.args = ("; ".join(heads) + "\n" + str(error.args[0]),)
        return error

    def _context(self) -> str:
        statuses = self.status
        where = ", ".join(f"rank {s.rank} at step {s.step} (next {s.next_phase})" for s in statuses)
        saved = ""
        if self.checkpoint_dir is not None:
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

    def _drop_events_from(self, step: int) -> None:
        """A roll-back: events of step ``step`` and later did not happen any more."""
        self._state.events = [e for e in self._state.events if e.step < step]

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
