from __future__ import annotations

import statistics

import pytest

from tests.plots.events import MS, ddp_events
from workbench.errors import ConfigError
from workbench.plots import bandwidth_figure, loss_figure, update_bandwidth_figure
from workbench.plots.loss import RANK_COLORS, rank_span, update_loss_figure
from workbench.trace.events import CommEvent, Metric, to_record


def test_loss_one_line_per_rank_with_reference() -> None:
    events = ddp_events(4)
    reference = [2.3, 2.1, 1.9, 1.8]
    fig = loss_figure(events, reference=reference)
    ref = next(t for t in fig.data if t.name == "single device")
    assert list(ref.x) == [0, 1, 2, 3] and list(ref.y) == reference
    assert ref.line.dash == "dash"
    for rank in (0, 1):
        fed = [e for e in events if isinstance(e, Metric) and e.rank == rank]
        trace = next(t for t in fig.data if t.name == f"rank {rank}")
        assert list(trace.x) == [m.step for m in fed]
        assert list(trace.y) == [m.value for m in fed]
    assert fig.layout.xaxis.title.text == "step" and fig.layout.yaxis.title.text == "loss"


def test_loss_rank0_only_and_other_metrics() -> None:
    events = [*ddp_events(2), Metric(rank=0, step=0, name="grad_norm", value=3.5)]
    fig = loss_figure(events, ranks=[0])
    assert [t.name for t in fig.data] == ["rank 0"]
    norms = loss_figure(events, name="grad_norm")
    assert [list(t.y) for t in norms.data] == [[3.5]]
    assert "Grad_norm" in norms.layout.title.text


def test_bandwidth_from_pairs_is_nccl_tests_busbw_on_log_x() -> None:
    n = 4
    points = [(1 << 20, 2e-3), (1 << 20, 3e-3), (1 << 20, 2.5e-3), (64 << 20, 0.1)]
    fig = bandwidth_figure(points, op="all_reduce", world_size=n)
    runs, median = fig.data
    factor = 2 * (n - 1) / n  # all-reduce bus factor
    assert list(runs.x) == [p[0] for p in points]
    assert list(runs.y) == pytest.approx([b / s * factor / 1e9 for b, s in points])
    assert list(median.x) == [1 << 20, 64 << 20]
    one_mib = [b / s * factor / 1e9 for b, s in points[:3]]
    assert median.y[0] == pytest.approx(statistics.median(one_mib))
    assert fig.layout.xaxis.type == "log"
    # one tick per decade, no minor digits between ("5, 10k, 2, 5, 100k" before)
    assert fig.layout.xaxis.dtick == 1 and fig.layout.xaxis.exponentformat == "SI"
    assert "GB/s" in fig.layout.yaxis.title.text and "bytes" in fig.layout.xaxis.title.text
    assert all("busbw" in h and "MiB" in h for h in runs.hovertext)


def test_bandwidth_from_events_and_records_filters_by_op() -> None:
    events = [e for e in ddp_events(2) if isinstance(e, CommEvent)]
    gather = CommEvent(
        rank=0, step=0, op="all_gather", bytes=1 << 20, group_size=2, start=0, end=MS
    )
    fig = bandwidth_figure([to_record(e) for e in events] + [gather])
    runs = fig.data[0]
    assert list(runs.y) == pytest.approx([e.busbw / 1e9 for e in events])
    every = bandwidth_figure([*events, gather], op=None)
    assert {t.meta["op"] for t in every.data} == {"all_reduce", "all_gather"}


def test_bandwidth_update_refreshes_the_median() -> None:
    fig = bandwidth_figure([(4096, 1e-4)], op="all_reduce", world_size=2)
    update_bandwidth_figure(fig, [(4096, 3e-4), (4096, 2e-4)])
    assert list(fig.data[1].y) == pytest.approx([4096 / 2e-4 / 1e9])


def test_bandwidth_bad_points() -> None:
    with pytest.raises(ConfigError, match="world_size"):
        bandwidth_figure([(1024, 1e-3)])
    with pytest.raises(ConfigError, match="must be > 0"):
        bandwidth_figure([(1024, 0.0)], world_size=2)
    with pytest.raises(ConfigError, match="world_size=0"):
        bandwidth_figure([], world_size=0)


def _losses(values: dict[int, list[float]], start: int = 0) -> list[Metric]:
    return [
        Metric(rank=rank, step=start + step, name="loss", value=v)
        for rank, series in values.items()
        for step, v in enumerate(series)
    ]


def _legend(fig) -> list[str]:
    return [t.name for t in fig.data if t.showlegend is not False]


def test_identical_rank_curves_share_one_legend_entry_that_says_so() -> None:
    same = [2.5, 2.25, 2.0]
    fig = loss_figure(_losses({0: same, 1: same}), reference=[2.5, 2.25, 2.0])
    assert _legend(fig) == ["single device", "ranks 0–1 identical"]
    rank0, rank1 = (next(t for t in fig.data if t.meta["key"] == f"loss/rank/{r}") for r in (0, 1))
    assert rank0.legendgroup == rank1.legendgroup  # one legend click shows or hides both
    assert rank1.hoverinfo == "skip" and "ranks 0–1" in rank0.hovertemplate
    assert list(rank1.y) == same  # still drawn, on top of rank 0's line
    # the line on top is drawn in the color of the legend's swatch (rank 0's)
    assert rank1.line.color == rank1.marker.color == rank0.line.color == RANK_COLORS[0]


def test_ranks_that_part_ways_get_their_own_entries_again() -> None:
    fig = loss_figure(_losses({0: [2.5, 2.25], 1: [2.5, 2.25]}))
    assert _legend(fig) == ["ranks 0–1 identical"]
    update_loss_figure(fig, _losses({0: [2.0], 1: [2.1]}, start=2))
    assert _legend(fig) == ["rank 0", "rank 1"]
    assert all(t.hoverinfo == "all" for t in fig.data)
    assert [t.line.color for t in fig.data] == [RANK_COLORS[0], RANK_COLORS[1]]
    assert [t.marker.color for t in fig.data] == [RANK_COLORS[0], RANK_COLORS[1]]


def test_identical_sets_are_found_among_many_ranks() -> None:
    a, b = [3.0, 2.0], [3.0, 2.5]
    fig = loss_figure(_losses({0: a, 1: b, 2: a, 3: b, 4: b, 5: [1.0, 1.0]}))
    assert _legend(fig) == ["ranks 0, 2 identical", "ranks 1, 3–4 identical", "rank 5"]
    assert rank_span([4, 0, 1, 2, 6]) == "0–2, 4, 6"


def test_loss_ticks_are_whole_steps() -> None:
    for steps, dtick in ((3, 1), (4, 1), (30, 5), (200, 20)):
        fig = loss_figure(_losses({0: [1.0] * steps}))
        assert fig.layout.xaxis.tick0 == 0 and fig.layout.xaxis.dtick == dtick
        assert (steps - 1) / dtick <= 10
    assert loss_figure([], reference=[1.0] * 50).layout.xaxis.dtick == 5
