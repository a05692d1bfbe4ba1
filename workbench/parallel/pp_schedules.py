"""The pipeline schedules torch ships, and what each needs: one table, checked on the client.

``SCHEDULES`` names every schedule of ``torch.distributed.pipelining`` the workbench runs:

============  =================================  ===============  ====================
name          torch class                        stages per rank  placement of stages
============  =================================  ===============  ====================
gpipe         ScheduleGPipe                      1                stage = rank
1f1b          Schedule1F1B                       1                stage = rank
interleaved   ScheduleInterleaved1F1B            v >= 2           loop: rank, rank+p, ..
_1f1b
zero_bubble   ScheduleInterleavedZeroBubble      v >= 1           loop (ZB-H1 at v = 1)
zbv           ScheduleZBVZeroBubble              2                V: rank and 2p-1-rank
dualpipe_v    ScheduleDualPipeV                  2                V: rank and 2p-1-rank
============  =================================  ===============  ====================

The zero-bubble schedules split each backward into B (gradient of the stage's input, sent
upstream at once) and W (gradient of its weights, deferred into what would be bubble).

``analytic_bubble`` is the textbook idle fraction of a rank, with F, B and W of equal cost
(one unit each; a full backward is B + W): GPipe and 1F1B (p-1)/(m+p-1); interleaved 1F1B
with v stages per rank (p-1)/(v·m+p-1) (Narayanan et al. 2021); interleaved zero bubble
(ZB-H1) the warm-up and cool-down shrink to a third, (p-1)/(3·v·m+p-1) (Qi et al. 2024);
ZB-V and DualPipeV schedule W into every gap, 0 in the limit of equal costs.
``measured_bubble`` is the same fraction read off a run's trace: per rank, 1 - (time in
its F/B/W spans) / (the schedule's span), averaged over steps after the first (the first
also infers the stages' shapes).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from torch.distributed.pipelining import (
    Schedule1F1B,
    ScheduleDualPipeV,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    ScheduleInterleavedZeroBubble,
    ScheduleZBVZeroBubble,
)

from workbench.errors import ConfigError, choices_error

__all__ = [
    "ACTION_PHASES",
    "SCHEDULES",
    "Bubble",
    "analytic_bubble",
    "check_schedule",
    "default_stages_per_rank",
    "measured_bubble",
    "stage_indices",
]

SCHEDULES: dict[str, type] = {
    "gpipe": ScheduleGPipe,
    "1f1b": Schedule1F1B,
    "interleaved_1f1b": ScheduleInterleaved1F1B,
    "zero_bubble": ScheduleInterleavedZeroBubble,
    "zbv": ScheduleZBVZeroBubble,
    "dualpipe_v": ScheduleDualPipeV,
}
SINGLE_STAGE = frozenset({"gpipe", "1f1b"})  # one stage per rank (PipelineScheduleSingle)
V_SHAPE = frozenset({"zbv", "dualpipe_v"})  # exactly two stages per rank, placed in a V
_MIN_VIRTUAL = {"interleaved_1f1b": 2, "zero_bubble": 1}

# The phase-span names of one pipeline action (``pp._ActionStage``): F, full backward,
# B (input gradient only) and W (weight gradient), each as ``name[mb=i]`` or
# ``name[mb=i,stage=s]`` with several stages per rank.
ACTION_PHASES: dict[str, str] = {
    "forward": "F",
    "backward": "B",  # a full backward: input and weight gradients at once
    "backward_input": "B",
    "backward_weight": "W",
}


def default_stages_per_rank(schedule: str) -> int:
    """1 for GPipe and 1F1B, 2 for the multi-stage schedules."""
    return 1 if schedule in SINGLE_STAGE else 2


def check_schedule(
    schedule: str,
    stages_per_rank: int | None,
    microbatches: int,
    pp: int,
    n_layers: int | None = None,
) -> int:
    """Everything a schedule needs, checked before any rank builds; the stages per rank.

    ``n_layers``: the built-in model's block count (each of the ``pp * v`` stages takes an
    equal run of blocks); None for a model split at named points.
    """
    if schedule not in SCHEDULES:
        raise choices_error("schedule", schedule, list(SCHEDULES))
    v = default_stages_per_rank(schedule) if stages_per_rank is None else stages_per_rank
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ConfigError(f"stages_per_rank={v!r} is not valid; it must be an integer >= 1")
    if schedule in SINGLE_STAGE and v != 1:
        raise ConfigError(
            f"stages_per_rank={v} is not valid with schedule={schedule!r}: it runs one stage "
            "per rank; use stages_per_rank=1, or schedule='interleaved_1f1b', 'zero_bubble', "
            "'zbv' or 'dualpipe_v' for virtual stages"
        )
    if schedule in V_SHAPE and v != 2:
        raise ConfigError(
            f"stages_per_rank={v} is not valid with schedule={schedule!r}: its V places "
            "exactly two stages on each rank; use stages_per_rank=2"
        )
    if v < _MIN_VIRTUAL.get(schedule, 1):
        raise ConfigError(
            f"stages_per_rank={v} is not valid with schedule={schedule!r}: it interleaves "
            f"virtual stages; use stages_per_rank >= {_MIN_VIRTUAL[schedule]}"
        )
    if pp <= 1:
        return v
    stages = pp * v
    if n_layers is not None and (n_layers < stages or n_layers % stages):
        fits = [d for d in range(1, n_layers // pp + 1) if n_layers % (pp * d) == 0]
        raise ConfigError(
            f"schedule={schedule!r} with stages_per_rank={v} on pp={pp} ranks needs "
            f"{stages} stages, but the model has n_layers={n_layers} blocks (each stage needs "
            f"an equal, non-empty run of blocks); stages_per_rank that fit: {fits or 'none'}; "
            "use a deeper model (e.g. 'gpt-small', 'mlp-small') or schedule='gpipe'/'1f1b'"
        )
    _check_microbatches(schedule, microbatches, pp, v)
    return v


def _check_microbatches(schedule: str, microbatches: int, pp: int, v: int) -> None:
    stages = pp * v
    need = {"1f1b": pp, "dualpipe_v": stages, "zbv": stages}.get(schedule)
    if need is not None and microbatches < need:
        raise ConfigError(
            f"microbatches={microbatches} is not valid with schedule={schedule!r} on "
            f"pp={pp} ranks (x{v} stages each): it needs at least {need} micro-batches; "
            f"use microbatches >= {need}"
        )
    if schedule in _MIN_VIRTUAL:
        rounds = max(1, microbatches // pp)
        if microbatches % rounds:
            valid = [m for m in range(1, 4 * pp + 1) if m % max(1, m // pp) == 0]
            raise ConfigError(
                f"microbatches={microbatches} is not valid with schedule={schedule!r} on "
                f"pp={pp}: it runs rounds of pp micro-batches, so microbatches must be a "
                f"multiple of its {rounds} rounds; e.g. {valid}"
            )


def stage_indices(schedule: str, rank: int, pp: int, stages_per_rank: int) -> list[int]:
    """The global stage indices this pipeline rank holds: a loop (rank, rank+p, ...) or,
    for the V schedules, rank and 2p-1-rank (so rank 0 holds the first and the last)."""
    if schedule in V_SHAPE:
        return [rank, 2 * pp - 1 - rank]
    return [rank + k * pp for k in range(stages_per_rank)]


def analytic_bubble(schedule: str, pp: int, microbatches: int, stages_per_rank: int) -> float:
    """The idle fraction of a rank with equal F, B and W costs (see the module docstring)."""
    p, m, v = pp, microbatches, stages_per_rank
    if p <= 1:
        return 0.0
    if schedule in SINGLE_STAGE:
        return (p - 1) / (m + p - 1)
    if schedule == "interleaved_1f1b":
        return (p - 1) / (v * m + p - 1)
    if schedule == "zero_bubble":
        return (p - 1) / (3 * v * m + p - 1)
    return 0.0


@dataclass(frozen=True, slots=True)
class Bubble:
    """One rank's bubble: measured from the trace, and the formula's."""

    rank: int
    measured: float
    analytic: float
    busy_ms: float
    span_ms: float
    steps: int

    def as_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "measured": self.measured,
            "analytic": self.analytic,
            "busy_ms": self.busy_ms,
            "span_ms": self.span_ms,
            "steps": self.steps,
        }


def _is_action(phase: str) -> bool:
    base, _, rest = phase.partition("[")
    return base in ACTION_PHASES and rest.startswith("mb=")


def measured_bubble(events: Iterable[Any], ranks: Iterable[int], analytic: float) -> list[Bubble]:
    """Each rank's idle fraction inside the schedule (the ``forward`` phase that runs it).

    ``events``: ``PhaseSpan`` objects or their dicts. Steps after the first are averaged
    when there are several (the first step also infers the stages' shapes).
    """
    windows: dict[tuple[int, int], list[int]] = {}
    busy: dict[tuple[int, int], int] = {}
    for e in events:
        d: Mapping[str, Any] = e if isinstance(e, Mapping) else _fields(e)
        if d.get("kind") != "phase":
            continue
        key = (int(d["rank"]), int(d["step"]))
        if d["phase"] == "forward":
            windows[key] = [int(d["start"]), int(d["end"])]
        elif _is_action(str(d["phase"])):
            busy[key] = busy.get(key, 0) + int(d["end"]) - int(d["start"])
    out = []
    for rank in ranks:
        steps = sorted(s for r, s in windows if r == rank and (r, s) in busy)
        if len(steps) > 1:
            steps = steps[1:]
        span = sum(windows[(rank, s)][1] - windows[(rank, s)][0] for s in steps)
        work = sum(busy[(rank, s)] for s in steps)
        idle = 1.0 - work / span if span > 0 else float("nan")
        out.append(Bubble(rank, max(0.0, idle), analytic, work / 1e6, span / 1e6, len(steps)))
    return out


def _fields(event: Any) -> dict[str, Any]:
    names = ("rank", "step", "phase", "start", "end")
    return {"kind": getattr(event, "kind", ""), **{n: getattr(event, n, None) for n in names}}
