"""Building from all events == building from a prefix and extending with the rest."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable

import numpy as np
import plotly.graph_objects as go
import pytest

from tests.plots.events import ddp_events, of_steps
from workbench.errors import ConfigError
from workbench.plots import (
    bandwidth_figure,
    comm_timeline_figure,
    extend_figure,
    loss_figure,
    memory_figure,
    update_bandwidth_figure,
    update_comm_timeline,
    update_loss_figure,
    update_memory_figure,
)
from workbench.plots.event_input import as_float_array, event_time
from workbench.trace.events import MemorySample, Metric, to_record

FIGURES: dict[str, tuple[Callable, Callable]] = {
    "memory": (lambda ev: memory_figure(ev, capacity=200 << 20), update_memory_figure),
    "memory-time": (lambda ev: memory_figure(ev, x="time"), update_memory_figure),
    "timeline": (comm_timeline_figure, update_comm_timeline),
    "loss": (lambda ev: loss_figure(ev, reference=[2.3, 2.2, 2.1]), update_loss_figure),
    "bandwidth": (bandwidth_figure, update_bandwidth_figure),
}


def _plain(fig) -> dict:
    return json.loads(fig.to_json())


@pytest.mark.parametrize("name", FIGURES)
def test_half_then_extend_equals_all_at_once(name: str) -> None:
    build, update = FIGURES[name]
    events = ddp_events(6)
    whole = build(events)
    grown = build(of_steps(events, range(3)))
    assert grown is update(grown, of_steps(events, range(3, 6)))
    assert _plain(grown) == _plain(whole)
    assert len(grown.data) == len(whole.data)


@pytest.mark.parametrize("name", FIGURES)
def test_one_phase_at_a_time_equals_all_at_once(name: str) -> None:
    """The stepper's cadence: one small batch per phase, as records from the engines."""
    build, _ = FIGURES[name]
    events = ddp_events(3)
    whole = build(events)
    grown = build(events[:15])  # rank 0's first step: rank 1 arrives later
    rest = events[15:]
    # The time origin is fixed by the first batch; in this trace it holds the earliest event.
    assert min(map(event_time, events[:15])) == min(map(event_time, events))
    for i in range(0, len(rest), 4):
        extend_figure(grown, [to_record(e) for e in rest[i : i + 4]])
    assert _plain(grown) == _plain(whole)


@pytest.mark.parametrize("name", ["memory", "timeline", "loss"])
def test_figure_widget_grows_like_the_figure(name: str) -> None:
    build, update = FIGURES[name]
    events = ddp_events(4)
    whole = build(events)
    widget = go.FigureWidget(build(of_steps(events, range(2))))
    update(widget, of_steps(events, range(2, 4)))
    assert _plain(widget)["data"] == _plain(whole)["data"]
    # ticks, ranges, annotations and legend names too: every update rewrites them
    assert _plain(widget)["layout"] == _plain(whole)["layout"]


def test_new_rank_adds_traces_and_keeps_the_old_ones() -> None:
    events = ddp_events(2)
    fig = memory_figure(events)
    before = [t.meta["key"] for t in fig.data]
    third = [
        dataclasses.replace(e, rank=2)
        for e in events
        if isinstance(e, MemorySample) and e.rank == 0
    ]
    update_memory_figure(fig, third)
    after = [t.meta["key"] for t in fig.data]
    assert after[: len(before)] == before
    assert {k.split("/")[1] for k in after[len(before) :]} == {"2"}
    assert len(after) - len(before) == len(before) // 2  # same traces as one existing rank
    assert fig.layout.yaxis3.title.text.startswith("rank 2")
    assert fig.layout.yaxis2.domain[0] > fig.layout.yaxis3.domain[1]


def test_nothing_new_leaves_the_figure_alone() -> None:
    fig = memory_figure(ddp_events(1))
    before = _plain(fig)
    update_memory_figure(fig, [])
    update_memory_figure(fig, [e for e in ddp_events(1) if not isinstance(e, MemorySample)])
    assert _plain(fig) == before


def test_extend_figure_rejects_foreign_figures() -> None:
    with pytest.raises(ConfigError, match="not built by workbench.plots"):
        extend_figure(go.Figure(), ddp_events(1))
    with pytest.raises(ConfigError, match="fig=dict"):
        update_loss_figure({}, [])


def test_time_origin_stays_put_when_an_earlier_event_arrives_late() -> None:
    events = ddp_events(1)
    rank0 = [e for e in events if e.rank == 0]
    rank1 = [e for e in events if e.rank == 1]
    fig = comm_timeline_figure(rank0)
    origin = fig.layout.meta["workbench"]["t0"]
    update_comm_timeline(fig, rank1)
    assert fig.layout.meta["workbench"]["t0"] == origin  # history is never shifted
    first1 = min(e.start for e in rank1 if hasattr(e, "start"))
    starts = [
        b for t in fig.data for b, y in zip(t.base, t.y, strict=True) if y.startswith("rank 1")
    ]
    assert min(starts) == (first1 - int(origin)) / 1e6


@pytest.mark.parametrize("name", FIGURES)
def test_a_figure_restored_from_json_keeps_growing(name: str) -> None:
    """Saved figures (JSON, pickle, deepcopy) hold numeric data as base64 typed arrays."""
    build, update = FIGURES[name]
    events = ddp_events(4)
    restored = go.Figure(json.loads(build(of_steps(events, range(2))).to_json()))
    update(restored, of_steps(events, range(2, 4)))
    grown, whole = _plain(restored), _plain(build(events))
    for a, b in zip(grown["data"], whole["data"], strict=True):
        for prop in ("x", "y", "base"):
            if isinstance(b.get(prop), list):  # labels (the timeline's lanes)
                assert a.get(prop) == b.get(prop)
            else:
                assert np.array_equal(as_float_array(a.get(prop)), as_float_array(b.get(prop)))
        assert a.get("hovertext") == b.get("hovertext")
    assert grown["layout"]["meta"] == whole["layout"]["meta"]


def test_identical_ranks_grown_step_by_step_equal_all_at_once() -> None:
    """The 'ranks 0–1 identical' naming depends on the whole curves, not on the batches."""
    losses = [2.0, 1.5, 1.5, 1.25]
    events = [
        Metric(rank=rank, step=step, name="loss", value=v + (0.5 if rank == 1 and step == 2 else 0))
        for step, v in enumerate(losses)
        for rank in (0, 1)
    ]
    whole = loss_figure(events)
    grown = loss_figure(events[:1])
    for i in range(1, len(events)):
        update_loss_figure(grown, events[i : i + 1])
    assert _plain(grown) == _plain(whole)
    assert [t.name for t in whole.data] == ["rank 0", "rank 1"]  # they differ at step 2
    same = loss_figure(events[:4])
    assert [t.name for t in same.data if t.showlegend] == ["ranks 0–1 identical"]
