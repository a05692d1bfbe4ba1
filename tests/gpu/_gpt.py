"""A small GPT's training step on one device, for the GPU checks (in the test process and,
shipped by value, on an engine)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from workbench.parallel.data import batches, make_dataset, make_loader
from workbench.parallel.models import GPTConfig, build_model, loss_fn_for
from workbench.parallel.options import apply_checkpointing
from workbench.parallel.step import TrainStep
from workbench.trace.memory import MemoryTracer
from workbench.trace.recorder import Recorder

# Every parameter at most 1 MiB, so each comes from the caching allocator's small pool,
# where an allocation is its size rounded up to 512 bytes (see ``allocator_bytes``).
SMALL = GPTConfig(vocab=512, seq_len=128, dim=256, n_heads=4, n_layers=4)
# Big enough that one step keeps the GPU busy well past launch overhead (planner check).
PLANNED = GPTConfig(vocab=8192, seq_len=1024, dim=1024, n_heads=16, n_layers=8)
ALLOCATION_ROUND = 512  # CUDACachingAllocator's kMinBlockSize


def allocator_bytes(tensors: list[torch.Tensor]) -> int:
    """What the caching allocator charges for these tensors' storages (each counted once)."""
    seen: dict[int, int] = {}
    for t in tensors:
        storage = t.untyped_storage()
        seen[storage.data_ptr()] = -(-storage.nbytes() // ALLOCATION_ROUND) * ALLOCATION_ROUND
    return sum(seen.values())


def gpt_step(
    config: GPTConfig,
    device: torch.device | str,
    *,
    precision: str = "fp32",
    checkpointing: bool = False,
    batch_size: int = 8,
    wrap: Callable[[nn.Module], nn.Module] | None = None,
    strategy: str = "single",
    seed: int = 0,
) -> TrainStep:
    """A traced ``TrainStep`` of ``config`` on ``device`` (``wrap``: DDP / FSDP on a mesh)."""
    torch.manual_seed(seed)
    model = build_model(config)
    if checkpointing:
        apply_checkpointing(model)
    model = model.to(device)
    inner = model
    if wrap is not None:
        model = wrap(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    recorder = Recorder(0)
    tracer = MemoryTracer(inner, optimizer, recorder)
    tracer.start()
    loader = make_loader(make_dataset(config, batch_size * 4, seed=seed), batch_size, seed=seed)
    return TrainStep(
        model=model,
        optimizer=optimizer,
        batches=batches(loader),
        loss_fn=loss_fn_for(config),
        device=device,
        recorder=recorder,
        precision=precision,
        memory_tracer=tracer,
        strategy=strategy,
    )


def full_params(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter in full, on the CPU (an FSDP2 DTensor gathered)."""
    out: dict[str, Any] = {}
    for name, p in model.named_parameters():
        data = p.data.full_tensor() if hasattr(p.data, "full_tensor") else p.data
        out[name.removeprefix("module.")] = data.detach().float().cpu()
    return out
