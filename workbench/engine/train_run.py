"""Engine-side functions that drive a ``TrainStep`` (the stepper's back end).

Each call does its work and piggybacks the events recorded since the client's cursor, so
one round trip both advances the run and returns the increment for the live figures.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from typing import Any, TypeVar

from workbench.engine.fail_together import fail_together
from workbench.engine.state import engine_state
from workbench.errors import CheckpointError, ClusterError

__all__ = [
    "build_run",
    "close_run",
    "list_run_checkpoints",
    "load_run",
    "pull_events",
    "run_phases",
    "run_reference",
    "run_steps",
    "save_run",
]

_RUN = "run"
T = TypeVar("T")
_AUTOSAVE = "autosave"  # {"root": str, "every": int, "keep_last": int | None, "key": bytes}


def _summary(cursor: int) -> dict[str, Any]:
    train_step = _run()
    records, new_cursor = train_step.recorder.records_since(cursor)
    return {
        "step": train_step.step,
        "next_phase": train_step.phase,
        "loss": train_step.last_loss,
        "records": records,
        "cursor": new_cursor,
    }


def _run() -> Any:
    """This rank's training run; a clear error when there is none (a restart or a
    recovery closed it: the session rebuilds it)."""
    train_step = engine_state().get(_RUN)
    if train_step is None:
        raise ClusterError(
            "no training run on this rank (the cluster was restarted or recovered since it "
            "was built); the stepper rebuilds it on its next call, or call session.build()"
        )
    return train_step


def build_run(
    spec_fields: dict[str, Any], autosave: dict[str, Any] | None = None
) -> dict[str, Any]:
    """(Re)build this rank's run from ``RunSpec`` fields; closes any previous run.

    ``autosave`` ({"root", "every", "keep_last", "key"}) checkpoints every ``every`` steps.
    """
    if spec_fields.get("strategy") == "single":  # one rank: no peer waits for it
        return _build_run(spec_fields, autosave)
    return fail_together(_build_run, spec_fields, autosave)


def _build_run(spec_fields: dict[str, Any], autosave: dict[str, Any] | None) -> dict[str, Any]:
    import torch.distributed as dist

    from workbench.engine import flight
    from workbench.parallel import RunSpec, build_train_step
    from workbench.trace import Recorder

    close_run()
    state = engine_state()
    spec = RunSpec(**spec_fields)
    rank = dist.get_rank() if dist.is_initialized() else 0
    recorder = Recorder(rank, clock=state.get("clock"))
    if spec.trace:
        flight.pause_cell_tracer()  # the run's own CommTracer records from here on
    train_step = build_train_step(spec, recorder=recorder)
    flight.watch(recorder)
    state[_AUTOSAVE] = dict(autosave) if autosave else None
    if spec.trace and train_step.memory_tracer is not None:
        # A baseline sample before the first phase: the model and optimizer at rest.
        train_step.memory_tracer.sample(label="start")
    state[_RUN] = train_step
    return {"phases": train_step.phases, **_summary(0)}


def together(fn: Callable[..., T], *args: Any) -> T:
    """``fail_together`` for a run on every rank; a plain call for a ``single`` run, which
    lives on one rank: no peer waits for it, so a failure must not close the group."""
    if getattr(engine_state().get(_RUN), "strategy", None) == "single":
        return fn(*args)
    return fail_together(fn, *args)


def _agreed(exc: Exception) -> bool:
    """A checkpoint error every rank raised at the same point (the group is intact)."""
    return isinstance(exc, CheckpointError) and exc.ranks is not None


def _autosave(train_step: Any) -> tuple[str | None, str | None]:
    """Checkpoint when a step just finished and autosave asks for this step; returns
    (path, None), or (None, error) for a failed save (the run itself is fine)."""
    cfg = engine_state().get(_AUTOSAVE)
    if not cfg or not train_step.at_step_boundary or train_step.step % int(cfg["every"]):
        return None, None
    try:
        path = timed_save(train_step, cfg["root"], cfg.get("keep_last"), cfg.get("key"))
    except CheckpointError as exc:
        if not _agreed(exc):
            raise
        return None, f"automatic checkpoint: {exc}"
    return str(path), None


def timed_save(train_step: Any, root: str, keep_last: int | None, key: bytes | None) -> Any:
    """``save_checkpoint``, its seconds on this rank recorded as a ``checkpoint_s`` metric
    at the step saved: what the planner's fault cost needs (``session/fault_times.py``)."""
    import time

    from workbench.parallel.checkpoint import save_checkpoint
    from workbench.trace.events import Metric

    start = time.perf_counter()
    path = save_checkpoint(train_step, root, keep_last=keep_last, key=key)
    seconds = time.perf_counter() - start
    recorder = train_step.recorder
    # at the last step the checkpoint holds (as its loss is), so a roll-back to it keeps it
    step = max(train_step.step - 1, 0)
    recorder.emit(
        Metric(rank=recorder.rank, step=step, name="checkpoint_s", value=seconds, t=recorder.now())
    )
    return path


