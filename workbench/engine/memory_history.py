"""On the engines: the CUDA caching allocator's own history of a run, for
``Stepper.export_memory_snapshot``.

A run built on a CUDA device records the allocator's alloc/free actions
(``torch.cuda.memory._record_memory_history``) in a ring of ``MAX_ENTRIES``, so a long run
keeps its most recent actions at a fixed cost. ``cuda_snapshot`` hands the kernel the
snapshot and which storages the parameters, gradients and optimizer state hold, which it
tags (``trace.memory_snapshot.tag_snapshot``); on CPU there is no such history and the
kernel builds the snapshot from the memory tracer's samples instead.
"""

from __future__ import annotations

from typing import Any

from workbench.engine.state import engine_state

__all__ = ["MAX_ENTRIES", "cuda_snapshot", "snapshot_of", "start_history", "storage_categories"]

MAX_ENTRIES = 100_000  # actions kept (a ring): a few steps of a large model, bounded
_STARTED = "memory_history"


def _on_cuda(train_step: Any) -> bool:
    device = getattr(train_step, "device", None)
    return getattr(device, "type", None) == "cuda"


def start_history(train_step: Any) -> bool:
    """Record the allocator's history for a run on CUDA; False elsewhere."""
    if not _on_cuda(train_step):
        return False
    import torch

    torch.cuda.memory._record_memory_history(max_entries=MAX_ENTRIES)
    return True


def storage_categories(train_step: Any) -> dict[int, str]:
    """Data pointer -> category of the storages the run holds now."""
    from workbench.trace.storage import optimizer_state_tensors

    out: dict[int, str] = {}
    model = getattr(train_step, "model", None)
    for p in model.parameters() if model is not None else ():
        out[p.untyped_storage().data_ptr()] = "params" if p.requires_grad else "frozen"
        if p.grad is not None:
            out[p.grad.untyped_storage().data_ptr()] = "grads"
    for t in optimizer_state_tensors(getattr(train_step, "optimizer", None)):
        out[t.untyped_storage().data_ptr()] = "optimizer"
    return out


def cuda_snapshot() -> dict[str, Any] | None:
    """This rank's allocator snapshot and storage categories, or None off CUDA."""
    return snapshot_of(engine_state().current_run())


def snapshot_of(train_step: Any) -> dict[str, Any] | None:
    """``train_step``'s allocator snapshot and storage categories, or None off CUDA."""
    if not _on_cuda(train_step):
        return None
    import torch

    snapshot = torch.cuda.memory._snapshot()
    return {"snapshot": snapshot, "categories": storage_categories(train_step)}
