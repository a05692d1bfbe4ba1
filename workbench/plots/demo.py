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

from workbench.errors import ConfigError
from workbench.plots.style import MIB
from workbench.trace.events import CommEvent, Event, MemorySample, Metric, PhaseSpan, bus_factor

__all__ = ["demo_events"]

_MS = 1_000_000  # ns


def demo_events(
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
    layers = 4
    act_per_layer = 6 * MIB
    batch_bytes = 1 * MIB
    factor = bus_factor("all_reduce", world_size)
    algbw = busbw_gbps * 1e9 / factor if factor > 0 else busbw_gbps * 1e9
    events: list[Event] = []
    t = start_ns
    for step in range(steps):
        jitter = [int(rng.uniform(0, 0.6) * _MS) for _ in range(world_size)]
        data_ms, fwd_ms, bwd_ms, opt_ms = 2.0, 10.0, 20.0, 3.0
        per_rank: list[dict[str, int]] = []
        for r in range(world_size):
            s = t + jitter[r]
            marks = {"start": s, "data": s + int(data_ms * _MS)}
            marks["forward"] = marks["data"] + int(fwd_ms * rng.uniform(0.95, 1.05) * _MS)
            marks["backward"] = marks["forward"] + int(bwd_ms * rng.uniform(0.95, 1.05) * _MS)
            per_rank.append(marks)
        # Bucket k is ready on a rank when backward has produced its share of the gradients;
        # the all-reduce starts once every rank has issued it and the previous one finished.
        done = []
        free_at = 0
        filled = 0.0
        issue: list[list[int]] = [[] for _ in range(world_size)]
        for frac in buckets:
            filled += frac
            for r, m in enumerate(per_rank):
                issue[r].append(m["forward"] + int((m["backward"] - m["forward"]) * filled))
            begin = max(max(i[-1] for i in issue), free_at)
            size = int(params * frac)
            end = begin + int((50e-6 + size / algbw) * 1e9)
            done.append(end)
            free_at = end
        optimizer_state = 0 if step == 0 else 2 * params
        for r, m in enumerate(per_rank):
            sync_end = max(done[-1], m["backward"])
            opt_end = sync_end + int(opt_ms * _MS)

            mem = functools.partial(_sample, rank=r, step=step, params=params, other=batch_bytes)
            span = functools.partial(_span, rank=r, step=step)
            fwd, bwd = m["forward"] - m["data"], m["backward"] - m["forward"]
            out: list[Event] = [
                span("data", m["start"], m["data"]),
                mem(m["data"], "data", grads=0, act=0, opt=optimizer_state),
                mem(
                    m["data"] + fwd // 2,
                    "forward",
                    grads=0,
                    act=2 * act_per_layer,
                    opt=optimizer_state,
                    label="layers.1",
                ),
                mem(
                    m["forward"],
                    "forward",
                    grads=0,
                    act=layers * act_per_layer,
                    opt=optimizer_state,
                    label=f"layers.{layers - 1}",
                ),
                span("forward", m["data"], m["forward"]),
                mem(
                    m["forward"] + bwd // 2,
                    "backward",
                    grads=params // 2,
                    act=2 * act_per_layer,
                    opt=optimizer_state,
                    label="layers.1",
                ),
                mem(m["backward"], "backward", grads=params, act=0, opt=optimizer_state),
                span("backward", m["forward"], m["backward"]),
            ]
            for k, frac in enumerate(buckets):
                out.append(
                    CommEvent(
                        rank=r,
                        step=step,
                        op="all_reduce",
                        bytes=int(params * frac),
                        group_size=world_size,
                        start=issue[r][k],
                        end=done[k],
                        source="ddp-bucket",
                        phase="backward" if issue[r][k] < m["backward"] else "sync",
                    )
                )
            loss = 2.3 * math.exp(-0.08 * step) + rng.gauss(0, 0.02)
            out += [
                span("sync", m["backward"], sync_end),
                mem(opt_end, "optimizer", grads=params, act=0, opt=2 * params),
                span("optimizer", sync_end, opt_end),
                Metric(rank=r, step=step, name="loss", value=loss, t=opt_end),
            ]
            out.sort(key=_emitted_at)
            events += out
        t = max(ev.end for ev in events if isinstance(ev, PhaseSpan)) + 5 * _MS
    return events


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
