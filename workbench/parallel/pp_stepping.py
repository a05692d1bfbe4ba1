"""Stepping a pipeline schedule one action at a time: what a pipeline does, shown rank by rank.

A phase step of a ``pp`` run advances every rank by one *action* of its schedule: one
micro-batch's forward, backward, backward-input or backward-weight on one of its stages
(``forward[mb=3]``, ``backward_input[mb=1,stage=2]``, ...). Each rank follows its own
order (``action_order``), so rank 0 can be in ``forward[mb=3]`` while rank 1 is in
``backward[mb=1]``; a rank with fewer actions than the longest (DualPipeV's ends) is
``idle`` for the rest, so every rank reaches ``sync`` at the same phase step.

torch's schedules run a whole step inside ``schedule.step``; there is no "one action" call.
So the stepped schedule runs on a thread of its own (``ActionGate``), and each stage's
``*_one_chunk`` (``pp._ActionStage``) waits at the gate before it computes: a
phase step lets exactly one action through and waits until it finished. The
point-to-point traffic between actions is not gated: it proceeds on the schedule's thread
as soon as the peer's action that it waits for ran in the same or an earlier phase step
(checked on every schedule, rank by rank, in ``tests/parallel/test_pp_stepping.py``).

``ActionGate.finish`` opens the gate (the schedule runs to its end, as Run N and Step ▶▶
do) and returns the schedule's losses; ``close`` does the same for a run reset or closed
mid-schedule, so no thread is left waiting at the gate: every rank closes its run in the
same call, so every rank's schedule finishes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from workbench.errors import ParallelError

__all__ = ["IDLE", "ActionGate", "action_name", "action_order", "is_action"]

IDLE = "idle"  # a phase step where this rank's schedule has no action left

# torch's computation types (``_ComputationType`` values) -> this workbench's span names.
_KINDS = {"F": "forward", "B": "backward", "I": "backward_input", "W": "backward_weight"}
_BASES = frozenset(_KINDS.values())


def action_name(kind: str, microbatch: int, stage: int, several: bool) -> str:
    """The phase name of one action: ``forward[mb=0]``, ``backward_weight[mb=2,stage=3]``."""
    return f"{kind}[mb={microbatch}{f',stage={stage}' if several else ''}]"


def is_action(phase: str) -> bool:
    """A pipeline action's phase name, or ``idle``."""
    return phase == IDLE or (phase.partition("[")[0] in _BASES and "[mb=" in phase)


def action_order(schedule: Any, single: bool, several: bool) -> dict[int, list[str]]:
    """Every pipeline rank's compute actions, in the order its schedule runs them.

    ``single``: a one-stage-per-rank schedule (GPipe, 1F1B), whose order is its code's
    (torch's ``pipeline_order`` for them labels some micro-batches differently from what
    runs); otherwise the runtime's own plan, ``pipeline_order_with_comms``, with DualPipeV's
    overlapped F+B pairs in the order they run (F, then B).
    """
    if single:
        stages, m = schedule._num_stages, schedule._n_microbatches
        return {s: _single_order(type(schedule).__name__, s, stages, m) for s in range(stages)}
    plan = getattr(schedule, "pipeline_order_with_comms", None)
    if not plan:
        raise ParallelError(f"{type(schedule).__name__} has no action plan to step through")
    out: dict[int, list[str]] = {}
    for rank, actions in plan.items():
        names: list[str] = []
        for action in actions:
            for part in action.sub_actions or (action,):
                kind = _KINDS.get(str(part.computation_type.value))
                if kind is not None:
                    names.append(
                        action_name(kind, part.microbatch_index, part.stage_index, several)
                    )
        out[rank] = names
    return out


def _single_order(cls: str, stage: int, stages: int, m: int) -> list[str]:
    forward = [action_name("forward", i, stage, False) for i in range(m)]
    backward = [action_name("backward", i, stage, False) for i in range(m)]
    if cls == "ScheduleGPipe":
        return forward + backward
    # 1F1B (torch's Schedule1F1B): stage s warms up with min(m, stages - s) forwards, then
    # alternates one backward, one forward, and drains the backwards left.
    warmup = min(m, stages - stage)
    order = forward[:warmup]
    for i in range(m - warmup):
        order += [backward[i], forward[warmup + i]]
    return order + backward[m - warmup :]


