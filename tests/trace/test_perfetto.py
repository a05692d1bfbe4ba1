"""Perfetto / Chrome trace export, event round-trips, and the trace layer's imports."""

from __future__ import annotations

import itertools
import json
import pickle
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.harness import run_ranks
from tests.trace.models import make_mlp
from workbench.trace import (
    CommEvent,
    CommTracer,
    MemorySample,
    MemoryTracer,
    Metric,
    PhaseSpan,
    Recorder,
    from_record,
    to_perfetto,
    to_record,
)
from workbench.trace.perfetto import MEMORY_COUNTERS

PH_FIELDS = {
    "X": {"name", "ph", "pid", "tid", "ts", "dur"},
    "C": {"name", "ph", "pid", "ts", "args"},
    "M": {"name", "ph", "pid", "args"},
}


def validate_chrome_trace(trace: dict[str, Any]) -> None:
    """The subset of the Trace Event Format the exporter promises."""
    assert set(trace) >= {"traceEvents", "displayTimeUnit"}
    assert trace["displayTimeUnit"] in ("ms", "ns")
    for ev in trace["traceEvents"]:
        assert ev["ph"] in PH_FIELDS, ev
        missing = PH_FIELDS[ev["ph"]] - set(ev)
        assert not missing, (missing, ev)
        assert isinstance(ev["pid"], int)
        if ev["ph"] == "X":
            assert isinstance(ev["tid"], int) and ev["ts"] >= 0 and ev["dur"] >= 0
        if ev["ph"] == "C":
            assert all(isinstance(v, int | float) for v in ev["args"].values())
        if ev["ph"] == "M":
            assert ev["name"] in {
                "process_name",
                "process_sort_index",
                "thread_name",
                "thread_sort_index",
            }
    # Within one thread track, complete events never overlap partially.
    tracks: dict[tuple[int, int], list[tuple[float, float]]] = {}
    for ev in trace["traceEvents"]:
        if ev["ph"] == "X":
            tracks.setdefault((ev["pid"], ev["tid"]), []).append((ev["ts"], ev["ts"] + ev["dur"]))
    for spans in tracks.values():
        spans.sort(key=lambda s: (s[0], -s[1]))  # an enclosing slice before what it holds
        for (a_start, a_end), (b_start, b_end) in itertools.pairwise(spans):
            # after it, or inside it (a collective's wait for a late peer, stragglers.py)
            assert b_start >= a_end or (b_start >= a_start and b_end <= a_end)


def _events() -> list[Any]:
    t0 = 1_000_000_000_000
    out: list[Any] = []
    for rank in (0, 1):
        base = t0 + rank * 10_000
        out += [
            PhaseSpan(rank=rank, step=0, phase="forward", start=base, end=base + 50_000),
            PhaseSpan(rank=rank, step=0, phase="backward", start=base + 50_000, end=base + 150_000),
            # Two buckets in flight at once: they must land on different comm lanes.
            CommEvent(
                rank=rank,
                step=0,
                op="all_reduce",
                bytes=4_000_000,
                group_size=2,
                start=base + 60_000,
                end=base + 120_000,
                source="ddp-bucket",
                phase="backward",
            ),
            CommEvent(
                rank=rank,
                step=0,
                op="all_reduce",
                bytes=1_000_000,
                group_size=2,
                start=base + 100_000,
                end=base + 140_000,
                source="ddp-bucket",
                phase="backward",
            ),
            MemorySample(
                rank=rank,
                step=0,
                phase="forward",
                t=base + 50_000,
                params=400,
                grads=0,
                optimizer=800,
                activations=1234,
                allocator=10_000,
            ),
            Metric(rank=rank, step=0, name="loss", value=0.5, t=base + 150_000),
        ]
    return out


def test_perfetto_layout_and_values(tmp_path: Path) -> None:
    events = _events()
    path = tmp_path / "trace.json"
    trace = to_perfetto(events, path)
    assert json.loads(path.read_text()) == trace
    validate_chrome_trace(trace)
    evs = trace["traceEvents"]

    procs = {e["pid"]: e["args"]["name"] for e in evs if e["name"] == "process_name"}
    assert procs == {0: "rank 0", 1: "rank 1"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in evs if e["name"] == "thread_name"}
    for rank in (0, 1):
        names = sorted(n for (pid, _), n in threads.items() if pid == rank)
        assert names == ["comm", "comm 2", "compute"]

    comm = [e for e in evs if e["ph"] == "X" and e["cat"].startswith("comm")]
    assert len(comm) == 4
    first = min((e for e in comm if e["pid"] == 0), key=lambda e: e["ts"])
    source = events[2]
    assert first["args"]["bytes"] == source.bytes
    assert first["dur"] == (source.end - source.start) / 1000
    assert first["args"]["algbw_GBps"] == source.algbw / 1e9
    assert first["args"]["busbw_GBps"] == source.busbw / 1e9
    assert first["ts"] == (source.start - trace["otherData"]["t0_ns"]) / 1000

    counters = {e["name"] for e in evs if e["ph"] == "C"}
    assert counters == set(MEMORY_COUNTERS.values()) | {"loss"}
    act = [e for e in evs if e["name"] == "memory: activations"]
    assert [e["args"]["bytes"] for e in act] == [1234, 1234]


def test_events_round_trip_through_pickle_and_json() -> None:
    for event in _events():
        assert pickle.loads(pickle.dumps(event)) == event
        assert from_record(json.loads(json.dumps(to_record(event)))) == event
    rec = Recorder(rank=1)
    rec.extend(_events())
    back = Recorder.from_records(json.loads(json.dumps(rec.to_records())), rank=1)
    assert back.events == rec.events


def _traced_step(rank: int, world_size: int) -> list[dict[str, Any]]:
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model = make_mlp(16, 32, 8)
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    rec = Recorder(rank)
    comm = CommTracer(rec).start()
    comm.attach_ddp(ddp)
    mem = MemoryTracer(model, opt, rec, per_module=True).start()
    with rec.phase_span("forward", step=0):
        loss = ddp(torch.randn(4, 16)).sum()
    with rec.phase_span("backward"):
        loss.backward()
        mem.sample()
    with rec.phase_span("optimizer"):
        opt.step()
        mem.sample()
    mem.stop()
    comm.stop()
    return rec.to_records()


@pytest.mark.engines
def test_real_two_rank_step_exports(tmp_path: Path) -> None:
    records = [r for rank_records in run_ranks(_traced_step) for r in rank_records]
    events = [from_record(r) for r in records]
    trace = to_perfetto(events, tmp_path / "step.json")
    validate_chrome_trace(trace)
    evs = trace["traceEvents"]
    assert {e["pid"] for e in evs} == {0, 1}
    phases = [e["name"] for e in evs if e["ph"] == "X" and e["cat"] == "phase"]
    assert sorted(phases) == sorted(["forward", "backward", "optimizer"] * 2)
    buckets = [e for e in evs if e["ph"] == "X" and e["cat"] == "comm,ddp-bucket"]
    grad_bytes = sum(p.numel() * 4 for p in make_mlp(16, 32, 8).parameters())
    for rank in (0, 1):
        assert sum(e["args"]["bytes"] for e in buckets if e["pid"] == rank) == grad_bytes
