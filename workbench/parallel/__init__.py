"""Parallelism for the workbench: one model, run single-device or DP, ZeRO/FSDP, TP, PP.

Each strategy has one file with one ``apply_x(model, mesh, ...)`` entry point built on
PyTorch's own APIs (DDP, ``ZeroRedundancyOptimizer``, FSDP2 ``fully_shard``, DTensor
``parallelize_module``, ``torch.distributed.pipelining``); ``megatron.py`` writes tensor
parallelism out by hand as a teaching view. ``TrainStep`` runs a training step phase by
phase; ``build_train_step`` makes one from a ``RunSpec``. Imports only torch, numpy and the
standard library.
"""

from workbench.parallel.build import (
    build_train_step,
    full_state_dict,
    reference_losses_and_params,
)
from workbench.parallel.data import make_dataset, make_loader, rank_indices
from workbench.parallel.dims import ParallelDims
from workbench.parallel.dp import DeferredSyncDDP, apply_dp
from workbench.parallel.fsdp import apply_fsdp, zero_optimizer
from workbench.parallel.megatron import ColumnParallelLinear, RowParallelLinear, apply_megatron
from workbench.parallel.models import (
    GPT,
    MLP,
    PRESETS,
    GPTConfig,
    MLPConfig,
    build_model,
    get_config,
)
from workbench.parallel.options import apply_checkpointing, check_precision
from workbench.parallel.pp import PipelineModule, apply_pp
from workbench.parallel.run_spec import OPTIMIZERS, STRATEGIES, RunSpec
from workbench.parallel.step import PHASES, TrainStep
from workbench.parallel.tp import GPT_TP_PLAN, MLP_TP_PLAN, apply_tp

__all__ = [
    "GPT",
    "GPT_TP_PLAN",
    "MLP",
    "MLP_TP_PLAN",
    "OPTIMIZERS",
    "PHASES",
    "PRESETS",
    "STRATEGIES",
    "ColumnParallelLinear",
    "DeferredSyncDDP",
    "GPTConfig",
    "MLPConfig",
    "ParallelDims",
    "PipelineModule",
    "RowParallelLinear",
    "RunSpec",
    "TrainStep",
    "apply_checkpointing",
    "apply_dp",
    "apply_fsdp",
    "apply_megatron",
    "apply_pp",
    "apply_tp",
    "build_model",
    "build_train_step",
    "check_precision",
    "full_state_dict",
    "get_config",
    "make_dataset",
    "make_loader",
    "rank_indices",
    "reference_losses_and_params",
    "zero_optimizer",
]
