"""Every collective the workbench issues itself goes through this module.

DDP, FSDP2, DTensor and pipelining issue their own collectives (seen by the comm tracer
through dispatch-level capture). What remains is ours: the explicit
gradient all-reduce of DDP with ``overlap=False``, the Megatron f/g operators, the tied
embedding gradient of a pipeline, the loss average for reporting and the gathers that
assemble full parameters. Keeping them in one place gives tracing a single hook point
(picotron's ``tp_communications.py``) and lets a reader see every hand-written exchange.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup

__all__ = [
    "AllReduceBackward",
    "AllReduceForward",
    "all_gather_cat",
    "all_reduce",
    "copy_to_parallel_region",
    "gather_objects",
    "group_rank",
    "group_size",
    "keep_for_backward",
    "reduce_from_parallel_region",
]


def group_size(group: ProcessGroup | None) -> int:
    return dist.get_world_size(group) if dist.is_initialized() else 1


def group_rank(group: ProcessGroup | None) -> int:
    return dist.get_rank(group) if dist.is_initialized() else 0


def all_reduce(
    tensor: torch.Tensor, group: ProcessGroup | None = None, *, average: bool = False
) -> torch.Tensor:
    """In-place sum (or mean) of ``tensor`` over ``group``; returns it for chaining.

    gloo has no AVG reduction, so the mean is a sum followed by a division, as in DDP.
    """
    n = group_size(group)
    if n > 1:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=group)
        if average:
            tensor.div_(n)
    return tensor


def all_gather_cat(
    tensor: torch.Tensor, dim: int, group: ProcessGroup | None = None
) -> torch.Tensor:
    """Concatenate every rank's ``tensor`` along ``dim`` (equal shapes), in group-rank order."""
    n = group_size(group)
    if n == 1:
        return tensor
    parts = [torch.empty_like(tensor) for _ in range(n)]
    dist.all_gather(parts, tensor.contiguous(), group=group)
    return torch.cat(parts, dim=dim)


def gather_objects(obj: Any, dst: int = 0, group: ProcessGroup | None = None) -> list[Any] | None:
    """Pickle-gather ``obj`` from every rank onto global rank ``dst``; None elsewhere."""
    if not dist.is_initialized() or dist.get_world_size(group) == 1:
        return [obj]
    out: list[Any] | None = [None] * dist.get_world_size(group) if dist.get_rank() == dst else None
    dist.gather_object(obj, out, dst=dst, group=group)
    return out


def keep_for_backward(ctx: Any, **values: Any) -> None:
    """Keep what an autograd Function's ``backward`` needs besides tensors (a process
    group, split sizes) on its ``ctx``: torch hands ``forward`` that object for exactly
    this (tensors go through ``ctx.save_for_backward``). The parallel layer's one writer."""
    for name, value in values.items():
        setattr(ctx, name, value)


class AllReduceBackward(torch.autograd.Function):
    """Megatron's *f*: identity forward, all-reduce (sum) of the gradient in backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: ProcessGroup | None) -> torch.Tensor:
        keep_for_backward(ctx, group=group)
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return all_reduce(grad.contiguous().clone(), ctx.group), None


class AllReduceForward(torch.autograd.Function):
    """Megatron's *g*: all-reduce (sum) of the activation forward, identity in backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: ProcessGroup | None) -> torch.Tensor:
        return all_reduce(x.contiguous().clone(), group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


def copy_to_parallel_region(x: torch.Tensor, group: ProcessGroup | None) -> torch.Tensor:
    """*f*: enter a tensor-parallel region (input of a column-parallel linear)."""
    return AllReduceBackward.apply(x, group)


def reduce_from_parallel_region(x: torch.Tensor, group: ProcessGroup | None) -> torch.Tensor:
    """*g*: leave a tensor-parallel region (output of a row-parallel linear)."""
    return AllReduceForward.apply(x, group)
