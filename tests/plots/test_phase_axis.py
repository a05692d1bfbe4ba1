"""Phases and steps on the figures' axes: read off the figure objects (what plotly draws)."""

from __future__ import annotations

import dataclasses
import itertools
import re

import pytest

from tests.plots.events import MS, ddp_events, samples
from workbench.plots import (
    comm_timeline_figure,
    memory_figure,
    update_comm_timeline,
    update_memory_figure,
)
from workbench.plots.phase_axis import MAX_PHASE_TICKS, MAX_STEP_TICKS, STEP_LABELS_ACROSS, spaced
from workbench.plots.style import MIB, base_phase
from workbench.plots.timeline import IDLE_MS, KEPT_MS
from workbench.trace.events import MemorySample, PhaseSpan

PHASES = ("data", "forward", "backward", "sync", "optimizer")


def _lines(text: str) -> list[str]:
    """The visible lines of a tick label (``<br>``-separated, tags dropped)."""
    return [re.sub(r"<[^>]+>", "", line) for line in text.split("<br>") if line]


def _step(rank: int, step: int, t: int) -> list[MemorySample]:
    """A real-stepper-like step: one sample per phase, two per forward micro-batch."""
    phases = ["data", "forward[mb=0]", "forward[mb=1]", "backward", "sync", "optimizer"]
    return [
        MemorySample(
            rank=rank,
            step=step,
            phase=phase,
            t=t + i * MS,
            params=4 * MIB,
            grads=(2 * MIB if phase in ("backward", "sync", "optimizer") else 0),
            optimizer=(8 * MIB if step or phase == "optimizer" else 0),
            activations=(3 * MIB if phase.startswith("forward") else 0),
            other=0,
        )
        for i, phase in enumerate(phases)
    ]


def _run(steps: int, ranks: int = 2) -> list[MemorySample]:
    return [
        s
        for step in range(steps)
        for rank in range(ranks)
        for s in _step(rank, step, step * 10 * MS)
    ]


def test_sample_axis_names_each_phase_at_a_whole_sample_of_it() -> None:
    events = _run(3)
    fig = memory_figure(events)
    for rank, axis in ((0, fig.layout.xaxis), (1, fig.layout.xaxis2)):
        fed = samples(events, rank)
        assert axis.tickmode == "array"  # no automatic (numeric, possibly 0.5) ticks
        assert all(float(v).is_integer() for v in axis.tickvals)
        names = [_lines(t) for t in axis.ticktext]
        # one label per run of samples: data, forward (both micro-batches), backward, sync,
        # optimizer, in every step
        assert [n[0] for n in names] == list(PHASES) * 3
        for value, lines in zip(axis.tickvals, names, strict=True):
            assert base_phase(fed[int(value)].phase) == lines[0]  # the label is in its band
        # a step's first label names the step
        steps = [n[1] for n in names if len(n) > 1]
        assert steps == ["step 0", "step 1", "step 2"]


def test_a_sample_outside_any_phase_is_named_by_its_label_not_a_question_mark() -> None:
    # what a training run records: a "start" sample before step 0's first phase
    start = MemorySample(
        rank=0, step=0, phase="", t=0, params=4 * MIB, grads=0, optimizer=0, activations=0,
        label="start",
    )  # fmt: skip
    unlabelled = dataclasses.replace(start, label="", t=MS)
    events = [start, unlabelled, *(_step(0, 0, 2 * MS))]
    names = [_lines(t)[0] for t in memory_figure(events).layout.xaxis.ticktext]
    assert names == ["start", "no phase", *PHASES]


def test_step_boundaries_are_dotted_between_the_steps() -> None:
    fig = memory_figure(_run(3))
    minor = fig.layout.xaxis.minor
    assert list(minor.tickvals) == [5.5, 11.5]  # between sample 5 (optimizer) and 6 (data)
    assert minor.showgrid and minor.griddash == "dot"
    assert fig.layout.xaxis.showgrid is False  # no grid line through the middle of a band
    # no boundary tick below the axis: it would strike through the last phase name of a
    # step ("optimizer", wider than its one-sample band, reaches over the boundary)
    assert minor.ticks == ""


def test_names_alternate_between_two_lines_so_neighbours_never_collide() -> None:
    ticks = memory_figure(_run(2), ranks=[0]).layout.xaxis.ticktext
    rows = [t.split("<br>").index(next(x for x in t.split("<br>") if x)) for t in ticks]
    assert rows == [0, 1] * 5
    assert memory_figure(_run(2)).layout.xaxis.tickangle == 0  # plotly's tilt is off
    # the names start a few px below the axis, clear of the y axis's "0" (drawn half below)
    assert memory_figure(_run(2)).layout.xaxis.ticklabelstandoff >= 6


