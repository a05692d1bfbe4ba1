"""The counts a memory sample reuses (memory_cache): exact after every change, reused otherwise.

Each test changes what a cache holds in one way it must notice, and checks the sample
against a count made from scratch (``parameter_bytes`` / ``optimizer_bytes``, uncached).
"""

from __future__ import annotations

import copy
import os
from typing import Any

import pytest
import torch
from torch import nn

from tests.harness import run_ranks
from tests.trace.models import TiedLM, make_mlp
from workbench.trace import (
    MemoryTracer,
    Recorder,
    optimizer_bytes,
    parameter_bytes,
    process_rss,
)
from workbench.trace.memory_cache import optimizer_cache, parameter_cache, parameters_of
from workbench.trace.storage import optimizer_counter_bytes

F32 = 4


def _numel(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def test_parameters_of_is_model_parameters() -> None:
    model = nn.Sequential(make_mlp(4, 8, 2), TiedLM(10, 4), nn.Linear(3, 3, bias=False))
    shared = nn.Linear(2, 2)
    model.add_module("a", shared)
    model.add_module("b", shared)  # the same submodule twice
    model.add_module("empty", None)  # a submodule slot registered as None
    expected = list(model.parameters())
    got = parameters_of(model)
    assert len(got) == len(expected)
    assert {id(p) for p in got} == {id(p) for p in expected}


def test_parameter_bytes_follow_replaced_and_reallocated_parameters() -> None:
    model = make_mlp(16, 32, 8, layers=3)
    tracer = MemoryTracer(model, None, Recorder())
    cache = parameter_cache(model)
    assert tracer.sample().params == parameter_bytes(model) == _numel(model) * F32
    counted = cache.recounts
    tracer.sample()
    assert cache.recounts == counted  # nothing changed: reused

    model[0].weight = nn.Parameter(torch.zeros(32, 16 * 3))  # a parameter replaced
    assert tracer.sample().params == parameter_bytes(model) == _numel(model) * F32
    model[2].weight.data = torch.zeros(32, 32, dtype=torch.float64)  # reallocated in place
    assert tracer.sample().params == parameter_bytes(model)
    storage = model[4].weight.untyped_storage()
    full = storage.nbytes()
    storage.resize_(0)  # freed, as FSDP frees an unsharded parameter
    assert tracer.sample().params == parameter_bytes(model)
    storage.resize_(full)
    assert tracer.sample().params == parameter_bytes(model)
    model.add_module("extra", nn.Linear(5, 5))  # a submodule added
    assert tracer.sample().params == parameter_bytes(model)


class _Aliasing(nn.Module):
    """Saves a plain tensor sharing the weight's storage (not a Parameter, not a view of
    one): only the parameter storage keys tell the pack hook it is not an activation."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(8, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.weight.detach()  # autograd saves the detached alias for x's grad


def test_the_pack_hook_knows_a_replaced_parameter() -> None:
    model = _Aliasing()
    x = torch.randn(8, 8, requires_grad=True)
    tracer = MemoryTracer(model, None, Recorder()).start()
    try:
        out = model(x)
        assert tracer.activation_bytes == 0
        out.sum().backward()
        model.weight = nn.Parameter(torch.randn(8, 8))
        out = model(x)
        assert tracer.activation_bytes == 0  # the new weight's storage is a parameter's
        out.sum().backward()
    finally:
        tracer.stop()


def test_optimizer_bytes_refresh_after_steps_and_loads() -> None:
    model = make_mlp(16, 32, 8, layers=3)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    fresh = opt.state_dict()
    tracer = MemoryTracer(model, opt, Recorder()).start()
    try:
        assert tracer.sample().optimizer == 0
        model(torch.randn(4, 16)).sum().backward()
        opt.step()  # creates exp_avg / exp_avg_sq
        after = tracer.sample()
        assert after.optimizer == optimizer_bytes(opt) == 2 * _numel(model) * F32
        assert after.other == optimizer_counter_bytes(opt) > 0
        opt.load_state_dict(fresh)  # back to no state
        assert tracer.sample().optimizer == optimizer_bytes(opt) == 0
    finally:
        tracer.stop()
    # A step taken between two traced blocks, with no tracer running, is seen by the next.
    opt.step()
    again = MemoryTracer(model, opt, Recorder()).start()
    try:
        assert again.sample().optimizer == optimizer_bytes(opt) == 2 * _numel(model) * F32
    finally:
        again.stop()


class _GrowingSGD(torch.optim.SGD):
    """Each step adds one more buffer to every parameter's state (the state dict keeps its
    length: only the step tells the cache), taking a memory sample after each parameter."""

    tracer: MemoryTracer | None = None
    seen: list[int]

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        self.seen = []
        params = self.param_groups[0]["params"]
        for p in params:
            self.state[p]  # every entry exists before any buffer is added
        for p in params:
            state = self.state[p]
            state[f"buf{len(state)}"] = torch.zeros_like(p)
            if self.tracer is not None:
                self.seen.append(self.tracer.sample().optimizer)


def test_optimizer_bytes_inside_and_after_steps_that_keep_the_state_length() -> None:
    model = make_mlp(4, 8, 2, layers=2)
    opt = _GrowingSGD(model.parameters(), lr=0.1)
    tracer = MemoryTracer(model, opt, Recorder()).start()
    opt.tracer = tracer
    sizes = [p.numel() * F32 for p in model.parameters()]
    try:
        tracer.sample()  # counted (nothing yet) before the step
        opt.step()
        # Samples taken inside the step: the state as it is at that moment.
        assert opt.seen == [sum(sizes[: i + 1]) for i in range(len(sizes))]
        opt.step()
        assert opt.seen == [sum(sizes) + sum(sizes[: i + 1]) for i in range(len(sizes))]
        opt.tracer = None
        assert tracer.sample().optimizer == 2 * sum(sizes)
        unhooked = _GrowingSGD.step.__wrapped__  # type: ignore[attr-defined]
        opt.step = lambda: unhooked(opt)  # type: ignore[method-assign]
        opt.step()  # patched onto the instance: torch runs no step hooks for it
        assert tracer.sample().optimizer == 3 * sum(sizes) == optimizer_bytes(opt)
        opt.step()
        assert tracer.sample().optimizer == 4 * sum(sizes) == optimizer_bytes(opt)
    finally:
        tracer.stop()


def test_optimizer_bytes_after_a_step_taken_between_samples() -> None:
    model = make_mlp(4, 8, 2, layers=2)
    opt = _GrowingSGD(model.parameters(), lr=0.1)
    sizes = [p.numel() * F32 for p in model.parameters()]
    tracer = MemoryTracer(model, opt, Recorder())
    opt.step()
    assert tracer.sample().optimizer == sum(sizes)
    one_buffer = copy.deepcopy(opt.state_dict())
    opt.step()  # the state dict keeps its length; only the step says it changed
    assert tracer.sample().optimizer == 2 * sum(sizes) == optimizer_bytes(opt)
    opt.load_state_dict(one_buffer)  # as many entries, smaller: a new state dict
    assert tracer.sample().optimizer == sum(sizes) == optimizer_bytes(opt)


class _SwappingSGD(torch.optim.SGD):
    """Keeps one buffer per parameter and changes it at each step in one of the ways an
    in-place check must notice: a larger tensor under the same key, then the same tensor
    reallocated (``.data =``), then a tensor of another dtype."""

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        for p in self.param_groups[0]["params"]:
            state = self.state[p]
            buf = state.get("buf")
            if buf is None:
                state["buf"] = torch.zeros_like(p)
            elif buf.numel() == p.numel():
                state["buf"] = torch.zeros(2 * p.numel())  # replaced, same key
            elif buf.dtype == torch.float32:
                buf.data = torch.zeros(3 * p.numel())  # same tensor, reallocated
            else:
                buf.mul_(0.5)  # in place: the count is reused


def test_optimizer_bytes_after_steps_that_replace_or_reallocate_the_state() -> None:
    model = make_mlp(4, 8, 2, layers=2)
    opt = _SwappingSGD(model.parameters(), lr=0.1)
    tracer = MemoryTracer(model, opt, Recorder())
    numel = _numel(model)
    for factor in (1, 2, 3):
        opt.step()
        assert tracer.sample().optimizer == optimizer_bytes(opt) == factor * numel * F32
    for p in model.parameters():
        opt.state[p]["buf"].data = torch.zeros(3 * p.numel(), dtype=torch.float64)
    opt.step()  # the step after a change made outside one: still seen
    assert tracer.sample().optimizer == optimizer_bytes(opt) == 3 * numel * 8


def test_optimizer_bytes_reused_after_in_place_steps() -> None:
    model = make_mlp(4, 8, 2, layers=2)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tracer = MemoryTracer(model, opt, Recorder())
    cache = optimizer_cache(opt)
    assert cache is not None
    model(torch.randn(3, 4)).sum().backward()
    opt.step()
    assert tracer.sample().optimizer == optimizer_bytes(opt) == 2 * _numel(model) * F32
    counted = cache.recounts
    for _ in range(3):  # AdamW updates its state in place: the count stands
        opt.step()
        assert tracer.sample().optimizer == optimizer_bytes(opt)
    assert cache.recounts == counted


def _fsdp_reshard(rank: int, world: int) -> list[tuple[int, int]]:
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = make_mlp(16, 32, 8, layers=3)
    fully_shard(model)
    tracer = MemoryTracer(model, None, Recorder(rank))
    out = [(tracer.sample().params, parameter_bytes(model))]
    model.unshard()  # FSDP2 swaps the unsharded parameters in
    out.append((tracer.sample().params, parameter_bytes(model)))
    model.reshard()  # and the sharded ones back
    out.append((tracer.sample().params, parameter_bytes(model)))
    return out


@pytest.mark.engines
def test_parameter_bytes_follow_fsdp_unshard_and_reshard() -> None:
    full = _numel(make_mlp(16, 32, 8, layers=3)) * F32
    for sharded, unsharded, resharded in run_ranks(_fsdp_reshard, timeout=120):
        assert sharded[0] == sharded[1] == full // 2  # 2 ranks: half each
        assert unsharded[0] == unsharded[1] == full
        assert resharded[0] == resharded[1] == full // 2


@pytest.mark.engines  # forks a child process
def test_process_rss_after_a_fork_is_the_childs() -> None:
    process_rss()  # the parent's /proc/self/statm is open now
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: grow by 256 MiB and report what process_rss sees
        try:
            before = process_rss()
            grown = torch.ones(64 * 2**20)  # 256 MiB, touched
            os.write(write, f"{before} {process_rss()} {int(grown[-1])}".encode())
        finally:
            os._exit(0)
    os.close(write)
    before, after, _ = (int(v) for v in os.read(read, 200).split())
    os.close(read)
    os.waitpid(pid, 0)
    assert after - before >= 200 * 2**20  # the child's own growth, not the parent's RSS


def test_a_start_sample_walks_the_parameters_of_now() -> None:
    """``start(sample=...)`` shares one walk between the hooks and the sample: the walk made
    at that moment, not the cache of an earlier tracer on the same model."""
    model = _Aliasing()
    first = MemoryTracer(model, None, Recorder())
    assert first.sample().params == 8 * 8 * F32
    model.weight = nn.Parameter(torch.randn(16, 8))  # replaced between two tracers
    rec = Recorder()
    second = MemoryTracer(model, None, rec).start(sample="start")
    try:
        (start,) = [e for e in rec.events if getattr(e, "label", None) == "start"]
        assert start.params == parameter_bytes(model) == 16 * 8 * F32
        x = torch.randn(16, 8, requires_grad=True)
        out = model(x)
        assert second.activation_bytes == 0  # the new weight's alias is a parameter's
        out.sum().backward()
    finally:
        second.stop()
