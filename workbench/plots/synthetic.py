"""A synthetic but realistic DDP trace: what the figures show without starting a cluster.

Each step on each rank: data -> forward (activations grow layer by layer) -> backward
(activations freed, gradients filled bucket by bucket, each bucket all-reduced as soon as it
is ready, so communication overlaps backward) -> sync (waiting for the last bucket) ->
optimizer (Adam state appears at the first step). Bucket all-reduces run one at a time, as
on one process group, and finish at the same time on every rank. 15 events per rank per step.
"""

from __future__ import annotations

import functools
import math
import random
from dataclasses import dataclass
from typing import Any

from workbench.errors import ConfigError
from workbench.plots.style import MIB
from workbench.trace.events import CommEvent, Event, MemorySample, Metric, PhaseSpan, bus_factor

__all__ = ["at_step", "synthetic_events"]

_MS = 1_000_000  # ns
_LAYERS = 4
_ACT_PER_LAYER = 6 * MIB
_BATCH = 1 * MIB
_DATA_MS, _FORWARD_MS, _BACKWARD_MS, _OPTIMIZER_MS = 2.0, 10.0, 20.0, 3.0


def synthetic_events(
    steps: int = 3,
    world_size: int = 2,
    *,
    seed: int = 0,
    params: int = 40 * MIB,
    buckets: tuple[float, ...] = (0.4, 0.4, 0.2),
    busbw_gbps: float = 2.0,
    start_ns: int = 1_700_000_000 * 10**9,
) -> list[Event]:
    """Events of ``steps`` DDP steps on ``world_size`` ranks, in the order a client pulls them
    (step by step, rank by rank, each rank's events in emission order).

    ``buckets`` are the gradient fractions per DDP bucket (in the order backward fills them);
    ``busbw_gbps`` sets the all-reduce speed.
    """
    if steps < 1 or world_size < 1:
        raise ConfigError(f"steps={steps!r}, world_size={world_size!r}: both must be >= 1")
    if not buckets or abs(sum(buckets) - 1.0) > 1e-9 or min(buckets) <= 0:
        raise ConfigError(f"buckets={buckets!r} is not valid; give positive fractions summing to 1")
    rng = random.Random(seed)
    factor = bus_factor("all_reduce", world_size)
    algbw = busbw_gbps * 1e9 / factor if factor > 0 else busbw_gbps * 1e9
    events: list[Event] = []
    t = start_ns
    for step in range(steps):
        marks = _phase_marks(t, world_size, rng)
        issue, done = _bucket_times(marks, buckets, params, algbw)
        optimizer_state = 0 if step == 0 else 2 * params
        loss_noise = [rng.gauss(0, 0.02) for _ in range(world_size)]
        for r, m in enumerate(marks):
            run = _Run(rank=r, step=step, params=params, optimizer_state=optimizer_state)
            out = _rank_events(run, m, buckets, issue[r], done, world_size)
            loss = 2.3 * math.exp(-0.08 * step) + loss_noise[r]
            out.append(Metric(rank=r, step=step, name="loss", value=loss, t=out[-1].end))
            out.sort(key=_emitted_at)
            events += out
        t = max(ev.end for ev in events if isinstance(ev, PhaseSpan)) + 5 * _MS
    return events


@dataclass(frozen=True, slots=True)
class _Run:
    rank: int
    step: int
    params: int
    optimizer_state: int


def _phase_marks(t: int, world_size: int, rng: random.Random) -> list[dict[str, int]]:
    """When each rank starts the step and ends data, forward and backward (ns)."""
    jitter = [int(rng.uniform(0, 0.6) * _MS) for _ in range(world_size)]
    per_rank = []
    for r in range(world_size):
        s = t + jitter[r]
        marks = {"start": s, "data": s + int(_DATA_MS * _MS)}
        marks["forward"] = marks["data"] + int(_FORWARD_MS * rng.uniform(0.95, 1.05) * _MS)
        marks["backward"] = marks["forward"] + int(_BACKWARD_MS * rng.uniform(0.95, 1.05) * _MS)
        per_rank.append(marks)
    return per_rank


