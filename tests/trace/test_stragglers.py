"""Stragglers from events: the late rank named, the peers' wait split from the transfer."""

from __future__ import annotations

from workbench.plots import comm_timeline_figure
from workbench.trace import to_perfetto
from workbench.trace.events import CommEvent, Event, PhaseSpan
from workbench.trace.stragglers import collective_waits, straggler_summary

MS = 1_000_000


def _steps(late_rank: int, extra_ms: int, steps: int = 3) -> list[Event]:
    """Two ranks; ``late_rank`` spends ``extra_ms`` longer in forward, so the other enters
    each step's all-reduce that much earlier and both leave it together."""
    out: list[Event] = []
    for step in range(steps):
        t = step * 100 * MS
        for rank in (0, 1):
            forward = 10 * MS + (extra_ms * MS if rank == late_rank else 0)
            out.append(PhaseSpan(rank=rank, step=step, phase="forward", start=t, end=t + forward))
            sync_start = t + forward
            sync_end = t + 10 * MS + extra_ms * MS + 2 * MS  # both finish after the late one
            out.append(
                PhaseSpan(rank=rank, step=step, phase="sync", start=sync_start, end=sync_end)
            )
            out.append(
                CommEvent(
                    rank=rank,
                    step=step,
                    op="all_reduce",
                    bytes=4096,
                    group_size=2,
                    start=sync_start,
                    end=sync_end,
                )
            )
    return out


def test_the_early_rank_waits_for_the_late_one_and_the_late_one_does_not() -> None:
    waits = collective_waits(_steps(late_rank=1, extra_ms=30))
    by_rank = {r: [w for e, w in waits.items() if e.rank == r] for r in (0, 1)}
    assert by_rank[0] == [30 * MS] * 3
    assert by_rank[1] == [0] * 3


def test_the_summary_names_the_late_rank_its_phase_and_its_excess() -> None:
    for late in (0, 1):
        report = straggler_summary(_steps(late_rank=late, extra_ms=30))
        assert report.slowest == late
        assert report.phase == "forward"
        assert abs(report.excess_s - 0.030) < 1e-9
        assert report.wait_s[1 - late] > 0.029 and report.wait_s[late] == 0
        assert f"slowest rank: {late}" in report.summary()


def test_equal_ranks_wait_for_nobody() -> None:
    waits = collective_waits(_steps(late_rank=1, extra_ms=0))
    assert waits and set(waits.values()) == {0}


def test_a_subgroup_collective_is_not_matched() -> None:
    events = [e for e in _steps(1, 30) if not isinstance(e, CommEvent)]
    events.append(
        CommEvent(rank=0, step=0, op="all_reduce", bytes=8, group_size=3, start=0, end=MS)
    )
    assert collective_waits(events) == {}


def test_perfetto_shows_the_wait_inside_the_collective() -> None:
    trace = to_perfetto(_steps(late_rank=1, extra_ms=30))["traceEvents"]
    waits = [e for e in trace if e["name"] == "wait"]
    assert len(waits) == 3 and {e["pid"] for e in waits} == {0}
    for wait in waits:
        outer = next(
            e
            for e in trace
            if e["name"] == "all_reduce" and e["pid"] == 0 and e["ts"] == wait["ts"]
        )
        assert outer["tid"] == wait["tid"] and wait["dur"] == 30_000.0
        assert outer["args"]["wait_us"] == 30_000.0
        assert outer["args"]["transfer_us"] == outer["dur"] - 30_000.0


def test_the_timeline_draws_the_wait_on_the_waiting_rank() -> None:
    fig = comm_timeline_figure(_steps(late_rank=1, extra_ms=30))
    (wait,) = [t for t in fig.data if t.name == "wait"]
    assert list(wait.y) == ["rank 0 comm"] * 3
    assert list(wait.x) == [30.0] * 3


def test_the_matcher_keeps_only_the_last_steps_state() -> None:
    from workbench.trace.stragglers import WaitMatcher

    matcher = WaitMatcher()
    events = sorted(
        (e for e in _steps(late_rank=1, extra_ms=30, steps=20) if isinstance(e, CommEvent)),
        key=lambda e: (e.rank, e.step),  # one rank's whole run, then the other's
    )
    done = [matcher.add(e, world=2) for e in events]
    assert sum(d is not None for d in done) == 20  # every step's all-reduce matched
    steps = {int(k.split("|")[1]) for k in matcher.state["seen"]}
    assert steps <= {18, 19} and matcher.state["open"] == {}  # the rest were forgotten


def test_a_traced_blocks_own_span_is_not_taken_for_a_step() -> None:
    """``wb.traced`` emits one span over its whole loop (at the step after the last); a
    rank that entered the block earlier has a longer one, which must not make it the
    straggler (on the 2-node bed it named rank 0 instead of the slowed rank)."""
    events = _steps(late_rank=1, extra_ms=30)
    for rank, entered in ((0, -500 * MS), (1, -10 * MS)):
        events.append(PhaseSpan(rank=rank, step=3, phase="traced", start=entered, end=300 * MS))
    report = straggler_summary(events)
    assert report.slowest == 1 and report.phase == "forward"
    assert abs(report.excess_s - 0.030) < 1e-9
    assert report.step_s == straggler_summary(_steps(late_rank=1, extra_ms=30)).step_s