def run_phases(count: int, cursor: int) -> dict[str, Any]:
    """Run ``count`` phases (crossing step boundaries as needed)."""
    _run()  # no run is the same on every rank: an error, not a failure to spread
    return together(_run_phases, count, cursor)


def _run_phases(count: int, cursor: int) -> dict[str, Any]:
    train_step = _run()
    ran, saved, error = [], [], None
    for _ in range(count):
        ran.append(train_step.run_phase())
        if ran[-1] == "optimizer":
            path, error = _autosave(train_step)
            saved += [path] if path else []
            if error:
                break
    return {"ran": ran, "saved": saved, "error": error, **_summary(cursor)}


def run_steps(count: int, cursor: int) -> dict[str, Any]:
    """Finish the step in progress, then run ``count - 1`` more whole steps."""
    _run()  # no run is the same on every rank: an error, not a failure to spread
    return together(_run_steps, count, cursor)


def _run_steps(count: int, cursor: int) -> dict[str, Any]:
    train_step = _run()
    losses, saved, error = [], [], None
    for _ in range(count):
        losses.append(train_step.run_step())
        path, error = _autosave(train_step)
        saved += [path] if path else []
        if error:
            break
    return {"losses": losses, "saved": saved, "error": error, **_summary(cursor)}


def save_run(root: str, keep_last: int | None, key: bytes | None, cursor: int) -> dict[str, Any]:
    """Checkpoint this rank's run under ``root`` (collective: every rank calls it);
    ``key`` signs the manifest (the client's checkpoint key). A failure every rank agreed
    on comes back as ``error`` (the run is intact)."""
    _run()  # no run is the same on every rank: an error, not a failure to spread
    return together(_save_run, root, keep_last, key, cursor)


def _save_run(root: str, keep_last: int | None, key: bytes | None, cursor: int) -> dict[str, Any]:
    try:
        path = timed_save(_run(), root, keep_last, key)
    except CheckpointError as exc:
        if not _agreed(exc):
            raise
        return {"error": str(exc), "failed_ranks": exc.ranks, **_summary(cursor)}
    return {"path": str(path), **_summary(cursor)}


def load_run(root: str, step: int | None, key: bytes | None, cursor: int) -> dict[str, Any]:
    """Load a checkpoint into this rank's run (collective: every rank calls it); only
    one whose manifest ``key`` signed. A failure every rank agreed on comes back as
    ``error`` (the run is unchanged)."""
    _run()  # no run is the same on every rank: an error, not a failure to spread
    return together(_load_run, root, step, key, cursor)


def _load_run(root: str, step: int | None, key: bytes | None, cursor: int) -> dict[str, Any]:
    from workbench.parallel.checkpoint import load_checkpoint

    try:
        meta = load_checkpoint(_run(), root, step, key=key)
    except CheckpointError as exc:
        if not _agreed(exc):
            raise
        return {"error": str(exc), "failed_ranks": exc.ranks, **_summary(cursor)}
    return {"meta": {k: v for k, v in meta.items() if k != "spec"}, **_summary(cursor)}


def list_run_checkpoints(root: str) -> list[dict[str, Any]]:
    from workbench.parallel.checkpoint import list_checkpoints

    return list_checkpoints(root)


def pull_events(cursor: int) -> dict[str, Any]:
    return _summary(cursor)


def sample_ids() -> dict[int, list[int]]:
    """Step -> the dataset indices this rank took in it (since the run was last built)."""
    return dict(getattr(_run(), "sample_ids", {}))


def close_run() -> None:
    from workbench.engine import flight

    train_step = engine_state().pop(_RUN, None)
    if train_step is not None:
        flight.unwatch(train_step.recorder)
        train_step.close()
    flight.resume_cell_tracer()


def run_reference(spec_fields: dict[str, Any], steps: int) -> list[float]:
    """Losses of the single-device run on the same global batches (runs on one engine)."""
    from workbench.parallel import RunSpec, reference_losses_and_params

    losses, _ = reference_losses_and_params(RunSpec(**spec_fields), steps)
    return losses


def spec_fields(spec: Any) -> dict[str, Any]:
    return asdict(spec)
