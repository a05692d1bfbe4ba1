"""Engines send summaries for the steps the recording policy drops (issue 42, second part),
unit level: the recorder's pulls with a policy, summary rows folded into the kernel's
``StepSummaries`` as the events would have been, the recent detail kept for a run stopped
early, and a long ``wb.traced`` loop in one cell held under its cap with drops counted."""

from __future__ import annotations

import math
from dataclasses import replace

from workbench.plots import synthetic_events
from workbench.trace import Recorder
from workbench.trace.events import Event, from_record
from workbench.trace.policy import RecordPolicy, schedule
from workbench.trace.store import EventStore
from workbench.trace.summary import StepSummaries

RANK = 1


def _by_step(steps: int) -> dict[int, list[Event]]:
    """Synthetic DDP events of one rank (spans, memory samples, collectives, the loss)."""
    out: dict[int, list[Event]] = {}
    for event in synthetic_events(steps=steps, world_size=2):
        if event.rank == RANK:
            out.setdefault(event.step, []).append(event)
    return out


def _same_rows(got: StepSummaries, want: StepSummaries) -> None:
    a, b = got.rows(RANK), want.rows(RANK)
    assert [r["step"] for r in a] == [r["step"] for r in b]
    for x, y in zip(a, b, strict=True):
        assert set(x) == set(y), (x["step"], set(x) ^ set(y))
        for key in x:
            assert math.isclose(x[key], y[key], rel_tol=1e-9, abs_tol=1e-6), (x["step"], key)


def test_an_engine_sends_one_row_per_dropped_step_and_detail_for_kept_ones() -> None:
    """A 20-step run toward its target (detail_from = target - recent - 1) under
    first=2, a schedule keeping step 9, recent=3: each pull after a step sends that step
    as events when it is kept or near the target, as exactly one summary row otherwise;
    the kernel's summaries equal those built from every event."""
    steps = _by_step(20)
    policy = RecordPolicy(first=2, recent=3, wait=9, active=1, repeat=1)
    recorder = Recorder(RANK)
    recorder.set_policy(policy)
    store = EventStore(policy=policy)
    detail_from = 20 - policy.recent - 1
    cursor, detail_steps, row_steps = 0, set(), []
    for step in range(20):
        recorder.extend(steps[step])
        recorder.step = step + 1  # the step completed (as TrainStep does)
        pulled = recorder.pull(cursor, detail_from=detail_from)
        cursor = pulled["cursor"]
        events = [from_record(r) for r in pulled["records"]]
        detail_steps |= {e.step for e in events}
        row_steps += [r["step"] for r in pulled["rows"]]
        store.add_rows(pulled["rows"])
        store.add(events)
    kept = {0, 1, 9}
    near = set(range(detail_from, 20))
    assert detail_steps == kept | near
    assert row_steps == sorted(set(range(20)) - kept - near)  # one row each, nothing twice
    assert all(r["rank"] == RANK for r in pulled["rows"] or [{"rank": RANK}])
    whole = StepSummaries()
    whole.add([e for s in range(20) for e in steps[s]])
    _same_rows(store.summaries, whole)
    assert store.recorded_steps() == sorted(kept | set(range(17, 20)))
    recorder.pull(cursor)  # acknowledges the last pull: the engine holds nothing
    assert recorder.events == [] and recorder.overflow == 0


def test_a_lost_pull_is_sent_again_rows_included() -> None:
    steps = _by_step(6)
    recorder = Recorder(RANK)
    recorder.set_policy(RecordPolicy(first=1, recent=1))
    for step in range(4):
        recorder.extend(steps[step])
    recorder.step = 4
    first = recorder.pull(0, detail_from=3)
    assert [r["step"] for r in first["rows"]] == [1, 2]
    again = recorder.pull(0, detail_from=3)  # the reply never arrived: same cursor
    assert again["rows"] == first["rows"] and again["records"] == first["records"]
    recorder.extend(steps[4])
    later = recorder.pull(again["cursor"], detail_from=3)  # acknowledged: only what is new
    assert later["rows"] == [] and {r["step"] for r in later["records"]} == {4}


def test_a_run_stopped_early_gets_its_window_back_from_the_engine() -> None:
    """Steps summarised at a pull keep their detail on the engine for the policy's last
    ``recent`` of them: a Pause well before the target fills the kernel's window."""
    steps = _by_step(12)
    policy = RecordPolicy(first=1, recent=3)
    recorder = Recorder(RANK)
    recorder.set_policy(policy)
    store = EventStore(policy=policy)
    cursor = 0
    for step in range(10):  # toward a target of 1000: every step leaves as a row
        recorder.extend(steps[step])
        recorder.step = step + 1
        pulled = recorder.pull(cursor, detail_from=1000 - 4)
        cursor = pulled["cursor"]
        store.add_rows(pulled["rows"])
        store.add([from_record(r) for r in pulled["records"]])
    assert store.window_steps() == [0]
    store.add_detail([from_record(r) for r in recorder.recent_records(7)])
    assert store.window_steps() == [7, 8, 9]
    assert store.recorded_steps() == [0, 7, 8, 9]
    assert len(store.events(7, 9)) == sum(len(steps[s]) for s in (7, 8, 9))
    whole = StepSummaries()
    whole.add([e for s in range(10) for e in steps[s]])
    _same_rows(store.summaries, whole)  # the window's detail was not summarised twice
    recorder.rewind(8)  # a roll-back to step 8: its and later steps' kept detail is stale
    assert {r["step"] for r in recorder.recent_records(0)} == {7}


def test_a_long_loop_in_one_cell_stays_under_the_cap_and_counts_drops() -> None:
    """``wb.traced`` pulled only when its cell ends: steps that left the recent window
    become rows as they go; record="all" hits the cap, whose drops are counted and still
    summarised."""
    steps = _by_step(3)
    per_step = len(steps[1])

    def loop(recorder: Recorder, count: int) -> None:
        for step in range(count):
            recorder.extend(replace(e, step=step) for e in steps[1])
            recorder.step = step + 1

    bounded = Recorder(RANK)
    bounded.set_policy(schedule(first=2, recent=5, wait=49, active=1))
    loop(bounded, 400)
    held_steps = {e.step for e in bounded.events}
    assert held_steps == {0, 1, 49, 99, 149, 199, 249, 299, 349, *range(395, 400)}
    assert bounded.overflow == 0
    pulled = bounded.pull(0)
    assert len(pulled["rows"]) == 400 - len(held_steps)

    capped = Recorder(RANK)
    cap = 50 * per_step
    capped.set_policy(RecordPolicy(keep_all=True), cap=cap)
    loop(capped, 400)
    assert len(capped.events) <= cap
    assert capped.overflow > 0
    pulled = capped.pull(0)
    assert len(pulled["records"]) + capped.overflow == 400 * per_step
    summaries = StepSummaries()
    summaries.merge_rows(pulled["rows"])
    summaries.add([from_record(r) for r in pulled["records"]])
    assert summaries.steps == 400  # every step summarised, dropped detail included
