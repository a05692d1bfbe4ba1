"""Which rank is slow, in which phase, and how long the others wait for it.

A rank that computes slower makes every peer's next collective look slow: the peers enter
it first and wait there until the late rank arrives. ``collective_waits`` separates that
wait from the transfer: the same collective on every rank (the k-th collective of a step
with the same op and size) started at each rank's own time; a rank waits from its start
until the latest peer's start (event times are on the workbench clock, which the cluster
already corrects by each host's measured offset). ``straggler_summary`` adds the ranks'
step and phase times and names the slowest rank, by how much and in which phase.

Only collectives of the whole world are matched: an event does not say which ranks a
smaller group holds, so a subgroup's collective keeps all of its time as transfer.
"""

from __future__ import annotations

import bisect
import statistics
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from workbench.trace.events import CommEvent, Event, PhaseSpan

__all__ = ["StragglerReport", "WaitMatcher", "collective_waits", "straggler_summary"]


class WaitMatcher:
    """Matches the same collective across ranks as its events arrive, in any order and in
    any batches: the k-th collective of a (step, op, bytes) on each rank. Once the last of
    its ``group_size`` ranks has arrived, ``add`` returns every member's (start, wait).
    ``state`` is plain JSON (a live figure keeps it in its layout between updates)."""

    def __init__(self, state: dict[str, Any] | None = None) -> None:
        self.state = state if state is not None else {"seen": {}, "open": {}}

    def add(self, e: CommEvent, world: int) -> dict[int, tuple[int, int]] | None:
        """Feed one event of ``world`` ranks; {rank: (start, wait ns)} when it completes a
        whole-world collective, else None. A wait never exceeds the rank's own collective:
        a peer's clock offset can only be corrected so well."""
        steps = self.state.setdefault("steps", {})
        if e.step > steps.get(str(e.rank), e.step):
            self._forget(e.rank, before=e.step - 1)
        steps[str(e.rank)] = max(e.step, steps.get(str(e.rank), e.step))
        seen, pending = self.state["seen"], self.state["open"]
        base = f"{e.rank}|{e.step}|{e.op}|{e.bytes}"
        k = seen.get(base, 0)
        seen[base] = k + 1
        if e.group_size < 2:
            return None
        key = f"{e.step}|{e.op}|{e.bytes}|{k}"
        peers = pending.setdefault(key, {})
        # as strings: nanoseconds since the epoch pass 2**53, and a notebook's JSON goes
        # through JavaScript numbers on a save from JupyterLab (they would lose digits)
        peers[str(e.rank)] = [str(e.start), str(e.end)]
        if len(peers) < e.group_size:
            return None
        del pending[key]
        if e.group_size != world:  # a subgroup: which ranks it holds is not recorded
            return None
        times = {int(r): (int(start), int(end)) for r, (start, end) in peers.items()}
        latest = max(start for start, _ in times.values())
        return {
            r: (start, max(0, min(latest - start, end - start)))
            for r, (start, end) in times.items()
        }

    def _forget(self, rank: int, before: int) -> None:
        """Drop ``rank``'s counts of steps before ``before``: a rank's events arrive in
        time order, so it has no more of them; a live figure keeps this state all run."""
        seen = self.state["seen"]
        for key in [k for k in seen if k.startswith(f"{rank}|") and int(k.split("|")[1]) < before]:
            del seen[key]


def collective_waits(events: Iterable[Event]) -> dict[CommEvent, int]:
    """Nanoseconds each rank waited inside each whole-world collective for its latest peer
    (0 for the last to arrive). Collectives not seen on every rank are left out."""
    comms = sorted((e for e in events if isinstance(e, CommEvent)), key=lambda c: (c.rank, c.start))
    world = len({e.rank for e in comms})
    matcher = WaitMatcher()
    by_start = {(e.rank, e.start): e for e in comms}
    waits: dict[CommEvent, int] = {}
    for e in comms:
        for rank, (start, wait) in (matcher.add(e, world) or {}).items():
            waits[by_start[(rank, start)]] = wait
    return waits


