"""Engine-side functions that drive a ``TrainStep`` (the stepper's back end).

Each call does its work and piggybacks the events recorded since the client's cursor, so
one round trip both advances the run and returns the increment for the live figures.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from workbench.cluster.engine import engine_state

__all__ = [
    "build_run",
    "close_run",
    "pull_events",
    "run_phases",
    "run_reference",
    "run_steps",
]

_RUN = "run"


def _summary(cursor: int) -> dict[str, Any]:
    train_step = engine_state()[_RUN]
    records, new_cursor = train_step.recorder.records_since(cursor)
    return {
        "step": train_step.step,
        "next_phase": train_step.phase,
        "loss": train_step.last_loss,
        "records": records,
        "cursor": new_cursor,
    }


def build_run(spec_fields: dict[str, Any]) -> dict[str, Any]:
    """(Re)build this rank's run from ``RunSpec`` fields; closes any previous run."""
    import torch.distributed as dist

    from workbench.parallel import RunSpec, build_train_step
    from workbench.trace import Recorder

    close_run()
    state = engine_state()
    spec = RunSpec(**spec_fields)
    rank = dist.get_rank() if dist.is_initialized() else 0
    recorder = Recorder(rank, clock=state.get("clock"))
    train_step = build_train_step(spec, recorder=recorder)
    if spec.trace and train_step.memory_tracer is not None:
        # A baseline sample before the first phase: the model and optimizer at rest.
        train_step.memory_tracer.sample(label="start")
    state[_RUN] = train_step
    return {"phases": train_step.phases, **_summary(0)}


def run_phases(count: int, cursor: int) -> dict[str, Any]:
    """Run ``count`` phases (crossing step boundaries as needed)."""
    train_step = engine_state()[_RUN]
    ran = [train_step.run_phase() for _ in range(count)]
    return {"ran": ran, **_summary(cursor)}


def run_steps(count: int, cursor: int) -> dict[str, Any]:
    """Finish the step in progress, then run ``count - 1`` more whole steps."""
    train_step = engine_state()[_RUN]
    losses = [train_step.run_step() for _ in range(count)]
    return {"losses": losses, **_summary(cursor)}


def pull_events(cursor: int) -> dict[str, Any]:
    return _summary(cursor)


def close_run() -> None:
    train_step = engine_state().pop(_RUN, None)
    if train_step is not None:
        train_step.close()


def run_reference(spec_fields: dict[str, Any], steps: int) -> list[float]:
    """Losses of the single-device run on the same global batches (runs on one engine)."""
    from workbench.parallel import RunSpec, reference_losses_and_params

    losses, _ = reference_losses_and_params(RunSpec(**spec_fields), steps)
    return losses


def spec_fields(spec: Any) -> dict[str, Any]:
    return asdict(spec)
