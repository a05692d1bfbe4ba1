"""Long runs at a flat cost (issue 42), unit level: the recording policy, the per-step
summaries, the event store's window and event file, the bucketed figures, the engine
recorder's pulls, and memory snapshots that PyTorch's own ``_memory_viz`` reads."""

from __future__ import annotations

import math
import pickle
from pathlib import Path

import numpy as np
import pytest

from workbench.errors import ConfigError
from workbench.plots import synthetic_events
from workbench.plots.run_summary import summary_figures
from workbench.plots.synthetic import at_step
from workbench.trace import Recorder
from workbench.trace.event_file import EventFile
from workbench.trace.events import CommEvent, MemorySample, Metric, PhaseSpan
from workbench.trace.memory_snapshot import snapshot_from_samples, tag_snapshot, to_memory_snapshot
from workbench.trace.policy import RecordPolicy, parse_record, record_policy, schedule
from workbench.trace.store import EventStore, check_run_dir
from workbench.trace.summary import StepSummaries, envelope
from workbench.trace.summary_columns import CHUNK, Column


def _steps(first: int, last: int, world: int = 2) -> list:
    """Synthetic DDP events of steps ``first`` to ``last``."""
    events = synthetic_events(steps=last + 1, world_size=world)
    return [e for e in events if first <= e.step <= last]


# -- the policy --------------------------------------------------------------------------
def test_schedule_selects_as_torch_profiler_does() -> None:
    policy = schedule(skip_first=2, wait=1, warmup=1, active=2, repeat=2)
    picked = [s for s in range(16) if policy.selected(s)]
    # skip 0-1; cycles of 4 from step 2: wait 2, warmup 3, active 4-5; wait 6, warmup 7,
    # active 8-9; then repeat=2 is spent
    assert picked == [4, 5, 8, 9]
    assert [s for s in range(6) if RecordPolicy(first=3, recent=0).selected(s)] == [0, 1, 2]
    assert record_policy("all").selected(10**6)


@pytest.mark.parametrize(
    ("make", "words"),
    [
        (lambda: RecordPolicy(first=0, recent=0), "keeps no step in detail"),
        (lambda: schedule(wait=3, active=0), "records nothing"),
        (lambda: record_policy("everything"), "'default', 'all'"),
        (lambda: RecordPolicy(recent=-1), "out of range"),
        (lambda: parse_record("wiat=3,active=1"), "'wiat=3' is not a setting"),
        (lambda: parse_record("active=x"), "not an integer"),
    ],
)
def test_bad_policies_get_one_clear_error(make, words: str) -> None:
    with pytest.raises(ConfigError, match=words.replace("(", r"\(")):
        make()


def test_record_text_of_the_magic_parses_without_eval() -> None:
    assert parse_record("all").keep_all
    assert parse_record("first=5,recent=20") == RecordPolicy(first=5, recent=20)
    assert parse_record("wait=8, active=2") == schedule(wait=8, active=2)


