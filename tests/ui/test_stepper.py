"""The stepper widget driven through its buttons and controls, on the shared cluster."""

from __future__ import annotations

from collections.abc import Iterator

import plotly.graph_objects as go
import pytest

from workbench.cluster import Cluster
from workbench.errors import ConfigError
from workbench.trace import MemorySample
from workbench.ui.stepper import Stepper


@pytest.fixture
def stepper(cluster: Cluster) -> Iterator[Stepper]:
    s = Stepper(model="mlp-tiny", strategy="dp", batch_size=8, reference=True, cluster=cluster)
    _ = s.widget
    yield s
    s.close()


def _points(fig: go.FigureWidget) -> int:
    return sum(len(t.x) for t in fig.data if t.x is not None)


def test_phase_button_advances_every_rank_and_figures_grow(stepper: Stepper) -> None:
    view = stepper._view
    before = _points(view.memory)
    view.phase_button.click()
    assert [s.next_phase for s in stepper.status] == ["forward", "forward"]
    assert _points(view.memory) > before
    assert _points(view.comm) >= 2  # one data span per rank
    assert "<td>forward</td>" in view.status.value
    view.step_button.click()
    assert [s.step for s in stepper.status] == [1, 1]
    assert view.message.value == ""


def test_run_n_fills_progress_and_loss_with_reference(stepper: Stepper) -> None:
    view = stepper._view
    view.run_count.value = 3
    view.run_button.click()
    assert view.progress.value == 3 and view.progress.max == 3
    assert [s.step for s in stepper.status] == [3, 3]
    # by key: DDP ranks report the same loss, so their legend reads "ranks 0–1 identical"
    lengths = {t.meta["key"]: len(t.y) for t in view.loss.data}
    assert lengths["loss/rank/0"] == 3 and lengths["loss/rank/1"] == 3
    assert lengths["loss/reference"] >= 3
    ref = next(t for t in view.loss.data if t.name == "single device")
    mine = next(t for t in view.loss.data if t.meta["key"] == "loss/rank/0")
    assert max(abs(a - b) for a, b in zip(mine.y, ref.y[:3], strict=False)) < 1e-5
    assert view.pause_button.disabled and not view.run_button.disabled  # run is over
    # The reference ran on rank 0's engine (after the run, for the loss figure); the step
    # after it must not count its activations as rank 0's: both DDP ranks drew the same
    # samples with the same peak (it once added a "peak" sample of 1.5x to rank 0 alone).
    view.step_button.click()
    samples = {
        r: [e for e in stepper.events if isinstance(e, MemorySample) and e.rank == r]
        for r in (0, 1)
    }
    assert [s.label for s in samples[0]] == [s.label for s in samples[1]]
    assert max(s.total for s in samples[0]) == max(s.total for s in samples[1])


def test_pause_stops_a_run_early(stepper: Stepper) -> None:
    view = stepper._view
    stepper.session.subscribe(lambda _events: view._request_pause())
    view.run_count.value = 5
    view.run_button.click()
    assert 1 <= view.progress.value < 5


def test_option_change_rebuilds_and_resets_figures(stepper: Stepper) -> None:
    view = stepper._view
    view.step_button.click()
    view.options["overlap"].value = True
    assert stepper.spec.overlap is True
    assert [s.step for s in stepper.status] == [0, 0]
    assert _points(view.comm) == 0
    view.step_button.click()
    ops = {(e.source, e.phase) for e in stepper.events if e.kind == "comm"}
    assert ("ddp-bucket", "backward") in ops


def test_invalid_option_is_shown_and_reverted(stepper: Stepper) -> None:
    view = stepper._view
    view.options["microbatches"].value = 3  # only matters for pp: still valid for dp
    view.options["strategy"].value = "pp"  # 3 micro-batches do not divide a batch of 8
    assert "microbatches=3" in view.message.value
    assert view.options["strategy"].value == "dp"
    assert stepper.spec.strategy == "dp"


def test_figures_and_trace_export(stepper: Stepper, tmp_path: object) -> None:
    from pathlib import Path

    stepper.step()
    figures = stepper.figures()
    assert set(figures) == {"memory", "comm", "loss"}
    assert all(isinstance(f, go.Figure) for f in figures.values())
    path = stepper.export_trace(Path(str(tmp_path)) / "t.json")
    assert path.stat().st_size > 0


def test_constructor_validates(cluster: Cluster) -> None:
    with pytest.raises(ConfigError, match="strategy='ddp'"):
        Stepper(strategy="ddp", cluster=cluster)
    assert Stepper.current() is not None


def test_steppers_survive_a_restart_of_a_healthy_cluster(
    cluster: Cluster, tmp_path: object
) -> None:
    """`%wb restart` on a healthy cluster (restart_sync) used to leave the stepper's run
    missing on the new engines (`KeyError: 'run'` on the next step)."""
    saved = Stepper(
        model="mlp-tiny", strategy="dp", batch_size=8, cluster=cluster, checkpoint_dir=tmp_path
    )
    fresh = Stepper(model="mlp-tiny", strategy="dp", batch_size=8, cluster=cluster)
    try:
        saved.step()
        saved.save()
        saved.step()
        fresh.step(2)
        cluster.restart_sync()
        saved.step()
        assert [s.step for s in saved.status] == [2, 2]  # from the checkpoint of step 1
        assert saved.session.last_recovery == (
            "the cluster was restarted since the run was built: rolled back from step 2 to "
            "the checkpoint of step 1; 1 completed step(s) will be redone"
        )
        fresh.step()
        assert [s.step for s in fresh.status] == [1, 1]  # rebuilt from its spec
        assert "step 0 (no checkpoint: fresh weights)" in (fresh.session.last_recovery or "")
        losses = [
            e for e in saved.events if e.kind == "metric" and e.name == "loss" and e.rank == 0
        ]
        assert [e.step for e in losses] == [0, 1]  # the redone step replaced the old one
    finally:
        saved.close()
        fresh.close()
