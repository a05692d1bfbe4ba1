"""Megatron-style tensor parallelism written out by hand: a teaching view beside ``tp.py``.

A feed-forward block ``fc2(gelu(fc1(x)))`` is split so that each of ``t`` ranks holds a
column slice of ``fc1`` (``hidden/t`` output features) and the matching row slice of ``fc2``
(``hidden/t`` input features). The non-linearity runs on local slices, so the block needs
exactly two all-reduces per pass (Shoeybi et al. 2019, fig. 3):

- *f* in front of ``fc1``: identity forward, all-reduce of the input gradient backward;
- *g* after ``fc2``: all-reduce of the partial outputs forward, identity backward.

Both live in ``collectives.py``. ``tp.py`` does the same with DTensor's
``ColwiseParallel``/``RowwiseParallel``; this file shows where those collectives sit.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed import ProcessGroup

from workbench.errors import ParallelError
from workbench.parallel.collectives import (
    all_gather_cat,
    copy_to_parallel_region,
    group_rank,
    group_size,
    reduce_from_parallel_region,
)
from workbench.parallel.models import FeedForward

__all__ = [
    "ColumnParallelLinear",
    "RowParallelLinear",
    "apply_megatron",
    "megatron_full_state_dict",
    "megatron_plan",
]


class _ShardedLinear(nn.Module):
    """This rank's slice of a linear layer and the group it was split over."""

    def __init__(
        self, weight: torch.Tensor, bias: torch.Tensor | None, group: ProcessGroup
    ) -> None:
        super().__init__()
        self.group = group
        self.weight = nn.Parameter(weight)
        self.bias = nn.Parameter(bias) if bias is not None else None


class ColumnParallelLinear(_ShardedLinear):
    """``y_local = f(x) @ W_local.T + b_local``; W split along its output rows."""

    @classmethod
    def from_linear(cls, linear: nn.Linear, group: ProcessGroup) -> ColumnParallelLinear:
        t, r = group_size(group), group_rank(group)
        w = linear.weight.detach().chunk(t, dim=0)[r].clone()
        b = linear.bias.detach().chunk(t, dim=0)[r].clone() if linear.bias is not None else None
        return cls(w, b, group)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(copy_to_parallel_region(x, self.group), self.weight, self.bias)


class RowParallelLinear(_ShardedLinear):
    """``y = g(x_local @ W_local.T) + b``; W split along its input columns, bias whole."""

    @classmethod
    def from_linear(cls, linear: nn.Linear, group: ProcessGroup) -> RowParallelLinear:
        t, r = group_size(group), group_rank(group)
        w = linear.weight.detach().chunk(t, dim=1)[r].clone()
        b = linear.bias.detach().clone() if linear.bias is not None else None
        return cls(w, b, group)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # The bias is added once, after the sum, not on every rank.
        y = reduce_from_parallel_region(F.linear(x, self.weight), self.group)
        return y + self.bias if self.bias is not None else y


def megatron_plan(model: nn.Module) -> dict[str, str]:
    """The split ``apply_megatron`` makes, as a TP plan: every ``FeedForward``'s fc1
    column-wise and fc2 row-wise; everything else (attention included) stays whole."""
    plan: dict[str, str] = {}
    for name, module in model.named_modules():
        if isinstance(module, FeedForward):
            prefix = f"{name}." if name else ""
            plan[f"{prefix}fc1"] = "colwise"
            plan[f"{prefix}fc2"] = "rowwise"
    return plan


_SLICES = {"colwise": ColumnParallelLinear, "rowwise": RowParallelLinear}


def apply_megatron(model: nn.Module, group: ProcessGroup) -> nn.Module:
    """Replace every ``FeedForward``'s fc1/fc2 by column/row-parallel slices, in place
    (``megatron_plan``).

    Works on the MLP's blocks and on the GPT's MLP blocks; attention stays replicated (every
    rank computes it whole, so its gradients agree without communication).
    """
    t = group_size(group)
    plan = megatron_plan(model)
    for path, style in plan.items():
        parent_name, _, attr = path.rpartition(".")
        parent = model.get_submodule(parent_name)
        linear = getattr(parent, attr)
        if style == "colwise" and linear.out_features % t:
            hidden = linear.out_features
            raise ParallelError(
                f"tp={t} does not divide the feed-forward hidden size {hidden}; "
                f"choose tp among {[d for d in range(1, hidden + 1) if hidden % d == 0]}"
            )
        setattr(parent, attr, _SLICES[style].from_linear(linear, group))
    if not plan:
        raise ParallelError(
            f"apply_megatron found no FeedForward block in {type(model).__name__}; "
            "it works on workbench.parallel.models.MLP and GPT"
        )
    return model


def megatron_full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """Full parameters on every rank: column slices gathered on dim 0, row slices on dim 1."""
    out: dict[str, torch.Tensor] = {}
    seen: set[int] = set()  # a tied parameter is reported once, under its first name
    for name, module in model.named_modules():
        prefix = f"{name}." if name else ""
        for pname, p in module.named_parameters(recurse=False):
            if id(p) in seen:
                continue
            seen.add(id(p))
            value = p.detach()
            if isinstance(module, ColumnParallelLinear):
                value = all_gather_cat(value, 0, module.group)
            elif isinstance(module, RowParallelLinear) and pname == "weight":
                value = all_gather_cat(value, 1, module.group)
            out[prefix + pname] = value.clone()
    return out
