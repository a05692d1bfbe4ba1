"""The planner: per-GPU memory, OOM, step time, scaling and a layout recommendation.

Pure arithmetic on the standard library, so it runs anywhere (scripts, engines, the CLI)
and tens of thousands of configurations evaluate per second.

    >>> from workbench.planner import plan
    >>> p = plan("llama2-7b", "a100-80gb", gpus=8, zero=3, recompute="selective")
    >>> p.fits, p.memory.model_state / 8  # doctest: +SKIP
"""

from workbench.planner.calibrate import LinkFit, fit_alpha_beta, hardware_from_fit
from workbench.planner.comm import (
    all_gather_time,
    all_reduce_time,
    group_link,
    p2p_time,
    reduce_scatter_time,
)
from workbench.planner.cpu_calibration import cpu_profile
from workbench.planner.fault_cost import (
    FaultCost,
    best_checkpoint_every,
    fault_cost,
    young_daly_interval_s,
)
from workbench.planner.flops import (
    executed_flops_per_token,
    model_flops_per_token,
    training_flops,
)
from workbench.planner.measured import Comparison, ValidationReport, validate
from workbench.planner.memory import (
    MemoryBreakdown,
    StateBytes,
    layer_activation_bytes,
    memory_breakdown,
    model_state_bytes,
    state_bytes_per_param,
)
from workbench.planner.params import (
    ParamCount,
    count_params,
    matmul_params,
    params_per_rank,
    stage_params,
)
from workbench.planner.placement import Piece, Placement, dimension_placement
from workbench.planner.plan import Plan, check_layout, evaluate, plan, resolve_batch
from workbench.planner.presets import (
    GPUS,
    LINKS,
    MODELS,
    hardware_preset,
    link_preset,
    model_preset,
)
from workbench.planner.recommend import Recommendation, min_gpus, recommend
from workbench.planner.report import format_plan, format_plans
from workbench.planner.specs import (
    OPTIMIZERS,
    PRECISIONS,
    RECOMPUTE,
    HardwareSpec,
    LinkSpec,
    ModelSpec,
    ParallelSpec,
    TrainingSpec,
)
from workbench.planner.sweep import ScalingPoint, layouts, scaling, sweep
from workbench.planner.timing import StepTime, step_time

__all__ = [
    "GPUS",
    "LINKS",
    "MODELS",
    "OPTIMIZERS",
    "PRECISIONS",
    "RECOMPUTE",
    "Comparison",
    "FaultCost",
    "HardwareSpec",
    "LinkFit",
    "LinkSpec",
    "MemoryBreakdown",
    "ModelSpec",
    "ParallelSpec",
    "ParamCount",
    "Piece",
    "Placement",
    "Plan",
    "Recommendation",
    "ScalingPoint",
    "StateBytes",
    "StepTime",
    "TrainingSpec",
    "ValidationReport",
    "all_gather_time",
    "all_reduce_time",
    "best_checkpoint_every",
    "check_layout",
    "count_params",
    "cpu_profile",
    "dimension_placement",
    "evaluate",
    "executed_flops_per_token",
    "fault_cost",
    "fit_alpha_beta",
    "format_plan",
    "format_plans",
    "group_link",
    "hardware_from_fit",
    "hardware_preset",
    "layer_activation_bytes",
    "layouts",
    "link_preset",
    "matmul_params",
    "memory_breakdown",
    "min_gpus",
    "model_flops_per_token",
    "model_preset",
    "model_state_bytes",
    "p2p_time",
    "params_per_rank",
    "plan",
    "recommend",
    "reduce_scatter_time",
    "resolve_batch",
    "scaling",
    "stage_params",
    "state_bytes_per_param",
    "step_time",
    "sweep",
    "training_flops",
    "validate",
    "young_daly_interval_s",
]