def test_a_long_run_names_steps_only_and_still_whole_samples() -> None:
    steps = 60
    fig = memory_figure(_run(steps, ranks=1))
    axis = fig.layout.xaxis
    assert 5 * steps > MAX_PHASE_TICKS
    assert 0 < len(axis.tickvals) <= MAX_STEP_TICKS
    assert all(float(v).is_integer() for v in axis.tickvals)
    assert all(re.fullmatch(r"step \d+", _lines(t)[0]) for t in axis.ticktext)
    labelled = [int(_lines(t)[0].split()[1]) for t in axis.ticktext]
    stride = labelled[1] - labelled[0]
    assert labelled == list(range(0, steps, stride))
    assert len(axis.minor.tickvals) == len(labelled) - 1  # a boundary per named step


def test_time_axis_keeps_its_numbers_and_dots_the_step_boundaries() -> None:
    events = _run(2)
    fig = memory_figure(events, x="time")
    assert fig.layout.xaxis.tickmode is None  # plotly's numeric ms ticks
    t0 = min(s.t for s in events)
    last0 = max(s.t for s in samples(events, 0) if s.step == 0)
    first1 = min(s.t for s in samples(events, 0) if s.step == 1)
    assert list(fig.layout.xaxis.minor.tickvals) == [((last0 + first1) / 2 - t0) / 1e6]


def _peaks(fig) -> dict[str, object]:
    return {a.name: a for a in fig.layout.annotations if a.name.startswith("peak")}


@pytest.mark.parametrize("capacity", [None, 40 << 20, 1 << 30])
def test_peak_label_sits_above_the_peak_inside_the_axis_range(capacity: int | None) -> None:
    events = ddp_events(3)
    fig = memory_figure(events, capacity=capacity)
    labels = _peaks(fig)
    assert set(labels) == {"peak rank 0", "peak rank 1"}
    for rank, yaxis in ((0, fig.layout.yaxis), (1, fig.layout.yaxis2)):
        label = labels[f"peak rank {rank}"]
        highest = max(s.total for s in samples(events, rank)) / MIB
        assert label.y == pytest.approx(highest) and label.yref == ("y" if rank == 0 else "y2")
        assert label.yanchor == "bottom" and label.yshift > 0 and not label.showarrow
        low, high = yaxis.range
        assert yaxis.autorange is False and low == 0
        top = max(highest, (capacity or 0) / MIB)
        # at least a fifth of the panel above the highest line is left for the label
        assert high >= top / 0.8 and label.y < high
        assert "peak" in label.text


def test_peak_label_is_anchored_away_from_the_edge_it_is_near() -> None:
    def at(i: int, total: int) -> MemorySample:
        return MemorySample(
            rank=0, step=0, phase="forward", t=i * MS, params=total, grads=0, optimizer=0,
            activations=0,
        )  # fmt: skip

    rising = memory_figure([at(i, (i + 1) * MIB) for i in range(10)])
    assert _peaks(rising)["peak rank 0"].xanchor == "right"  # the last sample
    falling = memory_figure([at(i, (10 - i) * MIB) for i in range(10)])
    assert _peaks(falling)["peak rank 0"].xanchor == "left"  # the first sample
    middle = memory_figure([at(i, (5 - abs(i - 5)) * MIB) for i in range(11)])
    assert _peaks(middle)["peak rank 0"].xanchor == "center"
    # a new peak later in the run moves the label, in place
    update_memory_figure(falling, [at(10 + i, 20 * MIB) for i in range(1)])
    assert _peaks(falling)["peak rank 0"].xanchor == "right"
    assert _peaks(falling)["peak rank 0"].y == 20


