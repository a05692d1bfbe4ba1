"""Tensor parallelism with DTensor: ``parallelize_module`` driven by plans that are data.

A plan maps module paths (``*`` matches one path element) to a parallel style. The GPT plan
is Megatron's: q/k/v and fc1 split column-wise (each rank gets whole heads / a slice of the
hidden features), wo and fc2 row-wise (partial sums all-reduced into a replicated output).
Embeddings, LayerNorms and the tied head stay replicated. ``megatron.py`` writes the same
split by hand to show where the two all-reduces per block sit.
"""

from __future__ import annotations

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    RowwiseParallel,
    parallelize_module,
)

from workbench.errors import ParallelError

__all__ = ["GPT_TP_PLAN", "MLP_TP_PLAN", "apply_tp", "plan_for"]

MLP_TP_PLAN: dict[str, ParallelStyle] = {
    "layers.*.mlp.fc1": ColwiseParallel(),
    "layers.*.mlp.fc2": RowwiseParallel(),
}

GPT_TP_PLAN: dict[str, ParallelStyle] = {
    # One replicated DTensor input shared by q, k and v: their input gradients add up as
    # partial sums and are all-reduced once (Megatron's f), not once per projection.
    "layers.*.attn": PrepareModuleInput(
        input_layouts=(Replicate(),), desired_input_layouts=(Replicate(),), use_local_output=False
    ),
    "layers.*.attn.wq": ColwiseParallel(),
    "layers.*.attn.wk": ColwiseParallel(),
    "layers.*.attn.wv": ColwiseParallel(),
    "layers.*.attn.wo": RowwiseParallel(),
    "layers.*.mlp.fc1": ColwiseParallel(),
    "layers.*.mlp.fc2": RowwiseParallel(),
}

_PLANS: dict[str, dict[str, ParallelStyle]] = {"MLP": MLP_TP_PLAN, "GPT": GPT_TP_PLAN}


def plan_for(model: nn.Module) -> dict[str, ParallelStyle]:
    """The built-in plan for a workbench model."""
    name = type(model).__name__
    if name not in _PLANS:
        raise ParallelError(
            f"no tensor-parallel plan for model type {name!r}; built-in plans: "
            f"{sorted(_PLANS)} (or pass plan={{'path.to.linear': ColwiseParallel(), ...}})"
        )
    return _PLANS[name]


def apply_tp(
    model: nn.Module, mesh: DeviceMesh, *, plan: dict[str, ParallelStyle] | None = None
) -> nn.Module:
    """Shard ``model``'s linears over the 1-D tensor-parallel ``mesh`` according to ``plan``."""
    return parallelize_module(model, mesh, plan if plan is not None else plan_for(model))