@dataclass(slots=True)
class StragglerReport:
    """Per-rank mean step time and per-phase mean time (seconds), the waits inside
    collectives, and the slowest rank with where its extra time goes."""

    step_s: dict[int, float]
    phase_s: dict[int, dict[str, float]]
    wait_s: dict[int, float] = field(default_factory=dict)  # per rank, mean per step
    slowest: int | None = None
    excess_s: float = 0.0  # the slowest rank's busy time minus the other ranks' median
    phase: str | None = None  # where the slowest rank loses most against the median

    def summary(self) -> str:
        if self.slowest is None:
            return "no per-rank step times to compare"
        median = statistics.median(self.step_s.values())
        share = self.excess_s / median if median > 0 else 0.0
        text = (
            f"slowest rank: {self.slowest}, {self.excess_s * 1e3:.3g} ms per step "
            f"({share:.0%} of a step) more work than the median of the other ranks"
        )
        if self.phase is not None:
            text += f", most of it in {self.phase!r}"
        waits = ", ".join(f"rank {r}: {w * 1e3:.3g} ms" for r, w in sorted(self.wait_s.items()))
        return text + (f"; waiting inside collectives per step: {waits}" if waits else "")

    def __repr__(self) -> str:
        return f"<StragglerReport {self.summary()}>"


def _step_phases(spans: list[PhaseSpan]) -> list[PhaseSpan]:
    """The spans that are phases of one step. ``wb.traced``'s own span covers the whole
    loop and is counted at the step after the last; taken as one more step it adds the
    block's length, which differs by when each rank entered the block (the 2-node bed
    named rank 0 for a rank slowed by a CPU quota that way). A span that holds a span of
    another step is such a block span, and is left out."""
    by_rank: dict[int, list[PhaseSpan]] = defaultdict(list)
    for s in spans:
        by_rank[s.rank].append(s)
    keep = []
    for own in by_rank.values():
        own.sort(key=lambda s: s.start)
        starts = [s.start for s in own]
        for s in own:
            inside = own[bisect.bisect_left(starts, s.start) : bisect.bisect_right(starts, s.end)]
            if not any(o.step != s.step and o.end <= s.end for o in inside):
                keep.append(s)
    return keep


def _per_rank_means(spans: list[PhaseSpan]) -> tuple[dict[int, float], dict[int, dict[str, float]]]:
    steps: dict[int, dict[int, list[int]]] = defaultdict(lambda: defaultdict(list))
    phases: dict[int, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for s in spans:
        bounds = steps[s.rank][s.step]
        bounds += [s.start, s.end]
        phases[s.rank][s.phase.split("[")[0]].append(s.duration_s)
    step_s = {
        rank: statistics.fmean((max(b) - min(b)) / 1e9 for b in by_step.values())
        for rank, by_step in steps.items()
    }
    counts = {rank: len(by_step) for rank, by_step in steps.items()}
    phase_s = {
        rank: {p: sum(d) / counts[rank] for p, d in by_phase.items()}
        for rank, by_phase in phases.items()
    }
    return step_s, phase_s


def straggler_summary(events: Iterable[Event]) -> StragglerReport:
    """Per-rank step and phase times from a stepper's or a traced loop's events, the waits
    inside collectives, and the slowest rank named."""
    items = list(events)
    spans = _step_phases([e for e in items if isinstance(e, PhaseSpan)])
    step_s, phase_s = _per_rank_means(spans)
    steps = {rank: len({s.step for s in spans if s.rank == rank}) for rank in step_s}
    wait_ns: dict[int, int] = defaultdict(int)
    for e, w in collective_waits(items).items():
        wait_ns[e.rank] += w
    report = StragglerReport(
        step_s=step_s,
        phase_s=phase_s,
        wait_s={r: w / 1e9 / max(steps.get(r, 1), 1) for r, w in wait_ns.items()},
    )
    if len(step_s) < 2:
        return report
    # the slow rank is the one that waits least; its step is no longer than the others'
    # (they wait for it), so compare the work it does outside waiting
    busy = {r: t - report.wait_s.get(r, 0.0) for r, t in step_s.items()}
    slowest = max(busy, key=lambda r: busy[r])
    others = [r for r in busy if r != slowest]
    report.slowest = slowest
    report.excess_s = busy[slowest] - statistics.median(busy[r] for r in others)
    gaps = {
        p: t - statistics.median(phase_s[r].get(p, 0.0) for r in others)
        for p, t in phase_s[slowest].items()
    }
    report.phase = max(gaps, key=lambda p: gaps[p]) if gaps else None
    return report
