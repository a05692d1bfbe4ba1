"""CommTracer on 2 gloo ranks: DDP buckets, plain collectives, DTensor, in-flight, timing."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import torch

from tests.harness import run_ranks
from tests.trace.models import make_mlp
from workbench.errors import WorkbenchError
from workbench.trace import CommEvent, CommTracer, MemoryTracer, Recorder, gradient_bytes
from workbench.trace.intercept import active, intercepted_ops, release

STEPS = 3


def _comm(events: list[Any]) -> list[CommEvent]:
    return [e for e in events if isinstance(e, CommEvent)]


def _ddp_rank(rank: int, world_size: int) -> dict[str, Any]:
    """Train the same model with untraced and traced DDP; report params and events."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    def train(traced: bool) -> tuple[list[torch.Tensor], Recorder, list[int], list[str]]:
        torch.manual_seed(0)
        model = make_mlp(16, 64, 8, layers=4)
        # Small buckets so one step has several bucket all-reduces.
        ddp = DDP(model, bucket_cap_mb=0.01)
        opt = torch.optim.AdamW(ddp.parameters(), lr=1e-2)
        rec = Recorder(rank)
        grads: list[int] = []
        comm = mem = None
        if traced:
            comm = CommTracer(rec).start()
            comm.attach_ddp(ddp)
            mem = MemoryTracer(model, opt, rec).start()
        gen = torch.Generator().manual_seed(100 + rank)
        for step in range(STEPS):
            x, y = torch.randn(8, 16, generator=gen), torch.randn(8, 8, generator=gen)
            with rec.phase_span("forward", step=step):
                loss = torch.nn.functional.mse_loss(ddp(x), y)
            with rec.phase_span("backward"):
                loss.backward()
            grads.append(gradient_bytes(model))
            with rec.phase_span("optimizer"):
                opt.step()
                opt.zero_grad(set_to_none=True)
            if mem is not None:
                mem.sample("end of step")
        errors: list[str] = []
        if comm is not None and mem is not None:
            mem.stop()
            comm.stop()
            errors = comm.errors
        dist.barrier()
        return [p.detach().clone() for p in model.parameters()], rec, grads, errors

    plain, _, _, _ = train(traced=False)
    traced, rec, grads, errors = train(traced=True)
    events = _comm(rec.events)
    return {
        "identical": all(torch.equal(a, b) for a, b in zip(plain, traced, strict=True)),
        "events": events,
        "grads": grads,
        "errors": errors,
        "in_flight": dict(rec.in_flight),
    }


@pytest.mark.engines
def test_ddp_buckets_traced_identical_and_sum_to_gradients() -> None:
    for rank, out in enumerate(run_ranks(_ddp_rank)):
        assert out["identical"], f"rank {rank}: traced DDP changed the parameters"
        assert out["errors"] == [] and out["in_flight"] == {}
        events: list[CommEvent] = out["events"]
        for step in range(STEPS):
            buckets = [e for e in events if e.step == step and e.source == "ddp-bucket"]
            # DDP packs iteration 0 into its 1 MiB first bucket, then rebuilds small buckets.
            assert len(buckets) > 1 if step > 0 else len(buckets) >= 1
            assert sum(e.bytes for e in buckets) == out["grads"][step]
            assert all(e.op == "all_reduce" and e.group_size == 2 for e in buckets)
            assert all(e.phase == "backward" and e.end >= e.start for e in buckets)
            # The hook's own all-reduce is not counted a second time. (Other DDP traffic,
            # e.g. the bucket-order broadcasts when buckets are rebuilt, is "ddp".)
            others = [e for e in events if e.step == step and e.source != "ddp-bucket"]
            assert [e for e in others if e.op == "all_reduce"] == []
            assert all(e.source == "ddp" and e.op == "broadcast" for e in others)


