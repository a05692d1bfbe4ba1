from __future__ import annotations

import pytest

from tests.plots.events import ddp_events, pipeline_events
from workbench.errors import ConfigError
from workbench.plots import (
    base_phase,
    comm_timeline_figure,
    loss_figure,
    op_color,
    phase_color,
    update_comm_timeline,
)
from workbench.plots.timeline import lane_names
from workbench.trace.events import CommEvent, PhaseSpan


def _bars(fig) -> list[dict]:
    """Every bar as a dict (trace name, lane, start, end, hover) in figure coordinates."""
    out = []
    for trace in fig.data:
        for y, base, length, hover in zip(
            trace.y, trace.base, trace.x, trace.hovertext, strict=True
        ):
            out.append(
                {"name": trace.name, "lane": y, "start": base, "end": base + length, "hover": hover}
            )
    return out


def test_two_lanes_per_rank_in_rank_order() -> None:
    fig = comm_timeline_figure(ddp_events(2))
    assert list(fig.layout.yaxis.categoryarray) == [*lane_names(0), *lane_names(1)]
    assert fig.layout.yaxis.autorange == "reversed"  # rank 0 on top
    assert fig.layout.barmode == "overlay"
    assert "ms" in fig.layout.xaxis.title.text


def test_every_span_and_collective_is_a_bar_at_its_time() -> None:
    events = ddp_events(3)
    fig = comm_timeline_figure(events)
    t0 = min(e.start for e in events if isinstance(e, PhaseSpan | CommEvent))
    bars = [b for b in _bars(fig) if b["name"] != "wait"]  # waits: test_stragglers.py
    spans = [e for e in events if isinstance(e, PhaseSpan | CommEvent)]
    assert len(bars) == len(spans)
    for e in spans:
        compute, comm = lane_names(e.rank)
        name = e.op if isinstance(e, CommEvent) else base_phase(e.phase)
        lane = comm if isinstance(e, CommEvent) else compute
        match = [
            b
            for b in bars
            if b["name"] == name
            and b["lane"] == lane
            and b["start"] == pytest.approx((e.start - t0) / 1e6)
            and b["end"] == pytest.approx((e.end - t0) / 1e6)
        ]
        assert len(match) == 1, e


def test_collective_hover_has_op_bytes_and_busbw() -> None:
    events = ddp_events(2)
    fig = comm_timeline_figure(events)
    comms = [e for e in events if isinstance(e, CommEvent)]
    hovers = [b["hover"] for b in _bars(fig) if b["name"] == "all_reduce"]
    assert len(hovers) == len(comms)
    for e in comms:
        busbw = f"busbw {e.busbw / 1e9:.3f} GB/s"
        assert any(
            "all_reduce" in h
            and f"{e.bytes} bytes" in h
            and busbw in h
            and f"rank {e.rank} · step {e.step}" in h
            for h in hovers
        ), e


def test_ddp_all_reduce_overlaps_backward_on_each_rank() -> None:
    fig = comm_timeline_figure(ddp_events(2))
    bars = _bars(fig)
    for rank in (0, 1):
        compute, comm = lane_names(rank)
        backward = [b for b in bars if b["lane"] == compute and b["name"] == "backward"]
        reduces = [b for b in bars if b["lane"] == comm and b["name"] == "all_reduce"]
        overlapping = [
            r for r in reduces for b in backward if r["start"] < b["end"] and r["end"] > b["start"]
        ]
        assert overlapping, f"no all-reduce overlaps backward on rank {rank}"


def test_micro_batches_share_the_base_phase_color_and_ops_get_theirs() -> None:
    events = pipeline_events()
    fig = comm_timeline_figure(events)
    names = [t.name for t in fig.data]
    assert names.count("forward") == 1  # forward[mb=0] and forward[mb=1] in one trace
    forward = next(t for t in fig.data if t.name == "forward")
    assert forward.marker.color == phase_color("forward")
    assert sum("forward[mb=1]" in h for h in forward.hovertext) == 2  # one per rank
    for op in ("send", "recv", "all_gather", "reduce_scatter"):
        trace = next(t for t in fig.data if t.name == op)
        assert trace.marker.color == op_color(op)
        assert set(trace.y) <= {lane_names(0)[1], lane_names(1)[1]}
    assert len({op_color(op) for op in ("send", "recv", "all_gather", "reduce_scatter")}) == 4


def test_t0_and_rank_filter() -> None:
    events = ddp_events(1)
    first = min(e.start for e in events if isinstance(e, PhaseSpan | CommEvent))
    shifted = comm_timeline_figure(events, t0=first - 5_000_000)
    # (the empty trace that carries the step axis has no bars)
    assert min(min(t.base) for t in shifted.data if len(t.base)) == pytest.approx(5.0)
    only = comm_timeline_figure(events, ranks=[1])
    assert list(only.layout.yaxis.categoryarray) == list(lane_names(1))
    assert {y for t in only.data for y in t.y} <= set(lane_names(1))


def test_updating_the_wrong_figure_kind_is_an_error() -> None:
    with pytest.raises(ConfigError, match=r"'loss'.*'timeline'"):
        update_comm_timeline(loss_figure([]), ddp_events(1))
