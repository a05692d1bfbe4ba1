"""``run_script(..., trace=True)`` / ``%wb run --trace``: a torchrun script's collectives, and
the memory of the model it wraps in DDP, in the timeline ``wb.traced`` and ``%wb trace``
draw (the shared 2-rank cluster)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from workbench.cluster import Cluster
from workbench.plots import comm_timeline_figure
from workbench.session.traced_log import TraceLog
from workbench.trace import CommEvent, MemorySample, PhaseSpan

MIGRATION = Path(__file__).resolve().parent / "scripts" / "migration_ddp.py"
STEPS = 16  # migration_ddp.py: 64 samples, global batch 8, 2 epochs
GRAD_BYTES = 4 * (6 * 16 + 16 + 16 * 1 + 1)  # its model's fp32 gradients: one DDP bucket


def _traced_run(cluster: Cluster, tmp_path: Path, trace: bool) -> list[Any]:
    log = TraceLog(cluster)
    log.pull()  # what earlier tests recorded is not this run's
    results = cluster.run_script(
        MIGRATION, ["--batch", "8", "--out", str(tmp_path / "l.json")], trace=trace
    )
    assert all(r.ok for r in results), [r.error for r in results]
    return log.pull()


def test_a_traced_script_records_every_collective_it_makes(
    cluster: Cluster, tmp_path: Path
) -> None:
    events = _traced_run(cluster, tmp_path, trace=True)
    spans = [e for e in events if isinstance(e, PhaseSpan)]
    assert sorted((e.rank, e.phase) for e in spans) == [
        (0, "script migration_ddp.py"),
        (1, "script migration_ddp.py"),
    ]
    for rank in (0, 1):
        comm = [e for e in events if isinstance(e, CommEvent) and e.rank == rank]
        sizes = Counter((e.op, e.bytes, e.source) for e in comm)
        assert sizes[("all_reduce", 4, "user")] == STEPS  # the script's own loss all-reduce
        assert sizes[("all_reduce", GRAD_BYTES, "ddp-bucket")] == STEPS  # DDP's bucket
        assert all(spans[rank].start <= e.start <= e.end <= spans[rank].end for e in comm)
    figure = comm_timeline_figure(events, ranks=[0, 1])
    assert len(figure.data) > 0


def test_a_traced_script_samples_the_memory_of_its_ddp_model(
    cluster: Cluster, tmp_path: Path
) -> None:
    events = _traced_run(cluster, tmp_path, trace=True)
    for rank in (0, 1):
        memory = [e for e in events if isinstance(e, MemorySample) and e.rank == rank]
        labels = Counter(e.label for e in memory)
        assert labels["start"] == labels["end"] == 1 and labels["optimizer"] == STEPS
        steps = [e for e in memory if e.label == "optimizer"]
        first = steps[0].step  # the recorder counts on from earlier traced runs
        assert [e.step for e in steps] == list(range(first, first + STEPS))  # one per step
        assert {(e.params, e.grads, e.optimizer) for e in steps} == {(GRAD_BYTES, GRAD_BYTES, 0)}
        assert max(e.activations for e in memory) > 0  # saved for backward, in a step


def test_an_untraced_script_records_nothing(cluster: Cluster, tmp_path: Path) -> None:
    assert _traced_run(cluster, tmp_path, trace=False) == []


def test_wb_run_trace_feeds_wb_trace_plot(
    ipython_shell: Any, cluster: Cluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert ipython_shell._workbench_magics.cluster is cluster
    out = tmp_path / "l.json"
    ipython_shell.run_line_magic("wb", f"run --trace {MIGRATION} --batch 8 --out {out}")
    assert "trace events; %wb trace plot comm draws them" in capsys.readouterr().out
    log = ipython_shell._workbench_magics.trace_log
    names = {e.phase for e in log.events if isinstance(e, PhaseSpan)}
    assert "script migration_ddp.py" in names
    figure = ipython_shell.run_line_magic("wb", "trace plot comm")
    assert len(figure.data) > 0
