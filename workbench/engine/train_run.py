"""Engine-side functions that drive a ``TrainStep`` (the stepper's back end).

Each call does its work and piggybacks the events recorded since the client's cursor, so
one round trip both advances the run and returns the increment for the live figures.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from typing import Any, TypeVar

from workbench.engine.fail_together import fail_together
from workbench.engine.run_slot import (
    agreed,
    autosave_if_due,
    close_run,
    current_run,
    install,
    summary,
    timed_save,
)
from workbench.engine.state import engine_state
from workbench.errors import CheckpointError

__all__ = [
    "build_run",
    "close_run",
    "describe_run",
    "list_run_checkpoints",
    "load_run",
    "pull_events",
    "recent_detail",
    "run_phases",
    "run_reference",
    "run_steps",
    "run_steps_toward",
    "save_run",
]

T = TypeVar("T")


def build_run(
    spec_fields: dict[str, Any],
    autosave: dict[str, Any] | None = None,
    record: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """(Re)build this rank's run from ``RunSpec`` fields; closes any previous run.

    ``autosave`` ({"root", "every", "keep_last", "key"}) checkpoints every ``every`` steps;
    ``record`` is the kernel's recording policy (``RecordPolicy`` fields).
    """
    if spec_fields.get("strategy") == "single":  # one rank: no peer waits for it
        return _build_run(spec_fields, autosave, record)
    return fail_together(_build_run, spec_fields, autosave, record)


def _build_run(
    spec_fields: dict[str, Any], autosave: dict[str, Any] | None, record: dict[str, Any] | None
) -> dict[str, Any]:
    from workbench.parallel import RunSpec, build_train_step

    spec = RunSpec(**spec_fields)
    return install(
        lambda recorder: build_train_step(spec, recorder=recorder), spec.trace, autosave, record
    )


def together(fn: Callable[..., T], *args: Any) -> T:
    """``fail_together`` for a run on every rank; a plain call for a ``single`` run, which
    lives on one rank: no peer waits for it, so a failure must not close the group."""
    if getattr(engine_state().run, "strategy", None) == "single":
        return fn(*args)
    return fail_together(fn, *args)


def run_phases(count: int, cursor: int) -> dict[str, Any]:
    """Run ``count`` phases (crossing step boundaries as needed)."""
    current_run()  # no run is the same on every rank: an error, not a failure to spread
    return together(_run_phases, count, cursor)


def _run_phases(count: int, cursor: int) -> dict[str, Any]:
    train_step = current_run()
    ran, saved, error = [], [], None
    for _ in range(count):
        ran.append(train_step.run_phase())
        if ran[-1] == "optimizer":
            path, error = autosave_if_due(train_step)
            saved += [path] if path else []
            if error:
                break
    return {"ran": ran, "saved": saved, "error": error, **summary(cursor)}


def run_steps(count: int, cursor: int) -> dict[str, Any]:
    """Finish the step in progress, then run ``count - 1`` more whole steps."""
    current_run()  # no run is the same on every rank: an error, not a failure to spread
    return together(_run_steps, count, cursor)


def _run_steps(count: int, cursor: int, detail_from: int = 0) -> dict[str, Any]:
    train_step = current_run()
    losses, saved, error = [], [], None
    for _ in range(count):
        losses.append(train_step.run_step())
        path, error = autosave_if_due(train_step)
        saved += [path] if path else []
        if error:
            break
    return {"losses": losses, "saved": saved, "error": error, **summary(cursor, detail_from)}


def run_steps_toward(count: int, detail_from: int, cursor: int) -> dict[str, Any]:
    """``run_steps`` in a longer run: completed steps before ``detail_from`` (those that
    will have left the kernel's recent window when the run reaches its target) that the
    recording policy does not keep come back as one summary row each, not as events."""
    current_run()  # no run is the same on every rank: an error, not a failure to spread
    return together(_run_steps, count, cursor, detail_from)


def recent_detail(first: int) -> dict[str, Any]:
    """The detail of the steps from ``first`` on that went out as summary rows (the
    recording policy's last ``recent`` of them): a run stopped before its target fills the
    kernel's window with it."""
    return {"records": current_run().recorder.recent_records(first)}


def save_run(root: str, keep_last: int | None, key: bytes | None, cursor: int) -> dict[str, Any]:
    """Checkpoint this rank's run under ``root`` (collective: every rank calls it);
    ``key`` signs the manifest (the client's checkpoint key). A failure every rank agreed
    on comes back as ``error`` (the run is intact)."""
    current_run()  # no run is the same on every rank: an error, not a failure to spread
    return together(_save_run, root, keep_last, key, cursor)


def _save_run(root: str, keep_last: int | None, key: bytes | None, cursor: int) -> dict[str, Any]:
    try:
        path = timed_save(current_run(), root, keep_last, key)
    except CheckpointError as exc:
        if not agreed(exc):
            raise
        return {"error": str(exc), "failed_ranks": exc.ranks, **summary(cursor)}
    return {"path": str(path), **summary(cursor)}


def load_run(root: str, step: int | None, key: bytes | None, cursor: int) -> dict[str, Any]:
    """Load a checkpoint into this rank's run (collective: every rank calls it); only
    one whose manifest ``key`` signed. A failure every rank agreed on comes back as
    ``error`` (the run is unchanged)."""
    current_run()  # no run is the same on every rank: an error, not a failure to spread
    return together(_load_run, root, step, key, cursor)


def _load_run(root: str, step: int | None, key: bytes | None, cursor: int) -> dict[str, Any]:
    from workbench.parallel.checkpoint import load_checkpoint

    try:
        meta = load_checkpoint(current_run(), root, step, key=key)
    except CheckpointError as exc:
        if not agreed(exc):
            raise
        return {"error": str(exc), "failed_ranks": exc.ranks, **summary(cursor)}
    train_step = current_run()
    train_step.recorder.rewind(train_step.step)  # steps from here on run again
    return {"meta": {k: v for k, v in meta.items() if k != "spec"}, **summary(cursor)}


def list_run_checkpoints(root: str) -> list[dict[str, Any]]:
    from workbench.parallel.checkpoint import list_checkpoints

    return list_checkpoints(root)


def pull_events(cursor: int) -> dict[str, Any]:
    return summary(cursor)


def describe_run() -> dict[str, Any] | None:
    """This rank's run as a new kernel's stepper takes it up (``Stepper.attach``): its
    ``RunSpec`` fields (None for a run of the user's own model), its phases, where it stands
    and the events its recorder still holds (not yet acknowledged); None when it holds none."""
    train_step = engine_state().run
    if train_step is None:
        return None
    spec = getattr(train_step, "spec", None)
    fields = asdict(spec) if spec is not None else None
    return {"spec": fields, "phases": train_step.phases, **summary(0)}


def sample_ids() -> dict[int, list[int]]:
    """Step -> the dataset indices this rank took in it (since the run was last built)."""
    return dict(getattr(current_run(), "sample_ids", {}))


def run_reference(spec_fields: dict[str, Any], steps: int) -> list[float]:
    """Losses of the single-device run on the same global batches (runs on one engine).

    The rank's memory tracer keeps its saved-tensor hooks installed on this thread between
    phases; the reference's activations must not count as the rank's. The innermost hooks
    are the ones autograd calls, so identity hooks around the reference hide it from the
    tracer (no extra "peak" sample, rank 0's panel equal to rank 1's)."""
    import torch

    from workbench.parallel import RunSpec, reference_losses_and_params

    with torch.autograd.graph.saved_tensors_hooks(_same, _same):
        losses, _ = reference_losses_and_params(RunSpec(**spec_fields), steps)
    return losses


def _same(tensor: Any) -> Any:
    return tensor


def spec_fields(spec: Any) -> dict[str, Any]:
    return asdict(spec)
