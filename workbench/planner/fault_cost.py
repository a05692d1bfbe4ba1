"""What failures cost a training run, per hour, for a chosen checkpoint interval.

A first-order model, the one behind Young's formula (and Daly's first term): failures
arrive at random at rate ``nodes / MTBF``; each one costs the time to notice it
(``detect_s``), the time to get back to a working group (``recover_s``) and the work done
since the last checkpoint, on average half an interval (plus half a save: a failure during
a save loses that save too). Checkpoints cost ``save_s`` each. Per hour of training:

    lost = 3600 * (save / T + rate * (detect + recover + (T + save) / 2))

with ``T`` the interval in seconds (``checkpoint_every * step_s``). Minimising over ``T``
gives ``T* = sqrt(2 * save / rate) = sqrt(2 * save * MTBF / nodes)`` (Young / Daly). The
model holds while ``T``, the save and the recovery are short against the MTBF (at most one
failure per interval); beyond that it understates the cost. Pure arithmetic: no torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from workbench import validate

__all__ = ["FaultCost", "best_checkpoint_every", "fault_cost", "young_daly_interval_s"]

HOUR_S = 3600.0


@dataclass(frozen=True, slots=True)
class FaultCost:
    """Seconds lost per hour of training to failures and checkpoints, by cause."""

    checkpoint_every: int  # steps between checkpoints
    interval_s: float  # the same in seconds of training
    failures_per_hour: float
    saving_s: float  # checkpoint saves
    redone_s: float  # work since the last checkpoint, done again
    downtime_s: float  # detection and recovery

    @property
    def total_s(self) -> float:
        """Seconds per hour not spent on new training steps."""
        return self.saving_s + self.redone_s + self.downtime_s

    @property
    def useful_fraction(self) -> float:
        """Share of each hour left for new steps (0 when faults eat all of it)."""
        return max(0.0, 1.0 - self.total_s / HOUR_S)


def _rate_per_s(mtbf_node_h: object, nodes: object) -> float:
    mtbf = validate.number(
        "mtbf_node_h", mtbf_node_h, minimum=0, open_minimum=True, what="a number of hours"
    )
    count = validate.integer("nodes", nodes, minimum=1, what="a number of nodes")
    assert mtbf is not None and count is not None
    return count / (mtbf * HOUR_S)


def _seconds(name: str, value: object, *, positive: bool = False) -> float:
    x = validate.number(
        name,
        value,
        minimum=0,
        open_minimum=positive,
        maximum=validate.MAX_SECONDS,
        what="a number of seconds",
    )
    assert x is not None
    return x


def fault_cost(
    *,
    checkpoint_every: int,
    step_s: float,
    save_s: float,
    detect_s: float,
    recover_s: float,
    mtbf_node_h: float,
    nodes: int = 1,
) -> FaultCost:
    """The expected cost per hour of checkpointing every ``checkpoint_every`` steps of
    ``step_s`` seconds, with ``nodes`` nodes that each fail once per ``mtbf_node_h`` hours
    on average. Times are what the workbench measures (``session_fault_times``)."""
    every = validate.integer(
        "checkpoint_every", checkpoint_every, minimum=1, what="a number of steps"
    )
    assert every is not None
    step = _seconds("step_s", step_s, positive=True)
    save = _seconds("save_s", save_s)
    downtime = _seconds("detect_s", detect_s) + _seconds("recover_s", recover_s)
    rate = _rate_per_s(mtbf_node_h, nodes)
    interval = every * step
    failures = rate * HOUR_S
    return FaultCost(
        checkpoint_every=every,
        interval_s=interval,
        failures_per_hour=failures,
        saving_s=HOUR_S * save / interval,
        redone_s=failures * (interval + save) / 2,
        downtime_s=failures * downtime,
    )


def young_daly_interval_s(save_s: float, mtbf_node_h: float, nodes: int = 1) -> float:
    """Young's optimal interval ``sqrt(2 * save * MTBF)``, the system's MTBF being the
    node's over ``nodes``: the reference ``fault_cost``'s minimum agrees with."""
    save = _seconds("save_s", save_s, positive=True)
    return math.sqrt(2 * save / _rate_per_s(mtbf_node_h, nodes))


def best_checkpoint_every(
    *, step_s: float, save_s: float, mtbf_node_h: float, nodes: int = 1, max_every: int = 10**7
) -> int:
    """The whole number of steps between checkpoints with the lowest ``fault_cost``.

    The cost is convex in the interval, so the best whole number is one of the two next to
    the continuous optimum; both are evaluated with ``fault_cost`` itself."""
    step = _seconds("step_s", step_s, positive=True)
    ideal = young_daly_interval_s(save_s, mtbf_node_h, nodes) / step
    top = validate.integer("max_every", max_every, minimum=1, what="a number of steps")
    assert top is not None
    below = min(max(1, math.floor(ideal)), top)
    candidates = sorted({below, min(below + 1, top)})

    def cost(every: int) -> float:
        return fault_cost(
            checkpoint_every=every,
            step_s=step,
            save_s=save_s,
            detect_s=0.0,
            recover_s=0.0,
            mtbf_node_h=mtbf_node_h,
            nodes=nodes,
        ).total_s

    return min(candidates, key=cost)
