from __future__ import annotations

import json

import pytest

from tests.plots.events import MS, ddp_events, samples
from workbench.errors import ConfigError
from workbench.plots import CATEGORIES, CATEGORY_COLORS, memory_figure, update_memory_figure
from workbench.plots.style import MIB
from workbench.trace.events import MemorySample, to_record

# A full fine-tune has no frozen weights, and a category without bytes gets no trace.
DRAWN = tuple(c for c in CATEGORIES if c != "frozen")


def _traces(fig, rank: int) -> dict[str, object]:
    return {t.meta["category"]: t for t in fig.data if t.meta["rank"] == rank}


def _peak_label(fig, rank: int):
    (label,) = [a for a in fig.layout.annotations if a.name == f"peak rank {rank}"]
    return label


def test_one_stacked_group_per_rank_with_every_category_in_order() -> None:
    events = ddp_events(3)
    fig = memory_figure(events)
    for rank in (0, 1):
        traces = [t for t in fig.data if t.meta["rank"] == rank and t.stackgroup]
        # params at the bottom of the stack, the demo has "other" bytes (the batch) too
        assert [t.name for t in traces] == list(DRAWN)
        assert {t.stackgroup for t in traces} == {f"rank{rank}"}
        assert all(t.fillcolor == CATEGORY_COLORS[t.name] for t in traces)
    # one legend entry per category, shared by both ranks
    legend = [t.name for t in fig.data if t.showlegend is not False]
    assert sorted(legend) == sorted([*DRAWN, "peak"])


def test_values_are_the_samples_in_mib_per_rank_and_category() -> None:
    events = ddp_events(3)
    fig = memory_figure(events)
    for rank in (0, 1):
        fed = samples(events, rank)
        traces = _traces(fig, rank)
        for category in DRAWN:
            trace = traces[category]
            assert list(trace.x) == list(range(len(fed)))
            assert list(trace.y) == [getattr(s, category) / MIB for s in fed]
            # hover says where the sample was taken
            assert all(
                f"step {s.step}" in h and s.phase in h
                for s, h in zip(fed, trace.hovertext, strict=True)
            )


def test_time_axis_is_ms_since_the_earliest_event() -> None:
    events = ddp_events(2)
    fig = memory_figure(events, x="time")
    t0 = min(s.t for s in samples(events, 0) + samples(events, 1))
    for rank in (0, 1):
        trace = _traces(fig, rank)["params"]
        assert list(trace.x) == [(s.t - t0) / 1e6 for s in samples(events, rank)]
    assert "ms" in fig.layout.xaxis2.title.text or "ms" in fig.layout.xaxis.title.text


def test_ranks_get_their_own_axes_rank0_on_top_with_mib_titles() -> None:
    fig = memory_figure(ddp_events(2))
    assert {t.yaxis for t in fig.data if t.meta["rank"] == 0} == {"y"}
    assert {t.yaxis for t in fig.data if t.meta["rank"] == 1} == {"y2"}
    assert fig.layout.yaxis.domain[0] > fig.layout.yaxis2.domain[1]
    assert "rank 0" in fig.layout.yaxis.title.text and "MiB" in fig.layout.yaxis.title.text
    assert "rank 1" in fig.layout.yaxis2.title.text and "MiB" in fig.layout.yaxis2.title.text
    # only the bottom subplot carries the x title
    assert fig.layout.xaxis2.title.text and not fig.layout.xaxis.title.text


def test_peak_marker_is_the_true_maximum_of_the_totals() -> None:
    events = ddp_events(4)
    fig = memory_figure(events)
    for rank in (0, 1):
        fed = samples(events, rank)
        totals = [s.params + s.grads + s.optimizer + s.activations + s.other for s in fed]
        peak = _traces(fig, rank)["peak"]
        assert list(peak.y) == [max(totals) / MIB]
        assert list(peak.x) == [totals.index(max(totals))]
        # and the stacked areas reach exactly that height at that sample
        traces = _traces(fig, rank)
        i = int(peak.x[0])
        assert sum(traces[c].y[i] for c in DRAWN) == pytest.approx(peak.y[0])


