"""Data parallelism with PyTorch's DistributedDataParallel, overlapped or not.

``overlap=True`` is DDP as shipped: gradients are grouped into buckets and each bucket is
all-reduced as soon as backward has produced it, hiding communication behind the rest of
backward. ``overlap=False`` keeps DDP (its start-up broadcast of rank 0's parameters, its
API) but switches the bucket all-reduce off, exactly as ``no_sync()`` does, and averages
the gradients later in an explicit ``sync()`` call: a learner then sees backward and
communication as two separate phases, and the cost of not overlapping them.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch.distributed as dist
from torch import nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors
from torch.distributed.device_mesh import DeviceMesh
from torch.nn.parallel import DistributedDataParallel

from workbench.parallel.collectives import all_reduce

__all__ = ["DeferredSyncDDP", "apply_dp", "average_gradients"]


class DeferredSyncDDP(DistributedDataParallel):
    """DDP whose backward never communicates; call ``sync()`` after backward."""

    def __init__(self, module: nn.Module, **kwargs: object) -> None:
        super().__init__(module, **kwargs)  # type: ignore[arg-type]
        # The flag ``no_sync()`` clears for the duration of its block, cleared for good.
        self.require_backward_grad_sync = False

    def sync(self) -> None:
        """Average every gradient over the data-parallel group in one flat all-reduce."""
        average_gradients(self.module.parameters(), self.process_group)


def average_gradients(params: Iterable[nn.Parameter], group: dist.ProcessGroup) -> None:
    """Average the parameters' gradients over ``group`` in one flat all-reduce."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return
    flat = _flatten_dense_tensors(grads)
    all_reduce(flat, group, average=True)
    for grad, synced in zip(grads, _unflatten_dense_tensors(flat, grads), strict=True):
        grad.copy_(synced)


def apply_dp(
    model: nn.Module, mesh: DeviceMesh, *, overlap: bool = True, bucket_cap_mb: float = 25.0
) -> DistributedDataParallel:
    """Wrap ``model`` for data parallelism over the 1-D ``mesh``.

    Returns ``DistributedDataParallel`` (``overlap=True``) or ``DeferredSyncDDP``.
    """
    device = next(model.parameters()).device
    device_ids = [device.index] if device.type == "cuda" else None
    cls = DistributedDataParallel if overlap else DeferredSyncDDP
    kwargs: dict[str, object] = {
        "process_group": mesh.get_group(),
        "device_ids": device_ids,
        "bucket_cap_mb": bucket_cap_mb,
    }
    return cls(model, **kwargs)  # type: ignore[arg-type]
