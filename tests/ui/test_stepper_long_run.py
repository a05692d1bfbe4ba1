"""A stepper run past its recent window (issue 42), on the shared 2-rank cluster: the
recording policy, the run directory's event file, summary figures and a zoom, the widget
switching to summaries, the engines letting go of pulled events, memory snapshots."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from workbench.cluster import Cluster
from workbench.engine.run_slot import current_run
from workbench.errors import ConfigError
from workbench.trace import schedule
from workbench.trace.events import Metric
from workbench.ui.stepper import Stepper


def _engine_events() -> int:
    return len(current_run().recorder.events)


def test_a_run_past_its_window_keeps_summaries_and_the_chosen_detail(
    cluster: Cluster, tmp_path: Path
) -> None:
    from torch.cuda import _memory_viz

    stepper = Stepper(
        model="mlp-tiny",
        strategy="dp",
        batch_size=8,
        cluster=cluster,
        record=schedule(wait=4, active=1, first=2, recent=3),
        run_dir=tmp_path / "run",
    )
    try:
        _ = stepper.widget  # the live view, to see it switch to summaries
        stepper.run(12)
        store = stepper.session.store
        # first 2, the schedule's every 5th step (4 and 9), the last 3
        assert store.recorded_steps() == [0, 1, 4, 9, 10, 11]
        assert (tmp_path / "run" / "events.sqlite").exists()
        assert {e.step for e in stepper.events} == {0, 1, 4, 9, 10, 11}
        rows = stepper.summaries.rows(0)
        assert [r["step"] for r in rows] == list(range(12))  # every step summarised
        losses = {e.step: e.value for e in stepper.events if isinstance(e, Metric) and e.rank == 0}
        assert rows[4]["metric:loss"] == losses[4] and rows[5]["step_s"] > 0
        assert rows[5]["peak:params"] > 0 and any(k.startswith("comm_bytes:") for k in rows[5])
        # the engines hold only the last pull's events (acknowledged by the next pull)
        last = [len([e for e in stepper.events if e.step == 11 and e.rank == r]) for r in (0, 1)]
        assert cluster.run(_engine_events) == last
        figures = stepper.figures()
        assert figures["loss"].layout.meta["kind"] == "loss-summary"
        zoom = stepper.figures(steps=(9, 11))
        assert zoom["memory"].layout.title.text.startswith("Memory per rank")  # the detail
        assert {int(t.meta["rank"]) for t in zoom["memory"].data} == {0, 1}
        with pytest.raises(ConfigError, match=r"recorded steps: 0-1, 4, 9-11"):
            stepper.figures(steps=(5, 8))
        with pytest.raises(ConfigError, match="steps="):
            stepper.figures(steps=(3, 1))
        # the live widget now draws from the summaries too
        assert stepper._view.loss.layout.meta["kind"] == "loss-summary"
        paths = stepper.export_memory_snapshot(tmp_path / "snap")
        assert [p.name for p in paths] == [
            "memory_snapshot_rank0.pickle",
            "memory_snapshot_rank1.pickle",
        ]
        snapshot = pickle.loads(paths[1].read_bytes())
        assert "total_allocated" in _memory_viz.segsum(snapshot)
        assert {a["step"] for a in snapshot["device_traces"][0]} <= {0, 1, 4, 9, 10, 11}
    finally:
        stepper.close()


def test_bad_record_and_run_dir_fail_before_any_work(cluster: Cluster, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="record='sometimes' is not valid"):
        Stepper(model="mlp-tiny", cluster=cluster, record="sometimes")
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ConfigError, match=f"run_dir='{blocker}/x' cannot be written"):
        Stepper(model="mlp-tiny", cluster=cluster, run_dir=blocker / "x")
