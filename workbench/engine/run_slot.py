"""This rank's one training run: where it is installed, found, checkpointed and closed.

A built-in run (``train_run``) and a run of the user's own model (``user_run``) differ only
in how the ``TrainStep`` is built; both go through ``install`` here (one set-up: the
recorder, the cell tracer paused while a traced run records its own, the autosave
settings, the baseline memory sample) and are then driven by the same functions. The
run lives in ``engine_state().run``, which tests and recovery read too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from workbench.engine.state import engine_state
from workbench.errors import CheckpointError

__all__ = [
    "agreed",
    "autosave_if_due",
    "close_run",
    "current_run",
    "drop_run",
    "install",
    "summary",
    "timed_save",
]


def current_run() -> Any:
    """This rank's training run; a clear error when there is none (a restart or a
    recovery closed it: the session rebuilds it)."""
    return engine_state().current_run()


def summary(cursor: int, detail_from: int = 0) -> dict[str, Any]:
    """Where the run stands, with the events recorded since the client's ``cursor``
    (completed steps before ``detail_from`` that the recording policy does not keep come as
    summary rows: ``Recorder.pull``)."""
    train_step = current_run()
    return {
        "step": train_step.step,
        "next_phase": train_step.phase,
        "loss": train_step.last_loss,
        **train_step.recorder.pull(cursor, detail_from=detail_from),
    }


def install(
    build: Callable[[Any], Any],
    trace: bool,
    autosave: dict[str, Any] | None,
    record: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Close any previous run, build the new one with ``build(recorder)`` and install it.

    ``autosave`` ({"root", "every", "keep_last", "key"}) checkpoints every ``every`` steps.
    ``record`` (``RecordPolicy`` fields, the kernel's ``record=``) lets the recorder send
    the steps it does not keep as summary rows.
    """
    import torch.distributed as dist

    from workbench.engine import hang
    from workbench.trace import Recorder

    close_run()
    state = engine_state()
    rank = dist.get_rank() if dist.is_initialized() else 0
    recorder = Recorder(rank, clock=state.clock)
    if record is not None:
        from workbench.trace.policy import RecordPolicy

        recorder.set_policy(RecordPolicy(**record))
    if trace:
        hang.pause_cell_tracer()  # the run's own CommTracer records from here on
    try:
        train_step = build(recorder)
    except BaseException:
        hang.resume_cell_tracer()  # no run records: cells are traced again
        raise
    hang.watch(recorder)
    if trace:  # on CUDA, the allocator's own history too (export_memory_snapshot)
        from workbench.engine.memory_history import start_history

        start_history(train_step)
    if trace and train_step.memory_tracer is not None:
        # A baseline sample before the first phase: the model and optimizer at rest.
        train_step.memory_tracer.sample(label="start")
    state.install_run(train_step, autosave)
    return {"phases": train_step.phases, **summary(0)}


def agreed(exc: Exception) -> bool:
    """A checkpoint error every rank raised at the same point (the group is intact)."""
    return isinstance(exc, CheckpointError) and exc.ranks is not None


def autosave_if_due(train_step: Any) -> tuple[str | None, str | None]:
    """Checkpoint when a step just finished and autosave asks for this step; returns
    (path, None), or (None, error) for a failed save every rank agreed on (the run itself
    is fine)."""
    cfg = engine_state().autosave
    if not cfg or not train_step.at_step_boundary or train_step.step % int(cfg["every"]):
        return None, None
    try:
        path = timed_save(train_step, cfg["root"], cfg.get("keep_last"), cfg.get("key"))
    except CheckpointError as exc:
        if not agreed(exc):
            raise
        return None, f"automatic checkpoint: {exc}"
    return str(path), None


def close_run() -> None:
    """Close this rank's run, if any, and trace cells again."""
    from workbench.engine import hang

    train_step = engine_state().take_run()
    if train_step is not None:
        hang.unwatch(train_step.recorder)
        train_step.close()
    hang.resume_cell_tracer()


def drop_run() -> None:
    """``close_run``, and a run broken by a failure (its close raising) dropped anyway."""
    try:
        close_run()
    except Exception:
        engine_state().take_run()


def timed_save(train_step: Any, root: str, keep_last: int | None, key: bytes | None) -> Any:
    """``save_checkpoint``, its seconds on this rank recorded as a ``checkpoint_s`` metric
    at the step saved: what the planner's fault cost needs (``session/fault_times.py``)."""
    import time

    from workbench.parallel.checkpoint import save_checkpoint
    from workbench.trace.events import Metric

    start = time.perf_counter()
    path = save_checkpoint(train_step, root, keep_last=keep_last, key=key)
    seconds = time.perf_counter() - start
    recorder = getattr(train_step, "recorder", None)
    if recorder is not None:
        # at the last step the checkpoint holds (as its loss is): a roll-back to it keeps it
        step = max(train_step.step - 1, 0)
        recorder.emit(
            Metric(
                rank=recorder.rank, step=step, name="checkpoint_s", value=seconds, t=recorder.now()
            )
        )
    return path