def test_capacity_draws_an_oom_line_per_rank_and_flags_a_peak_above_it() -> None:
    events = ddp_events(2)
    highest = max(s.total for s in samples(events, 0) + samples(events, 1))
    capacity = highest - MIB  # the demo exceeds it at its peak
    fig = memory_figure(events, capacity=capacity)
    lines = {s.name: s for s in fig.layout.shapes}
    assert set(lines) == {"capacity rank 0", "capacity rank 1"}
    for rank, axis in ((0, "y"), (1, "y2")):
        line = lines[f"capacity rank {rank}"]
        assert line.type == "line" and line.yref == axis
        assert line.y0 == line.y1 == capacity / MIB
        assert (line.x0, line.x1) == (0, 1) and line.xref.endswith("domain")
        assert "OOM" in _peak_label(fig, rank).text
    assert "capacity" in fig.layout.title.text
    roomy = memory_figure(events, capacity=highest * 2)
    assert all("OOM" not in _peak_label(roomy, rank).text for rank in (0, 1))
    assert memory_figure(events).layout.shapes == ()


def test_records_and_objects_give_the_same_figure() -> None:
    events = ddp_events(2)
    from_objects = memory_figure(events, capacity=1 << 30)
    from_records = memory_figure([to_record(e) for e in events], capacity=1 << 30)
    assert json.loads(from_objects.to_json()) == json.loads(from_records.to_json())


def test_ranks_filter_and_preset_layout() -> None:
    events = ddp_events(2)
    fig = memory_figure(events, ranks=[1])
    assert {t.meta["rank"] for t in fig.data} == {1}
    empty = memory_figure(ranks=[0, 1], capacity=1 << 30)
    assert len(empty.data) == 0 and len(empty.layout.shapes) == 2
    assert empty.layout.yaxis2.domain is not None


def test_other_category_appears_on_top_at_its_first_bytes() -> None:
    def sample(i: int, other: int) -> MemorySample:
        return MemorySample(
            rank=0,
            step=0,
            phase="forward",
            t=i * MS,
            params=4 * MIB,
            grads=0,
            optimizer=0,
            activations=i * MIB,
            other=other,
        )

    first = [sample(i, 0) for i in range(3)]
    later = [sample(i, 2 * MIB) for i in range(3, 5)]
    fig = memory_figure(first)
    assert "other" not in _traces(fig, 0)
    update_memory_figure(fig, later)
    other = _traces(fig, 0)["other"]
    assert list(other.x) == [3, 4] and list(other.y) == [2.0, 2.0]
    assert fig.data[-1] is other  # appended last: stacks on top
    assert list(_traces(fig, 0)["peak"].y) == [later[-1].total / MIB]


def test_bad_input_names_the_value_and_the_choices() -> None:
    with pytest.raises(ConfigError, match=r"x='bytes'.*'sample'.*'time'"):
        memory_figure([], x="bytes")
    with pytest.raises(ConfigError, match="capacity=0"):
        memory_figure([], capacity=0)
    with pytest.raises(ConfigError, match="ranks contains -1"):
        memory_figure([], ranks=[-1])
    with pytest.raises(ConfigError, match="'hello'"):
        memory_figure(["hello"])
    with pytest.raises(ConfigError, match="unknown event kind"):
        memory_figure([{"kind": "nope"}])


def test_memory_is_drawn_as_held_steps_with_a_phase_s_own_high_marked_between() -> None:
    """Samples are taken at phase ends: the bytes hold from one to the next ("hv" steps),
    and the tracer's "peak" sample (activations that rose and were freed inside a phase)
    is a marker half-way to the end sample of its phase, not a point of the curve."""

    def at(i: int, phase: str, activations: int, label: str = "") -> MemorySample:
        return MemorySample(
            rank=0, step=0, phase=phase, t=i * MS, params=MIB, grads=0, optimizer=0,
            activations=activations,
            label=label,
        )  # fmt: skip

    events = [
        at(0, "data", 0),
        at(1, "forward", 4 * MIB, "peak"),  # forward's high, before its end sample
        at(2, "forward", 2 * MIB),
        at(3, "backward", 0),
    ]
    for x in ("sample", "time"):
        fig = memory_figure(events, x=x)
        traces = _traces(fig, 0)
        assert all(t.line.shape == "hv" for t in traces.values() if t.stackgroup)
        assert list(traces["activations"].y) == [0, 2, 0]  # the end samples only
        inner = traces["inner peak"]
        assert list(inner.y) == [5.0]  # its total: params + activations at the high
        assert list(inner.x) == ([0.5] if x == "sample" else [1.0])
        assert list(traces["activations"].x) == ([0, 1, 2] if x == "sample" else [0, 2, 3])
        assert list(traces["peak"].y) == [5.0]  # the highest of the rank, the inner one
        names = [t.name for t in fig.data if t.showlegend is not False]
        assert "highest inside a phase" in names