def test_an_unwritable_run_dir_fails_naming_the_path(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")  # a directory cannot be made under a file (root included)
    with pytest.raises(ConfigError, match=f"run_dir='{blocker / 'run'}' cannot be written"):
        EventStore(blocker / "run")
    assert check_run_dir(tmp_path / "new") == tmp_path / "new"


# -- summaries ---------------------------------------------------------------------------
def test_summaries_hold_every_steps_loss_time_peaks_and_collectives() -> None:
    events = _steps(0, 3)
    summaries = StepSummaries()
    summaries.add(events)
    for rank in (0, 1):
        mine = [e for e in events if e.rank == rank]
        steps, loss = summaries.column(rank, "metric:loss")
        assert list(steps) == [0, 1, 2, 3]
        want = {m.step: m.value for m in mine if isinstance(m, Metric) and m.name == "loss"}
        assert list(loss) == [want[s] for s in range(4)]
        for step in range(4):
            samples = [e for e in mine if isinstance(e, MemorySample) and e.step == step]
            spans = [e for e in mine if isinstance(e, PhaseSpan) and e.step == step]
            comms = [e for e in mine if isinstance(e, CommEvent) and e.step == step]
            row = summaries.rows(rank)[step]
            assert row["peak:total"] == max(s.total for s in samples)
            assert row["peak:grads"] == max(s.grads for s in samples)
            took = (max(s.end for s in spans) - min(s.start for s in spans)) / 1e9
            assert math.isclose(row["step_s"], took, abs_tol=1e-9)
            for op in {c.op for c in comms}:
                assert row[f"comm_bytes:{op}"] == sum(c.bytes for c in comms if c.op == op)
                assert math.isclose(
                    row[f"comm_s:{op}"], sum(c.duration_s for c in comms if c.op == op)
                )
    summaries.drop_from(2)
    assert summaries.steps == 2


def test_envelope_keeps_a_spike_in_its_bucket_and_bounds_the_points() -> None:
    values = np.ones(100_000)
    values[54_321] = 50.0
    env = envelope(np.arange(100_000), values, buckets=1000)
    assert len(env["x"]) == 1000
    assert env["max"].max() == 50.0 and env["min"].min() == 1.0
    short = envelope(np.arange(10), np.arange(10.0), buckets=1000)
    assert list(short["mean"]) == list(range(10))


# -- the store ---------------------------------------------------------------------------
def test_store_keeps_first_steps_and_a_recent_window_in_detail(tmp_path: Path) -> None:
    store = EventStore(tmp_path, RecordPolicy(first=2, recent=3))
    everything = _steps(0, 9)
    for step in range(10):
        store.add([e for e in everything if e.step == step])
    assert store.recorded_steps() == [0, 1, 7, 8, 9]
    assert store.summaries.steps == 10  # every step summarised
    assert store.path.exists() and store.path.stat().st_mode & 0o077 == 0
    kept = [e for e in everything if e.step in (0, 1, 7, 8, 9)]
    assert store.events() == kept  # file's, then window's: the pulled order
    assert store.events(1, 7) == [e for e in kept if 1 <= e.step <= 7]
    assert not store.whole_run_in_window()
    store.drop_from(1)  # a roll-back to step 1
    assert store.recorded_steps() == [0] and store.summaries.steps == 1


def test_a_window_larger_than_the_run_keeps_the_whole_run(tmp_path: Path) -> None:
    store = EventStore(tmp_path, RecordPolicy(first=0, recent=1000))
    events = _steps(0, 4)
    store.add(events)
    assert store.whole_run_in_window() and store.events() == events
    assert not store.path.exists()  # nothing left the window: no file


def test_event_file_round_trips_every_kind_in_order(tmp_path: Path) -> None:
    events = _steps(0, 2)
    f = EventFile(tmp_path / "e.sqlite")
    f.write(events)
    assert f.read() == events
    assert f.read(1, 1, ranks=[1]) == [e for e in events if e.step == 1 and e.rank == 1]
    assert f.steps() == [0, 1, 2]


def test_a_summary_column_reads_and_writes_as_a_plain_list() -> None:
    """Sealed chunks, uniform or not, behave as the list they stand for: reads, writes into
    a uniform chunk (it becomes an array), late inserts and roll-backs."""
    rng = np.random.default_rng(0)
    for typecode in ("d", "q"):
        column, model = Column(typecode), []
        for i in range(5 * CHUNK + 17):  # runs of one value, then a noisy stretch
            value = i if typecode == "q" else (float(i // 3000) if i < 4000 else rng.random())
            column.append(value)
            model.append(value)
        steps = [0, CHUNK - 1, CHUNK + 5, 2 * CHUNK + 9, len(model) - 1]
        for i in steps:
            new = model[i] + 7 if typecode == "q" else math.nan
            column[i] = new
            model[i] = new
        column.insert(CHUNK + 3, model[CHUNK + 3])
        model.insert(CHUNK + 3, model[CHUNK + 3])
        for n in (len(model) - 3, 3 * CHUNK + 1, 2 * CHUNK, CHUNK - 1):
            column.truncate(n)
            del model[n:]
            assert len(column) == len(model)
            got = column.to_array().tobytes()
            assert got == Column(typecode, model).to_array().tobytes()
            assert column.to_numpy().tobytes() == got
            assert all(column[i] == model[i] or math.isnan(model[i]) for i in range(0, n, 97))
        column.append(model[-1] + 1)
        assert column[-1] == model[-1] + 1


def test_summaries_of_a_long_run_keep_a_repeated_value_once() -> None:
    """Peaks and a collective's bytes repeat step after step: a sealed chunk of them is one
    number, so a step adds about its two times a rank (its start and end move), not a
    value of every column; and every column reads back exactly."""
    summaries = StepSummaries()
    base = _steps(0, 0)
    for step in range(4 * CHUNK):
        summaries.add(at_step(base, step))
    before = summaries.nbytes()
    runs = 12 * CHUNK
    for step in range(4 * CHUNK, runs):
        summaries.add(at_step(base, step))
    per_step = (summaries.nbytes() - before) / (8 * CHUNK)
    columns = len(summaries.columns(0)) + 1  # and the step
    assert columns >= 12 and per_step <= 2 * 8 * 2.1  # 2 ranks, 2 times (dense: columns)
    one = StepSummaries()
    one.add(base)
    for name in ("peak:total", "metric:loss", "step_s", *summaries.columns(0)):
        steps, values = summaries.column(0, name)
        assert list(steps) == list(range(runs))
        assert np.array_equal(values, np.full(runs, one.column(0, name)[1][0]), equal_nan=True) or (
            name.endswith("_ns")
        )


def test_summary_figures_have_a_bounded_size_at_any_length() -> None:
    summaries = StepSummaries()
    base = _steps(0, 0)
    for step in range(1500):
        summaries.add(at_step(base, step))
    figures = summary_figures(summaries, ranks=[0, 1], buckets=200)
    assert set(figures) == {"memory", "comm", "loss"}
    for fig in figures.values():
        assert all(len(t.x) <= 200 for t in fig.data if t.x is not None)
    assert "1500 steps in 200 buckets" in figures["loss"].layout.title.text


# -- the engine's recorder ---------------------------------------------------------------
def test_a_pulled_recorder_lets_go_of_what_was_pulled() -> None:
    recorder = Recorder(0)
    cursor = 0
    for step in range(1000):
        recorder.emit(Metric(rank=0, step=step, name="loss", value=1.0))
        events, cursor = recorder.since(cursor)
        assert [e.step for e in events] == [step]
    recorder.since(cursor)
    assert len(recorder.events) == 0 and len(recorder) == 1000
    recorder.emit(Metric(rank=0, step=1000, name="loss", value=1.0))
    again, _ = recorder.since(cursor)  # a repeated pull from an older cursor: still there
    assert [e.step for e in again] == [1000] == [e.step for e in recorder.since(cursor)[0]]


# -- memory snapshots --------------------------------------------------------------------
def test_memory_snapshot_is_read_by_torchs_memory_viz(tmp_path: Path) -> None:
    from torch.cuda import _memory_viz

    events = _steps(0, 2)
    paths = to_memory_snapshot(events, tmp_path)
    assert [p.name for p in paths] == [
        "memory_snapshot_rank0.pickle",
        "memory_snapshot_rank1.pickle",
    ]
    snapshot = pickle.loads(paths[0].read_bytes())
    summary = _memory_viz.segsum(snapshot)  # checks every segment's bytes add up
    assert "segments: 6" in summary
    text = _memory_viz.trace(snapshot)
    assert "entries" in text
    trace = snapshot["device_traces"][0]
    samples = [e for e in events if isinstance(e, MemorySample) and e.rank == 0]
    # the trace replays the samples: live bytes per category after the last action
    live: dict[str, int] = {}
    for action in trace:
        sign = {"alloc": 1, "free_completed": -1}.get(action["action"], 0)
        live[action["category"]] = live.get(action["category"], 0) + sign * action["size"]
    last = samples[-1]
    for category in ("params", "grads", "optimizer", "activations"):
        assert live.get(category, 0) == getattr(last, category)
    grads = [a for a in trace if a["category"] == "grads" and a["action"] == "alloc"]
    assert grads and {a["phase"] for a in grads} <= {"backward", "sync", "optimizer"}
    assert grads[0]["frames"][0]["name"].startswith("grads · ")


def test_a_cuda_snapshot_is_tagged_by_time_and_address() -> None:
    span = PhaseSpan(rank=0, step=3, phase="forward", start=2_000_000, end=5_000_000)
    snapshot = {
        "segments": [],
        "device_traces": [
            [
                {"action": "alloc", "addr": 10, "size": 512, "time_us": 3000, "frames": []},
                {"action": "alloc", "addr": 20, "size": 512, "time_us": 9000, "frames": []},
            ]
        ],
    }
    tag_snapshot(snapshot, [span], {20: "params"})
    first, second = snapshot["device_traces"][0]
    assert (first["phase"], first["step"], first["category"]) == ("forward", 3, "activations")
    assert (second["phase"], second["category"]) == ("", "params")
    assert snapshot_from_samples([])["device_traces"] == [[]]