def _bucket_rule_rank(rank: int, world_size: int) -> dict[str, Any]:
    """DDP buckets without attach_ddp, next to an all-reduce the user issues inside
    backward from Python (a gradient hook) and DDP's own integer all-reduce of which
    parameters were used (``find_unused_parameters``), issued from C++ in backward."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model = make_mlp(16, 32, 8, layers=3)
    ddp = DDP(model, find_unused_parameters=True)
    rec = Recorder(rank)
    x = torch.randn(4, 16, requires_grad=True)

    def user_hook(grad: torch.Tensor) -> torch.Tensor:
        out = grad.clone()
        dist.all_reduce(out)  # the user's own collective, issued inside backward
        return out

    x.register_hook(user_hook)
    with CommTracer(rec), rec.phase_span("backward"):  # never attached to the DDP model
        ddp(x).sum().backward()
    comm = _comm(rec.events)
    return {
        "buckets": sum(e.bytes for e in comm if e.source == "ddp-bucket"),
        "params": 4 * sum(p.numel() for p in model.parameters()),
        "others": sorted((e.source, e.op, e.bytes) for e in comm if e.source != "ddp-bucket"),
        "x_bytes": 4 * x.numel(),
        "n_params": len(list(model.parameters())),
    }


@pytest.mark.engines
def test_a_ddp_bucket_is_an_all_reduce_no_python_code_issued_in_backward() -> None:
    for out in run_ranks(_bucket_rule_rank):
        # Every gradient of the DDP model, as buckets, though the tracer was not attached.
        assert out["buckets"] == out["params"]
        # The user's all-reduce from a gradient hook (Python, inside backward) is the
        # user's; DDP's used-parameter map (an int32 per parameter) is not a bucket.
        assert [e for e in out["others"] if e[1] == "all_reduce"] == sorted(
            [("user", "all_reduce", out["x_bytes"]), ("user", "all_reduce", 4 * out["n_params"])]
        )


def _collectives_rank(rank: int, world_size: int) -> dict[str, Any]:
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    rec = Recorder(rank)
    tracer = CommTracer(rec).start()
    n = 1000
    out: dict[str, Any] = {}

    rec.step, rec.phase = 1, "plain"
    t = torch.full((n,), float(rank))
    dist.all_reduce(t)
    out["visible_at_return"] = len(_comm(rec.events))  # sync op: event emitted by now
    gathered = [torch.empty(n) for _ in range(world_size)]
    dist.all_gather(gathered, t)
    dist.all_gather_into_tensor(torch.empty(world_size * n), t)
    dist.broadcast(t, src=0)
    reduced = funcol.all_reduce(t, "sum", dist.group.WORLD)
    out["funcol_value"] = float((reduced + 0)[0])  # using the result waits on it

    # Async: rank 1 joins late, so rank 0's all-reduce is in flight meanwhile.
    rec.step, rec.phase = 2, "align"
    dist.barrier()  # both ranks leave together, then rank 1 is late by `delay`
    rec.phase = "async"
    delay = 0.3
    if rank == 1:
        time.sleep(delay)
    work = dist.all_reduce(torch.ones(n), async_op=True)
    out["in_flight_while_waiting"] = [dict(v) for v in rec.in_flight.values()]
    work.wait()
    out["delay"] = delay

    # Tensor parallel: Colwise then Rowwise; the row-parallel output is all-reduced.
    rec.step, rec.phase = 0, "setup"
    mesh = init_device_mesh("cpu", (world_size,))
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 6))
    parallelize_module(mlp, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    mem = MemoryTracer(mlp, None, rec).start()
    out["tp_params"] = mem.sample().params
    rec.step, rec.phase = 3, "forward"
    y = mlp(torch.randn(5, 8))
    out["tp_activations"] = mem.activation_bytes
    rec.step, rec.phase = 3, "backward"
    y.sum().backward()
    out["tp_activations_after"] = mem.activation_bytes
    out["tp_grads"] = mem.sample().grads
    mem.stop()

    # A collective issued on another thread (the interception is per process).
    rec.step, rec.phase = 4, "thread"
    worker = threading.Thread(target=lambda: dist.broadcast(torch.zeros(n), src=0))
    worker.start()
    worker.join()

    out["errors"] = list(tracer.errors)
    # A failure inside the tracer is kept, and the collective still runs.
    import workbench.trace.comm as comm_module

    real_group_size = comm_module.group_size
    comm_module.group_size = lambda *a, **k: 1 / 0
    try:
        t = torch.ones(3)
        dist.all_reduce(t)
    finally:
        comm_module.group_size = real_group_size
    out["value_despite_error"] = t.tolist()
    out["injected_errors"] = tracer.errors[len(out["errors"]) :]

    tracer.stop()
    dist.barrier()  # after stop: not recorded
    out["events"] = _comm(rec.events)
    out["in_flight_after"] = dict(rec.in_flight)
    return out


@pytest.mark.engines
def test_plain_functional_and_dtensor_collectives() -> None:
    n, f32, world = 1000, 4, 2
    results = run_ranks(_collectives_rank)
    for rank, out in enumerate(results):
        assert out["errors"] == [] and out["in_flight_after"] == {}
        assert out["value_despite_error"] == [2.0, 2.0, 2.0]
        assert len(out["injected_errors"]) == 1 and "ZeroDivisionError" in out["injected_errors"][0]
        assert out["visible_at_return"] == 1
        assert out["funcol_value"] == 2 * sum(range(world))  # all-reduced twice
        events: list[CommEvent] = out["events"]

        plain = [(e.op, e.bytes, e.source) for e in events if e.step == 1]
        assert plain == [
            ("all_reduce", n * f32, "user"),
            ("all_gather", world * n * f32, "user"),
            ("all_gather", world * n * f32, "user"),
            ("broadcast", n * f32, "user"),
            ("all_reduce", n * f32, "user"),
        ]
        assert all(e.group_size == world and e.end >= e.start for e in events)

        (late,) = [e for e in events if e.step == 2 and e.phase == "async"]
        assert late.op == "all_reduce" and late.phase == "async"
        flights = out["in_flight_while_waiting"]
        if rank == 0:  # waited for rank 1's delay: issue-to-completion covers it
            assert late.duration_s >= out["delay"] * 0.5
            assert [(f["op"], f["bytes"], f["step"], f["phase"]) for f in flights] == [
                ("all_reduce", n * f32, 2, "async")
            ]
            assert flights[0]["start"] == late.start

        setup = [e for e in events if e.phase == "setup"]
        assert setup and all(e.source == "dtensor" for e in setup)  # sharding the weights
        fwd = [e for e in events if e.step == 3 and e.phase == "forward"]
        assert [(e.op, e.source) for e in fwd] == [("all_reduce", "dtensor")]
        # Rowwise output: a partial (batch 5 x out 6) fp32 tensor summed over the ranks.
        assert fwd[0].bytes == 5 * 6 * f32
        barriers = [(e.bytes, e.phase) for e in events if e.op == "barrier"]
        assert barriers == [(0, "align")]  # the one after stop() is not recorded
        threaded = [(e.op, e.bytes, e.source) for e in events if e.step == 4]
        assert threaded == [("broadcast", n * f32, "user")]

        # Memory of the TP model counts local shards only: Linear(8, 16) split by output
        # rows, Linear(16, 6) split by input columns with its bias replicated.
        local_params = (16 * 8 // world + 16 // world + 6 * 16 // world + 6) * f32
        assert out["tp_params"] == local_params == out["tp_grads"]
        assert out["tp_activations"] > 0 and out["tp_activations_after"] == 0


def _let_go_rank(rank: int, world_size: int) -> dict[str, Any]:
    """The engines' always-on cell tracer (a ``FlightRecorder``: no event log, and no phase
    boundary ever settles it) around all-reduces of fresh tensors, sync and async."""
    import gc
    import weakref

    import torch.distributed as dist

    from workbench.engine.hang import FlightRecorder

    tracer = CommTracer(FlightRecorder(rank)).start()
    refs = []
    for i in range(6):
        t = torch.full((1 << 16,), float(i))
        refs.append(weakref.ref(t))
        if i % 2:
            dist.all_reduce(t, async_op=True).wait()
        else:
            dist.all_reduce(t)
        del t
    # Our completion callback may still be running on gloo's thread when wait() returns.
    deadline = time.monotonic() + 10
    while any(r() is not None for r in refs) and time.monotonic() < deadline:
        gc.collect()
        time.sleep(0.01)
    alive = sum(r() is not None for r in refs)
    in_flight = dict(tracer.recorder.in_flight)
    tracer.stop()
    return {"alive": alive, "in_flight": in_flight, "errors": tracer.errors}


@pytest.mark.engines
def test_a_completed_collective_is_let_go_without_a_phase_boundary() -> None:
    # Each completed collective's future (which holds its tensors) was kept until a phase
    # boundary; the cell tracer sees none, so a loop of all-reduces in a %%wb cell, or an
    # untraced stepper's gradient buffers, kept every tensor (~115 MiB per 1,000 steps of
    # gpt-tiny per engine).
    for out in run_ranks(_let_go_rank):
        assert out == {"alive": 0, "in_flight": {}, "errors": []}


def test_memory_tracer_stops_on_its_own_thread() -> None:
    mem = MemoryTracer(make_mlp(4, 8, 2), None, Recorder()).start()
    errors: list[BaseException] = []

    def stop_elsewhere() -> None:
        try:
            mem.stop()
        except WorkbenchError as exc:
            errors.append(exc)

    thread = threading.Thread(target=stop_elsewhere)
    thread.start()
    thread.join()
    assert len(errors) == 1 and "thread" in str(errors[0])
    mem.stop()
    assert not mem.active


def test_interception_stays_parked_between_tracers_until_released() -> None:
    name = "c10d::allreduce_"
    release()
    assert not torch._C._dispatch_has_kernel_for_dispatch_key(name, "BackendSelect")
    first, second = CommTracer(Recorder()), CommTracer(Recorder())
    with first:
        assert name in intercepted_ops() and active()
        assert "_c10d_functional::all_reduce" in intercepted_ops()
        assert torch._C._dispatch_has_kernel_for_dispatch_key(name, "BackendSelect")
        with second:
            pass
        assert name in intercepted_ops() and active()  # still needed by the first tracer
        assert not release()  # refused while a tracer listens
        assert name in intercepted_ops()
    # Parked: still registered (a loop traced block by block does not re-register the
    # kernels per block), but nobody is told.
    assert name in intercepted_ops() and not active()
    assert torch._C._dispatch_has_kernel_for_dispatch_key(name, "BackendSelect")
    with CommTracer(Recorder()):  # re-entered: the parked kernels serve it
        assert name in intercepted_ops() and active()
    assert release()
    assert intercepted_ops() == []
    assert not torch._C._dispatch_has_kernel_for_dispatch_key(name, "BackendSelect")
    with CommTracer(Recorder()):  # registered again after a release
        assert name in intercepted_ops()
    assert release() and intercepted_ops() == []


def _parked_rank(rank: int, world_size: int) -> dict[str, Any]:
    import torch.distributed as dist

    rec = Recorder(rank)
    t = torch.ones(3)
    with CommTracer(rec):
        dist.all_reduce(t)
    inside = len(_comm(rec.events))
    dist.all_reduce(t)  # parked kernel: redispatched, recorded nowhere
    dist.broadcast(t, src=0)
    parked = "c10d::allreduce_" in intercepted_ops()
    after_parked = len(_comm(rec.events))
    other = Recorder(rank)
    with CommTracer(other):  # a new block records only its own collectives
        dist.all_reduce(t)
    released = release()
    dist.all_reduce(t)  # after release: the plain dispatcher, still correct
    return {
        "inside": inside,
        "parked": parked,
        "after_parked": after_parked,
        "other": [(e.op, e.bytes) for e in _comm(other.events)],
        "released": released,
        "registered_after_release": intercepted_ops(),
        "value": t.tolist(),
        "in_flight": dict(rec.in_flight) | dict(other.in_flight),
    }


@pytest.mark.engines
def test_parked_interception_records_nothing_outside_a_block() -> None:
    for out in run_ranks(_parked_rank):
        assert out["inside"] == 1 and out["parked"]
        assert out["after_parked"] == 1  # the two collectives after the block: not recorded
        assert out["other"] == [("all_reduce", 12)]
        assert out["released"] and out["registered_after_release"] == []
        assert out["value"] == [2.0**4] * 3  # 4 all-reduces of ones over 2 ranks
        assert out["in_flight"] == {}


def test_tracer_is_transparent_without_a_process_group() -> None:
    torch.manual_seed(0)
    model = make_mlp(8, 16, 4, layers=3)
    x = torch.randn(3, 8)
    expected = model(x)
    rec = Recorder()
    with CommTracer(rec):
        got = model(x)
        got.sum().backward()
    assert torch.equal(expected, got) and len(rec) == 0
    with pytest.raises(WorkbenchError, match="DistributedDataParallel"):
        CommTracer(rec).attach_ddp(model)  # type: ignore[arg-type]


def _cuda_rank() -> list[CommEvent]:
    import torch.distributed as dist

    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1)
    try:
        rec = Recorder()
        model = torch.nn.parallel.DistributedDataParallel(make_mlp(64, 256, 8).cuda())
        tracer = CommTracer(rec).start()
        tracer.attach_ddp(model)
        t = torch.ones(1 << 22, device="cuda")
        dist.all_reduce(t)
        with rec.phase_span("backward", step=1):
            model(torch.randn(4, 64, device="cuda")).sum().backward()
        tracer.stop()  # flushes the CUDA-timed events
        return _comm(rec.events)
    finally:
        dist.destroy_process_group()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_collectives_timed_with_cuda_events() -> None:
    events = _cuda_rank()
    user = [e for e in events if e.source == "user" and e.op == "all_reduce"]
    assert [e.bytes for e in user] == [(1 << 22) * 4]
    buckets = [e for e in events if e.source == "ddp-bucket"]
    model_bytes = sum(p.numel() * 4 for p in make_mlp(64, 256, 8).parameters())
    assert sum(e.bytes for e in buckets) == model_bytes
    assert all(e.end > e.start for e in events)


def test_a_backend_select_kernel_registered_by_someone_else_is_left_alone() -> None:
    name = "c10d::barrier"
    op = torch.ops.c10d.barrier.default
    below = torch._C._dispatch_keyset_full_after(torch._C.DispatchKey.BackendSelect)

    def theirs(keyset: Any, *args: Any, **kwargs: Any) -> Any:
        return op.redispatch(keyset & below, *args, **kwargs)

    with CommTracer(Recorder()):  # the interception's op list is known from here on
        assert name in intercepted_ops()
    # Parked kernels hold BackendSelect until released: whoever registers their own
    # releases first (a registration over ours is refused by torch).
    assert release()
    library = torch.library.Library("c10d", "IMPL")
    library.impl("barrier", theirs, "BackendSelect", with_keyset=True)
    try:
        with CommTracer(Recorder()):
            assert name not in intercepted_ops()  # theirs stays; barrier goes untraced
            assert "c10d::allreduce_" in intercepted_ops()
        assert torch._C._dispatch_has_kernel_for_dispatch_key(name, "BackendSelect")
        assert release()
        assert torch._C._dispatch_has_kernel_for_dispatch_key(name, "BackendSelect")  # theirs
    finally:
        library._destroy()
    assert not torch._C._dispatch_has_kernel_for_dispatch_key(name, "BackendSelect")
