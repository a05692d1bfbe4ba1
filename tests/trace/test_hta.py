"""Per-rank traces that Holistic Trace Analysis loads, its temporal breakdown read back."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.trace.test_stragglers import _steps
from workbench.trace.events import CommEvent, PhaseSpan
from workbench.trace.hta import to_hta
from workbench.trace.stragglers import collective_waits

# HTA parses each rank's file in a process of its own
pytestmark = pytest.mark.engines


def test_hta_reads_compute_transfer_and_the_wait_as_idle(tmp_path: Path) -> None:
    pytest.importorskip("hta")
    from hta.trace_analysis import TraceAnalysis

    events = _steps(late_rank=1, extra_ms=30, steps=4)
    paths = to_hta(events, tmp_path)
    assert sorted(p.name for p in paths) == ["rank0.json", "rank1.json"]
    analysis = TraceAnalysis(trace_dir=str(tmp_path), include_last_profiler_step=True)
    breakdown = analysis.get_temporal_breakdown(visualize=False).set_index("rank")

    waits = collective_waits(events)
    for rank in (0, 1):
        compute_us = sum(
            e.duration_s * 1e6 for e in events if isinstance(e, PhaseSpan) and e.rank == rank
            and e.phase != "sync"
        )  # fmt: skip
        transfer_us = sum(
            (e.end - e.start - waits[e]) / 1e3
            for e in events
            if isinstance(e, CommEvent) and e.rank == rank
        )
        row = breakdown.loc[rank]
        assert row["compute_time(us)"] == pytest.approx(compute_us)
        assert row["non_compute_time(us)"] == pytest.approx(transfer_us)
    # the early rank's extra idle time is exactly the time it waited for the late one
    waited_us = sum(w for e, w in waits.items() if e.rank == 0) / 1e3
    idle = breakdown["idle_time(us)"]
    assert idle[0] - idle[1] == pytest.approx(waited_us)


def test_nothing_to_export_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no phases or collectives"):
        to_hta([], tmp_path)
