"""Engine side of ``wb.traced`` and ``%wb trace on``: one recorder per rank that the kernel
pulls by cursor (as the stepper pulls a run's events).

``traced(model, optimizer)`` in a ``%%wb`` cell records into this engine's trace recorder;
while it is active the engine's always-on cell tracer is paused, so no collective is
counted twice. ``begin_cell`` / ``end_cell`` make a whole cell one span (``%wb trace on``).
Works in a plain process too (tests, torchrun): the recorder and the traced cell live in
the process's ``engine_state()`` as on an engine.
"""

from __future__ import annotations

from typing import Any

from workbench.engine.state import engine_state
from workbench.trace.policy import DEFAULT_POLICY
from workbench.trace.recorder import Recorder
from workbench.trace.traced import Traced

__all__ = [
    "begin_cell",
    "current_cell",
    "end_cell",
    "pull_trace",
    "set_trace_policy",
    "trace_recorder",
    "traced",
]


def trace_recorder() -> Recorder:
    """This rank's trace recorder (made on first use)."""
    state = engine_state()
    recorder = state.trace_recorder
    if recorder is None:
        import torch.distributed as dist

        rank = dist.get_rank() if dist.is_initialized() else 0
        recorder = Recorder(rank, clock=state.clock)
        # Bounded in one long cell too: steps past the policy's recent window leave as
        # summary rows, and the recorder holds at most its cap (counted) until a pull.
        recorder.set_policy(DEFAULT_POLICY)
        state.trace_into(recorder)
        from workbench.engine import hang

        hang.watch(recorder)  # its in-flight collectives in the status file (hang reports)
    return recorder


def _pause() -> None:
    from workbench.engine import hang

    hang.pause_cell_tracer()


def _resume() -> None:
    from workbench.engine import hang

    if engine_state().run is None:  # a traced stepper run records its own
        hang.resume_cell_tracer()


def traced(
    model: Any | None = None,
    optimizer: Any | None = None,
    *,
    name: str = "traced",
    per_module: bool = False,
    seed: int | None = None,
    record: Any = None,
) -> Traced:
    """``with wb.traced(model, optimizer) as t:`` — trace a hand-written loop on this rank.

    ``seed=N`` seeds torch, numpy and ``random`` here first (the same ``N`` on every rank,
    as a stepper run is seeded), so the loop's dropout masks and draws are the same on
    every run of the notebook; ``None`` leaves the generators as the loop finds them.

    ``record=`` (``"default"``, ``"all"``, or ``wb.trace.schedule(...)``) chooses the steps
    whose full detail the kernel keeps when it pulls the events; summaries of every step are
    kept whatever it says. It stays in force on this rank, as ``%wb run --trace --record``
    does, until another is given: ``None`` keeps the one in force (the default until one is
    set), so a script's own ``wb.traced()`` follows the ``--record`` it was run with.
    """
    if record is not None:
        from dataclasses import asdict

        from workbench.trace.policy import record_policy

        policy = record_policy(record)
        trace_recorder().set_policy(policy)
        engine_state().keep_trace_policy(asdict(policy))
    if seed is not None:
        from workbench import validate
        from workbench.parallel.seeding import MAX_SEED, seed_everything

        validate.integer("seed", seed, minimum=0, maximum=MAX_SEED)
        seed_everything(seed)
    cell = engine_state().trace_cell
    own_comm = cell is None  # inside a traced cell, the cell's CommTracer already records
    return Traced(
        model,
        optimizer,
        recorder=trace_recorder(),
        name=name,
        comm=own_comm,
        per_module=per_module,
        on_enter=_pause if own_comm else None,
        on_exit=_resume if own_comm else None,
        shared_comm=None if cell is None else cell.comm_tracer,
    )


def begin_cell(label: str = "cell") -> None:
    """Start a span over the next cell, with collectives recorded (``%wb trace on``)."""
    end_cell()
    block = Traced(
        recorder=trace_recorder(), name=label, on_enter=_pause, on_exit=_resume
    ).__enter__()
    engine_state().begin_trace_cell(block)


def current_cell() -> Traced | None:
    """The traced span of the cell (or script run) now running, if any."""
    return engine_state().trace_cell


def end_cell() -> None:
    block = engine_state().take_trace_cell()
    if block is not None:
        block.__exit__(None, None, None)


def pull_trace(cursor: int) -> dict[str, Any]:
    """Trace events recorded since ``cursor`` as plain records, summary rows of the steps
    that left without their detail, the new cursor and the recorder's overflow count."""
    return {**trace_recorder().pull(cursor), "policy": engine_state().take_trace_policy()}


def set_trace_policy(fields: dict[str, Any]) -> None:
    """The kernel's recording policy (``%wb run --trace --record``) for what follows."""
    from workbench.trace.policy import RecordPolicy

    trace_recorder().set_policy(RecordPolicy(**fields))
