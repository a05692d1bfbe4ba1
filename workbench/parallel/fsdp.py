"""ZeRO stages with PyTorch's own tools.

- stage 1: optimizer state sharded (``ZeroRedundancyOptimizer``) over a DDP model: every
  rank keeps whole parameters and gradients but updates only its slice, then broadcasts it;
- stage 2: ``fully_shard(reshard_after_forward=False)``: parameters stay gathered between
  forward and backward, gradients and optimizer state are sharded (reduce-scatter);
- stage 3: ``fully_shard`` (FSDP2) with resharding after forward: parameters, gradients and
  optimizer state all sharded; each block is gathered just before it runs.

Each block (``model.layers``) is its own FSDP unit, then the root, as in torchtitan, so one
block's all-gather can overlap the previous block's compute.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.optim import ZeroRedundancyOptimizer

from workbench.errors import ConfigError
from workbench.parallel.dp import apply_dp

__all__ = ["ZERO_STAGES", "apply_fsdp", "zero_optimizer"]

ZERO_STAGES: tuple[int, ...] = (1, 2, 3)


def apply_fsdp(
    model: nn.Module,
    mesh: DeviceMesh,
    *,
    stage: int = 3,
    param_dtype: torch.dtype | None = None,
    blocks: Iterable[nn.Module] | None = None,
) -> nn.Module:
    """Shard ``model`` over the 1-D data-parallel ``mesh`` for ZeRO ``stage``.

    Stage 1 returns a DDP model: pair it with ``zero_optimizer``. ``param_dtype=bfloat16``
    computes in bf16 with fp32 sharded master weights and fp32 gradient reduction
    (``MixedPrecisionPolicy``); stage 1 uses autocast instead (see ``step.py``).
    ``blocks``: the modules that become FSDP units before the root (default: the values of
    ``model.layers``).
    """
    if stage not in ZERO_STAGES:
        raise ConfigError(f"stage={stage!r} is not valid; choose one of: {ZERO_STAGES}")
    if stage == 1:
        return apply_dp(model, mesh, overlap=True)
    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    reshard = stage == 3
    if blocks is None:
        layers = getattr(model, "layers", None)
        blocks = layers.values() if isinstance(layers, nn.ModuleDict) else ()
    for block in blocks:
        fully_shard(block, mesh=mesh, reshard_after_forward=reshard, mp_policy=policy)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard, mp_policy=policy)
    return model


def zero_optimizer(
    params: Iterable[nn.Parameter],
    optimizer_class: type[torch.optim.Optimizer],
    mesh: DeviceMesh,
    **defaults: Any,
) -> ZeroRedundancyOptimizer:
    """ZeRO stage 1: each rank holds the optimizer state of its slice of the parameters."""
    return ZeroRedundancyOptimizer(
        list(params), optimizer_class=optimizer_class, process_group=mesh.get_group(), **defaults
    )