def _bucket_times(
    per_rank: list[dict[str, int]], buckets: tuple[float, ...], params: int, algbw: float
) -> tuple[list[list[int]], list[int]]:
    """Per rank, when each bucket's all-reduce is issued; per bucket, when it finishes.

    Bucket k is ready on a rank when backward has produced its share of the gradients; the
    all-reduce starts once every rank has issued it and the previous one finished.
    """
    done: list[int] = []
    free_at = 0
    filled = 0.0
    issue: list[list[int]] = [[] for _ in per_rank]
    for frac in buckets:
        filled += frac
        for r, m in enumerate(per_rank):
            issue[r].append(m["forward"] + int((m["backward"] - m["forward"]) * filled))
        begin = max(max(i[-1] for i in issue), free_at)
        end = begin + int((50e-6 + int(params * frac) / algbw) * 1e9)
        done.append(end)
        free_at = end
    return issue, done


def _rank_events(
    run: _Run,
    m: dict[str, int],
    buckets: tuple[float, ...],
    issue: list[int],
    done: list[int],
    world_size: int,
) -> list[Any]:
    """One rank's spans, memory samples and bucket all-reduces for one step."""
    params, opt = run.params, run.optimizer_state
    sync_end = max(done[-1], m["backward"])
    opt_end = sync_end + int(_OPTIMIZER_MS * _MS)
    mem = functools.partial(_sample, rank=run.rank, step=run.step, params=params, other=_BATCH)
    span = functools.partial(_span, rank=run.rank, step=run.step)
    fwd, bwd = m["forward"] - m["data"], m["backward"] - m["forward"]
    half, full = 2 * _ACT_PER_LAYER, _LAYERS * _ACT_PER_LAYER
    out: list[Any] = [
        span("data", m["start"], m["data"]),
        mem(m["data"], "data", grads=0, act=0, opt=opt),
        mem(m["data"] + fwd // 2, "forward", grads=0, act=half, opt=opt, label="layers.1"),
        mem(m["forward"], "forward", grads=0, act=full, opt=opt, label=f"layers.{_LAYERS - 1}"),
        span("forward", m["data"], m["forward"]),
        mem(
            m["forward"] + bwd // 2,
            "backward",
            grads=params // 2,
            act=half,
            opt=opt,
            label="layers.1",
        ),
        mem(m["backward"], "backward", grads=params, act=0, opt=opt),
        span("backward", m["forward"], m["backward"]),
    ]
    out += [
        CommEvent(
            rank=run.rank,
            step=run.step,
            op="all_reduce",
            bytes=int(params * frac),
            group_size=world_size,
            start=issue[k],
            end=done[k],
            source="ddp-bucket",
            phase="backward" if issue[k] < m["backward"] else "sync",
        )
        for k, frac in enumerate(buckets)
    ]
    out += [
        span("sync", m["backward"], sync_end),
        mem(opt_end, "optimizer", grads=params, act=0, opt=2 * params),
        span("optimizer", sync_end, opt_end),
    ]
    return out


def _sample(
    when: int,
    phase: str,
    *,
    rank: int,
    step: int,
    params: int,
    grads: int,
    act: int,
    opt: int,
    other: int,
    label: str = "",
) -> MemorySample:
    return MemorySample(
        rank=rank,
        step=step,
        phase=phase,
        t=when,
        params=params,
        grads=grads,
        optimizer=opt,
        activations=act,
        other=other,
        label=label,
    )


def _span(phase: str, start: int, end: int, *, rank: int, step: int) -> PhaseSpan:
    return PhaseSpan(rank=rank, step=step, phase=phase, start=start, end=end)


def _emitted_at(e: Event) -> int:
    """When the recorder would append the event: spans at their end, samples at their time."""
    if isinstance(e, PhaseSpan | CommEvent):
        return e.end
    return e.t


def at_step(events: list[Event], step: int, period_ns: int = 10**9) -> list[Event]:
    """``events`` (of one step) moved to ``step``, ``step * period_ns`` later: a long run
    made of copies of one step, for measuring what grows with the run's length."""
    from dataclasses import replace

    shift = step * period_ns
    out: list[Event] = []
    for e in events:
        if isinstance(e, MemorySample | Metric):
            out.append(replace(e, step=step, t=e.t + shift))
        else:
            out.append(replace(e, step=step, start=e.start + shift, end=e.end + shift))
    return out
