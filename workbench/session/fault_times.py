"""The times the planner's fault cost needs, read from what a training run measured.

- step: the median wall time of a step, from rank 0's phase spans (first phase's start to
  last phase's end, per step);
- save: the slowest rank's ``checkpoint_s`` metric (every save records one, on each rank:
  ``engine/run_slot.timed_save``), median over the saves;
- recover: ``session.recover()`` / ``%wb restart`` up to the checkpoint loaded
  (``cluster.timings["recover_and_roll_back_s"]``, set by ``TrainingSession.recover``);
- detect: the seconds from the fault to the error, which only the caller can time (the
  failing call's wall time, or a hang's ``timeout`` plus its report).
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from workbench import validate
from workbench.errors import ConfigError

if TYPE_CHECKING:
    from workbench.planner.fault_cost import FaultCost

__all__ = ["FaultTimes", "fault_times"]


@dataclass(frozen=True, slots=True)
class FaultTimes:
    step_s: float
    save_s: float
    detect_s: float
    recover_s: float

    def cost(self, checkpoint_every: int, mtbf_node_h: float, nodes: int = 1) -> FaultCost:
        """``planner.fault_cost`` with these times."""
        from workbench.planner.fault_cost import fault_cost

        return fault_cost(
            checkpoint_every=checkpoint_every,
            step_s=self.step_s,
            save_s=self.save_s,
            detect_s=self.detect_s,
            recover_s=self.recover_s,
            mtbf_node_h=mtbf_node_h,
            nodes=nodes,
        )


def step_seconds(events: list[Any], rank: int = 0) -> float | None:
    """Median step wall time from ``rank``'s phase spans (whole steps only)."""
    spans: dict[int, list[Any]] = defaultdict(list)
    for e in events:
        if getattr(e, "kind", "") == "phase" and e.rank == rank:
            spans[e.step].append(e)
    phases = max((len(v) for v in spans.values()), default=0)
    whole = [v for v in spans.values() if len(v) == phases]
    if not whole:
        return None
    return statistics.median((max(s.end for s in v) - min(s.start for s in v)) / 1e9 for v in whole)


def save_seconds(events: list[Any]) -> float | None:
    """Median over the saves of the slowest rank's ``checkpoint_s``."""
    per_step: dict[int, float] = {}
    for e in events:
        if getattr(e, "kind", "") == "metric" and e.name == "checkpoint_s":
            per_step[e.step] = max(per_step.get(e.step, 0.0), float(e.value))
    return statistics.median(per_step.values()) if per_step else None


def fault_times(session: Any, *, detect_s: float) -> FaultTimes:
    """The step, save and recovery times ``session`` (a ``TrainingSession`` or ``Stepper``)
    measured, with the ``detect_s`` the caller timed. Needs a step run, a checkpoint saved
    and a recovery done; says which is missing otherwise."""
    detect = validate.number(
        "detect_s", detect_s, minimum=0, maximum=validate.MAX_SECONDS, what="a number of seconds"
    )
    assert detect is not None
    events = list(session.events)
    step = step_seconds(events)
    save = save_seconds(events)
    recover = session.cluster.timings.get("recover_and_roll_back_s")
    missing = [
        what
        for what, value in (("a whole step", step), ("a checkpoint", save), ("a recovery", recover))
        if value is None
    ]
    if missing:
        raise ConfigError(
            f"fault_times needs {', '.join(missing)} measured first; run steps with "
            "checkpoint_every (or save()) and recover from a fault with session.recover() / "
            "`%wb restart`"
        )
    assert step is not None and save is not None and recover is not None
    return FaultTimes(step_s=step, save_s=save, detect_s=detect, recover_s=float(recover))
