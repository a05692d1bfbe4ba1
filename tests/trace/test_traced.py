"""``wb.traced`` on a hand-written loop: spans, memory by category, losses, collectives."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.harness import run_ranks
from tests.parallel import _user_models as um
from workbench.trace import CommEvent, MemorySample, Metric, PhaseSpan, Recorder
from workbench.trace.traced import Traced


def test_hand_written_loop_single_process() -> None:
    model = um.make_model()
    opt = um.adamw(model.parameters())
    data = um.make_data()
    rec = Recorder(0)
    n_params = sum(p.numel() for p in model.parameters())
    with Traced(model, opt, recorder=rec, comm=False) as t:
        for i in range(2):
            x, y = data.x[i * 4 : (i + 1) * 4], (data.x[i * 4 : (i + 1) * 4] + 1) % um.VOCAB
            with t.phase("forward"):
                loss = um.lm_loss(model(x), y)
            with t.phase("backward"):
                loss.backward()
            with t.phase("optimizer"):
                opt.step()
                opt.zero_grad()
            t.step(loss=loss)
    spans = [e for e in rec.events if isinstance(e, PhaseSpan)]
    assert [s.phase for s in spans] == ["forward", "backward", "optimizer"] * 2 + ["traced"]
    outer = spans[-1]
    assert all(outer.start <= s.start and s.end <= outer.end for s in spans)
    samples = {e.label: e for e in rec.events if isinstance(e, MemorySample)}
    assert samples["start"].params == 4 * n_params and samples["start"].optimizer == 0
    assert samples["forward"].activations > 0  # the graph is alive after forward
    assert samples["end"].optimizer == 8 * n_params  # AdamW: m and v
    losses = [e for e in rec.events if isinstance(e, Metric)]
    assert [m.step for m in losses] == [0, 1] and rec.step == 2


def test_saved_tensor_hooks_are_removed_after_the_block() -> None:
    model = um.make_model()
    rec = Recorder(0)
    with Traced(model, None, recorder=rec, comm=False) as t:
        pass
    assert t.memory_tracer is None
    before = len(rec)
    um.lm_loss(model(torch.zeros(2, um.SEQ, dtype=torch.long)), torch.zeros(2, um.SEQ).long())
    assert len(rec) == before


def _ddp_loop(rank: int, world: int) -> dict[str, Any]:
    from torch.nn.parallel import DistributedDataParallel

    model = DistributedDataParallel(um.make_model())
    opt = um.sgd(model.parameters())
    rec = Recorder(rank)
    x = um.make_data().x[rank * 4 : rank * 4 + 4]
    with Traced(model, opt, recorder=rec) as t:
        for _ in range(2):
            with t.phase("forward"):
                loss = um.lm_loss(model(x), (x + 1) % um.VOCAB)
            with t.phase("backward"):
                loss.backward()
            opt.step()
            opt.zero_grad()
            t.step(loss=loss)
    comm = [e for e in rec.events if isinstance(e, CommEvent)]
    return {
        "bucket_bytes": sum(e.bytes for e in comm if e.source == "ddp-bucket"),
        "phases": sorted({e.phase for e in comm if e.source == "ddp-bucket"}),
        "n_params": sum(p.numel() for p in model.parameters()),
    }


@pytest.mark.engines
def test_ddp_buckets_are_seen_in_a_traced_loop() -> None:
    out = run_ranks(_ddp_loop, timeout=120)
    for r in out:
        # Every gradient is all-reduced once per step, in backward: 2 steps x 4 bytes each.
        assert r["bucket_bytes"] == 2 * 4 * r["n_params"]
        assert r["phases"] == ["backward"]


def _ddp_block_per_step(rank: int, world: int) -> dict[str, Any]:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    model = DistributedDataParallel(um.make_model())
    opt = um.sgd(model.parameters())
    rec = Recorder(rank)
    x = um.make_data().x[rank * 4 : rank * 4 + 4]
    for _ in range(3):  # a new block, with a new CommTracer, every step
        with Traced(model, opt, recorder=rec) as t:
            loss = um.lm_loss(model(x), (x + 1) % um.VOCAB)
            loss.backward()
            opt.step()
            opt.zero_grad()
    comm = [e for e in rec.events if isinstance(e, CommEvent)]
    tracer_after = t.comm_tracer

    # Tracing registered nothing on the model: the user's own comm hook is still
    # accepted (DDP takes one), runs, and its all-reduces are recorded as the user's.
    calls: list[int] = []

    def user_hook(_state, bucket):  # type: ignore[no-untyped-def]
        calls.append(bucket.buffer().numel())
        buffer = bucket.buffer().div_(world)
        work = dist.all_reduce(buffer, async_op=True)
        return work.get_future().then(lambda fut: fut.value()[0])

    model.register_comm_hook(None, user_hook)
    before = len(rec)
    with Traced(model, opt, recorder=rec) as t:
        um.lm_loss(model(x), (x + 1) % um.VOCAB).backward()
    hooked = [e for e in rec.events[before:] if isinstance(e, CommEvent)]
    return {
        "bucket_bytes": sum(e.bytes for e in comm if e.source == "ddp-bucket"),
        "other_all_reduces": [e for e in comm if e.op == "all_reduce" and e.source != "ddp-bucket"],
        "n_params": sum(p.numel() for p in model.parameters()),
        "tracer_after": tracer_after,
        "user_hook_calls": sum(calls),
        "user_hook_events": sorted({(e.source, e.op) for e in hooked if e.op == "all_reduce"}),
        "user_hook_bytes": sum(e.bytes for e in hooked if e.op == "all_reduce"),
    }


@pytest.mark.engines
def test_ddp_buckets_are_seen_by_every_block_of_a_loop_traced_step_by_step() -> None:
    for r in run_ranks(_ddp_block_per_step, timeout=120):
        # Every block's tracer records DDP's buckets (as buckets, not plain all-reduces).
        assert r["bucket_bytes"] == 3 * 4 * r["n_params"]
        assert r["other_all_reduces"] == []
        assert r["tracer_after"] is None
        # The user's comm hook, registered after tracing, ran over every gradient and its
        # all-reduces were recorded with their bytes, as the user's, not as DDP buckets.
        assert r["user_hook_calls"] == r["n_params"]
        assert r["user_hook_events"] == [("user", "all_reduce")]
        assert r["user_hook_bytes"] == 4 * r["n_params"]


def _bucket_callback_race(rank: int, world: int) -> dict[str, Any]:
    import sys

    from torch.nn.parallel import DistributedDataParallel

    # The main thread keeps the GIL between blocking calls for up to this long: a bucket's
    # completion callback (on gloo's thread) runs only when the main thread blocks.
    sys.setswitchinterval(10.0)
    model = DistributedDataParallel(um.make_model())
    rec = Recorder(rank)
    x = um.make_data().x[rank * 4 : rank * 4 + 4]
    found = []
    for _ in range(8):
        with Traced(model, recorder=rec):
            um.lm_loss(model(x), (x + 1) % um.VOCAB).backward()
        # Read at once: DDP's backward returned as soon as its buckets were done, before
        # the callbacks that record them had a chance to run.
        found.append(sum(e.bytes for e in rec.events if getattr(e, "source", "") == "ddp-bucket"))
        rec.clear()
    return {"found": found, "n_params": sum(p.numel() for p in model.parameters())}


@pytest.mark.engines
def test_a_block_ends_with_its_buckets_recorded() -> None:
    for r in run_ranks(_bucket_callback_race, timeout=120):
        assert r["found"] == [4 * r["n_params"]] * 8