class ActionGate:
    """Owner of a schedule stepped action by action: its thread, and how far it may go.

    ``enter``/``sample``/``leave`` are called by the wrapped stage methods around each
    action; they do nothing unless called on the gate's own thread (a schedule run to the end on the
    engine's main thread is not gated).
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._allowed = 0  # actions let through in this schedule
        self._started = 0
        self._done = 0
        self._open = False  # let every action through (finish, close)
        self._finished = False
        self._result: Any = None
        self._error: BaseException | None = None
        self._after: Callable[[str], None] | None = None
        self.ran: list[str] = []  # the actions run so far in this schedule, in order

    def __repr__(self) -> str:
        return f"ActionGate(active={self.active}, ran={len(self.ran)})"

    @property
    def active(self) -> bool:
        """A stepped schedule is in progress (started, not yet finished)."""
        return self._thread is not None

    def start(self, run: Callable[[], Any], after: Callable[[str], None] | None = None) -> None:
        """Run ``run()`` (the whole schedule) on the gate's thread, held before its first
        action. ``after(name)`` runs on that thread once each action finished (inside its
        span: a memory sample shows what the action left)."""
        if self._thread is not None:
            raise ParallelError("a stepped pipeline schedule is already in progress")
        self._allowed = self._started = self._done = 0
        self._open = self._finished = False
        self._result, self._error, self._after = None, None, after
        self.ran = []
        self._thread = threading.Thread(
            target=self._main, args=(run,), name="wb-pipeline-schedule", daemon=True
        )
        self._thread.start()

    def _main(self, run: Callable[[], Any]) -> None:
        try:
            result = run()
        except BaseException as exc:  # handed to the engine's thread by advance / finish
            with self._cond:
                self._error = exc
        else:
            with self._cond:
                self._result = result
        finally:
            with self._cond:
                self._finished = True
                self._cond.notify_all()

    def _mine(self) -> bool:
        thread = self._thread
        return thread is not None and threading.get_ident() == thread.ident

    def enter(self, name: str) -> None:
        """Before an action: wait until a phase step lets it through."""
        if not self._mine():
            return
        with self._cond:
            while not (self._open or self._started < self._allowed):
                self._cond.wait()
            self._started += 1

    def sample(self, name: str) -> None:
        """An action just finished (still inside its span): ``after(name)``, when stepped."""
        if self._mine() and self._after is not None and not self._open:
            self._after(name)

    def leave(self, name: str) -> None:
        """After an action: note it and wake the phase step that waits for it."""
        if not self._mine():
            return
        with self._cond:
            self.ran.append(name)
            self._done += 1
            self._cond.notify_all()

    def advance(self) -> str | None:
        """Let one action through and wait until it finished; its name (None when the
        schedule had no action left). Waits in slices so an interrupt reaches the engine."""
        with self._cond:
            self._allowed += 1
            self._cond.notify_all()
            while not (self._done >= self._allowed or self._finished):
                self._cond.wait(0.2)
            self._raise_error()
            return self.ran[-1] if self._done >= self._allowed else None

    def finish(self) -> Any:
        """Let the schedule run to its end; what ``run()`` returned."""
        thread = self._thread
        if thread is None:
            raise ParallelError("no stepped pipeline schedule is in progress")
        with self._cond:
            self._open = True
            self._cond.notify_all()
        while thread.is_alive():
            thread.join(0.2)
        self._thread = None
        with self._cond:
            self._raise_error()
            return self._result

    def close(self, timeout: float = 60.0) -> None:
        """Finish a schedule left mid-way (a reset, a rebuild, a roll-back), discarding its
        result; a peer that never finishes its part (it died) leaves the daemon thread
        waiting in its receive after ``timeout``, not the engine."""
        thread = self._thread
        if thread is None:
            return
        with self._cond:
            self._open = True
            self._cond.notify_all()
        thread.join(timeout)
        self._thread = None

    def _raise_error(self) -> None:
        error, self._error = self._error, None
        if error is not None:
            self._open = True  # nothing more runs: later calls do not wait for it
            raise error
