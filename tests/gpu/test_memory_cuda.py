"""The memory tracer on CUDA, against the caching allocator's own counters; bf16 and
activation checkpointing's measured activation drop (in this process, on cuda:0)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.gpu._gpt import SMALL, allocator_bytes, gpt_step
from workbench.engine.probe import engine_memory


def _fresh() -> int:
    """The allocator's bytes in use, after the cuBLAS workspaces exist (a process's first
    matmul allocates them through the caching allocator, and keeps them)."""
    a = torch.ones(64, 64, device="cuda:0", requires_grad=True)
    (a @ a).sum().backward()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        (a @ a).float().sum().backward()
    del a
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    return torch.cuda.memory_allocated()


def test_categories_match_the_allocators_deltas_exactly(numbers: dict[str, Any]) -> None:
    base = _fresh()
    step = gpt_step(SMALL, "cuda:0")
    model, optimizer, tracer = step.model, step.optimizer, step.memory_tracer
    params = list(model.parameters())
    after_params = torch.cuda.memory_allocated()
    accumulator = allocator_bytes([step._loss_sum])  # the step's loss sum, 512 B
    for phase in ("data", "forward", "backward"):
        assert step.run_phase() == phase
    x_y = sum(allocator_bytes([t]) for t in step._micro[0])  # the batch, now on the GPU
    grads = [p.grad for p in params if p.grad is not None]
    after_backward = torch.cuda.memory_allocated()
    sample = tracer.sample("after backward")
    optimizer.step()
    state = [v for s in optimizer.state.values() for v in s.values() if v.is_cuda]
    after_optimizer = torch.cuda.memory_allocated()
    opt_sample = tracer.sample("after optimizer")
    numbers.update(
        params_bytes=sample.params,
        grads_bytes=sample.grads,
        optimizer_bytes=opt_sample.optimizer,
        allocator_params_delta=after_params - base - accumulator,
        allocator_grads_delta=after_backward - after_params - x_y,
        allocator_optimizer_delta=after_optimizer - after_backward,
    )
    # The tracer counts storage bytes; the allocator charges each one rounded up to 512 B.
    assert sample.params == sum(p.untyped_storage().nbytes() for p in params)
    assert after_params - base - accumulator == allocator_bytes(params)
    assert sample.grads == sum(g.untyped_storage().nbytes() for g in grads)
    assert after_backward - after_params - x_y == allocator_bytes(grads)
    assert opt_sample.optimizer == sum(v.untyped_storage().nbytes() for v in state)
    assert after_optimizer - after_backward == allocator_bytes(state)
    assert opt_sample.allocator == after_optimizer  # the tracer's allocator category
    step.close()


def test_peak_and_reserved_against_the_allocator(numbers: dict[str, Any]) -> None:
    base = _fresh()
    step = gpt_step(SMALL, "cuda:0")
    for _ in range(3):
        step.run_step()
    peak = step.memory_tracer.peak(2)
    assert peak is not None
    torch.cuda.synchronize()
    max_allocated = torch.cuda.max_memory_allocated()
    allocated, reserved = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    probe = engine_memory()  # what the dashboard shows for an engine
    categories = peak.params + peak.grads + peak.optimizer + peak.activations
    numbers.update(
        peak_categories_bytes=categories,
        peak_allocator_sampled=peak.allocator,
        max_memory_allocated=max_allocated,
        categories_over_max_allocated=categories / max(1, max_allocated - base),
        allocated=allocated,
        reserved=reserved,
        reserved_minus_allocated=reserved - allocated,
    )
    # Samples are taken at phase ends: never above the allocator's own high-water mark.
    assert peak.allocator <= max_allocated
    assert reserved >= allocated
    assert probe["cuda_allocated"] == allocated and probe["cuda_reserved"] == reserved
    # Each category's own peak, added up, bounds the true peak from above within what the
    # categories leave out (the batch, logits' temporaries, the optimizer's scratch).
    assert 0.5 <= categories / (max_allocated - base) <= 2.0
    step.close()


def _activation_peak(**options: Any) -> tuple[int, int]:
    """(the tracer's activation peak, max_memory_allocated's rise over the model's state)."""
    _fresh()
    step = gpt_step(SMALL, "cuda:0", batch_size=16, **options)
    step.run_step()  # the first step creates the optimizer state
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    step.run_step()
    torch.cuda.synchronize()
    peak = step.memory_tracer.peak(1)
    assert peak is not None
    rise = torch.cuda.max_memory_allocated() - before
    step.close()
    return peak.activations, rise


@pytest.mark.parametrize(
    "options", [{"precision": "bf16"}, {"checkpointing": True}], ids=["bf16", "checkpointing"]
)
def test_bf16_and_checkpointing_drop_activations(
    options: dict[str, Any], numbers: dict[str, Any]
) -> None:
    fp32_traced, fp32_rise = _activation_peak()
    traced, rise = _activation_peak(**options)
    numbers.update(
        fp32_activation_bytes=fp32_traced,
        activation_bytes=traced,
        traced_ratio=traced / fp32_traced,
        fp32_allocator_rise=fp32_rise,
        allocator_rise=rise,
        allocator_ratio=rise / fp32_rise,
    )
    assert traced < 0.8 * fp32_traced  # the tracer sees the drop ...
    assert rise < fp32_rise  # ... and so does the allocator