def test_timeline_names_phases_in_the_bars_and_steps_on_top() -> None:
    events = ddp_events(3)
    fig = comm_timeline_figure(events)
    for trace in fig.data:
        if len(trace.x) and trace.meta["lane"] == "phase":
            assert trace.text == trace.name  # the phase written in each of its bars
            assert trace.textposition == "inside"
        elif len(trace.x) and trace.name == "wait":
            assert trace.text is None and trace.textposition == "none"
        elif len(trace.x):
            # no name in a collective's bar (a wait bar over its start would print over
            # it): what it moved, per bar, at its end
            hovers = [h.split("<br>")[0] for h in trace.hovertext]
            assert all(t.split(" · ")[0] in h for t, h in zip(trace.text, hovers, strict=True))
            assert all(
                re.fullmatch(r"[\d.]+ (B|KiB|MiB) · [\d.]+ (MB|GB)/s", t) for t in trace.text
            )
            assert trace.textposition == "inside" and trace.insidetextanchor == "end"
    assert {t.meta["lane"] for t in fig.data if len(t.x)} == {"phase", "comm"}
    assert fig.layout.uniformtext.mode == "hide"  # a name that does not fit is left out
    top = fig.layout.xaxis2
    assert top.overlaying == "x" and top.matches == "x" and top.side == "top"
    assert list(top.ticktext) == ["<b>step 0</b>", "<b>step 1</b>", "<b>step 2</b>"]
    spans = [e for e in events if isinstance(e, PhaseSpan)]
    t0 = min(e.start for e in events if hasattr(e, "start"))
    starts = [min(e.start for e in spans if e.step == s) for s in (1, 2)]
    # each step's start (over every rank) is dotted; its name sits over the middle of it
    assert list(fig.layout.xaxis.minor.tickvals) == pytest.approx(
        [(t - t0) / 1e6 for t in starts], abs=1e-3
    )
    bounds = [0.0, *fig.layout.xaxis.minor.tickvals]
    assert all(a < v for a, v in zip(bounds, top.tickvals, strict=True))


def _spans(step_ms: list[tuple[float, float]]) -> list[PhaseSpan]:
    """One rank's forward spans at these (start, end) ms, one step each."""
    return [
        PhaseSpan(rank=0, step=i, phase="forward", start=int(a * 1e6), end=int(b * 1e6))
        for i, (a, b) in enumerate(step_ms)
    ]


def test_pauses_between_clicks_are_cut_out_of_the_timeline_and_marked() -> None:
    # three 25 ms steps with 20 s and 30 s of talking between them, then one 10 ms late
    events = _spans([(0, 25), (20_025, 20_050), (50_050, 50_075)])
    fig = comm_timeline_figure(events[:2])
    update_comm_timeline(fig, events[2:])
    bars = [v for t in fig.data for b, x in zip(t.base, t.x, strict=True) for v in (b, b + x)]
    kept = KEPT_MS
    assert bars == pytest.approx([0, 25, 25 + kept, 50 + kept, 50 + 2 * kept, 75 + 2 * kept])
    cuts = [s for s in fig.layout.shapes if s.line.dash == "dash"]
    assert [c.x0 for c in cuts] == pytest.approx([25 + kept / 2, 50 + kept * 1.5])
    assert "2 pauses (50.0 s) cut out" in fig.layout.xaxis.title.text
    # the same events in one batch: the same figure
    whole = comm_timeline_figure(events)
    assert whole.layout.shapes == fig.layout.shapes
    # a late event from before the last cut lands at its own (busy) time
    late = PhaseSpan(rank=1, step=1, phase="forward", start=int(20_030e6), end=int(20_040e6))
    update_comm_timeline(fig, [late])
    forward = next(t for t in fig.data if t.name == "forward")
    assert forward.base[-1] == pytest.approx(30 + kept)
    # pauses under IDLE_MS stay as they are
    short = comm_timeline_figure(_spans([(0, 25), (25 + IDLE_MS - 1, 50 + IDLE_MS)]))
    assert not short.layout.shapes
    assert short.data[1].base[1] == pytest.approx(25 + IDLE_MS - 1)


def test_step_labels_are_thinned_to_what_fits_side_by_side() -> None:
    # step 0 clicked phase by phase (wide, pauses kept at 1 ms each), then 12 narrow steps
    assert spaced([0, 1, 2, 3], 4) == [0, 1, 2, 3]
    # labels at least 24 / 9 apart: 1 and 2 are too close to 0, 13 to 12
    assert spaced([0.0, 1, 2, 12, 13, 24], 24) == [0, 3, 5]
    wide = [(0.0, 100.0)] + [(100.0 + 10 * i, 110.0 + 10 * i) for i in range(30)]
    fig = comm_timeline_figure(_spans(wide))
    centers = list(fig.layout.xaxis2.tickvals)
    extent = 400.0
    assert all(b - a >= extent / STEP_LABELS_ACROSS for a, b in itertools.pairwise(centers))
    assert STEP_LABELS_ACROSS - 3 <= len(centers) <= STEP_LABELS_ACROSS + 1
