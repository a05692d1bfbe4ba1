"""Parallelism by dimension: one ``Layout`` (dp + ZeRO stage, tp + plan, pp + split points)
applied to any model one dimension at a time, as torchtitan's ``parallelize_*`` does.

``parallelize`` reads the sizes from ``ParallelDims`` (one ``DeviceMesh``) and runs
``if dims.pp > 1: apply_pp``, ``if dims.tp > 1: apply_tp``, ``if dims.dp > 1: apply_dp or
apply_fsdp`` — no code branch per named combination. The strategy names are
shorthands for layouts, one table (``STRATEGY_LAYOUTS``, read by ``layout_for``): ``fsdp``
is ``Layout(zero=3)`` over all ranks, ``dp_tp`` is ``Layout(tp=2, zero=3)``, and so on.

ZeRO stages use the planner's vocabulary: 0 = DDP (every rank holds everything), 1 = DDP +
sharded optimizer state (``ZeroRedundancyOptimizer``), 2 = FSDP2 without resharding after
forward, 3 = FSDP2 with it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor.parallel import ParallelStyle

from workbench.errors import ConfigError, ParallelError, choices_error
from workbench.parallel.cp import ContextShard
from workbench.parallel.dims import ParallelDims
from workbench.parallel.dp import apply_dp
from workbench.parallel.ep import apply_ep
from workbench.parallel.fsdp import apply_fsdp
from workbench.parallel.pp import apply_pp, split_stage
from workbench.parallel.pp_schedules import check_schedule, stage_indices
from workbench.parallel.pp_split import default_split_points, split_by_points, stage_units
from workbench.parallel.tp import apply_tp, plan_for
from workbench.parallel.tp_plan import hf_tp_plan, matching_modules, resolve_tp_plan
from workbench.vocab import RUN_ZERO_STAGES

__all__ = [
    "PRESET_LAYOUTS",
    "STRATEGY_LAYOUTS",
    "ZERO_STAGES",
    "Layout",
    "Parallelized",
    "fsdp_blocks",
    "layout_for",
    "parallelize",
]

ZERO_STAGES = RUN_ZERO_STAGES  # the planner's numbering; see workbench.vocab

TpPlan = Mapping[str, str | ParallelStyle]


@dataclass(kw_only=True, frozen=True)
class Layout:
    """Sizes of each dimension and how each is applied.

    ``dp=None`` takes what is left of the world size after ``tp * pp``. ``zero`` is the
    ZeRO stage of the data-parallel dimension (0..3, see the module docstring); ``overlap``
    applies to ``zero=0`` (DDP bucket all-reduce during backward, or deferred to the sync
    phase). ``tp_plan`` maps module paths to styles (default: the model's own plan, a
    built-in model's or a Hugging Face config's ``base_model_tp_plan``). ``pp_split`` names
    the modules where stages 1..pp-1 begin (default: the model's ``pp_split_points`` or its
    blocks cut evenly).
    """

    dp: int | None = None
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    zero: int = 0
    overlap: bool = True
    tp_plan: TpPlan | None = field(default=None, compare=False)
    pp_split: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        for name in ("tp", "pp", "cp", "ep"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ParallelError(f"{name}={value!r} is not valid; it must be an integer >= 1")
        dp = self.dp
        if dp is not None and (isinstance(dp, bool) or not isinstance(dp, int) or dp < 1):
            raise ParallelError(f"dp={dp!r} is not valid; it must be an integer >= 1 or None")
        if isinstance(self.zero, bool) or self.zero not in ZERO_STAGES:
            raise choices_error("zero", self.zero, ZERO_STAGES)
        if self.pp_split is not None:
            if isinstance(self.pp_split, str) or not all(isinstance(p, str) for p in self.pp_split):
                raise ParallelError(
                    f"pp_split={self.pp_split!r} is not valid; give a list of module names "
                    "(where stages 1..pp-1 begin), e.g. ['blocks.2']"
                )
            object.__setattr__(self, "pp_split", tuple(self.pp_split))

    def dims(self, world_size: int) -> ParallelDims:
        """The ``ParallelDims`` of this layout on ``world_size`` ranks (checked)."""
        inner = self.tp * self.pp * self.cp
        if self.dp is None and world_size % inner:
            valid = [d for d in range(1, world_size + 1) if world_size % d == 0]
            raise ParallelError(
                f"tp*pp = {self.tp}*{self.pp} = {inner} does not divide world_size="
                f"{world_size}; each degree must divide it (choices: {valid})"
            )
        dp = self.dp if self.dp is not None else world_size // inner
        dims = ParallelDims(
            dp=dp, tp=self.tp, pp=self.pp, cp=self.cp, ep=self.ep, world_size=world_size
        )
        if dims.cp > 1 and (dims.tp > 1 or dims.pp > 1 or self.zero != 0):
            raise ParallelError(
                f"cp={dims.cp} composes with dp (DDP, zero=0) here; tp={dims.tp}, "
                f"pp={dims.pp}, zero={self.zero} with cp are not built: use tp=1, pp=1, zero=0"
            )
        if dims.tp > 1 and dims.dp > 1 and self.zero < 2:
            raise ParallelError(
                f"dp={dims.dp} x tp={dims.tp} shards the data-parallel dimension with FSDP: "
                f"zero={self.zero} is not valid there; use zero=2 or zero=3"
            )
        return dims

    def describe(self, world_size: int) -> str:
        d = self.dims(world_size)
        parts = []
        if d.dp > 1:
            how = {0: "DDP", 1: "ZeRO-1", 2: "FSDP2 (ZeRO-2)", 3: "FSDP2 (ZeRO-3)"}[self.zero]
            parts.append(f"dp={d.dp} {how}")
        if d.tp > 1:
            parts.append(f"tp={d.tp}")
        if d.pp > 1:
            parts.append(f"pp={d.pp}")
        if d.cp > 1:
            parts.append(f"cp={d.cp}")
        if d.ep > 1:
            parts.append(f"ep={d.ep}")
        return " x ".join(parts) or "single device"


def layout_for(strategy: str, world_size: int, *, overlap: bool = True) -> Layout:
    """The layout a strategy name stands for on ``world_size`` ranks (``STRATEGY_LAYOUTS``)."""
    if strategy not in STRATEGY_LAYOUTS:
        raise choices_error("strategy", strategy, sorted(STRATEGY_LAYOUTS))
    w = world_size
    if strategy == "single":
        return Layout(dp=1)
    if w < 2:
        raise ParallelError(
            f"strategy={strategy!r} needs at least 2 ranks, got world_size={w}; "
            "use strategy='single' on one process"
        )
    if strategy in ("dp_tp", "dp_cp", "dp_ep") and w % 2:
        raise ParallelError(
            f"strategy={strategy!r} pairs ranks (tp=2 / cp=2 / ep=2) and needs an even "
            "world_size, "
            f"got {w}; "
            "valid world sizes: 2, 4, 6, ..."
        )
    return STRATEGY_LAYOUTS[strategy](w, overlap)


# What each strategy name means, the one table: strategy -> (world_size, overlap) -> Layout.
# RunSpec's names (spec.STRATEGIES) and dims, the layouts built and the plans all read it.
STRATEGY_LAYOUTS: dict[str, Callable[[int, bool], Layout]] = {
    "single": lambda w, o: Layout(dp=1),
    "dp": lambda w, o: Layout(dp=w, zero=0, overlap=o),
    "zero1": lambda w, o: Layout(dp=w, zero=1),
    "zero2": lambda w, o: Layout(dp=w, zero=2),
    "fsdp": lambda w, o: Layout(dp=w, zero=3),
    "tp": lambda w, o: Layout(dp=1, tp=w),
    # tp over every rank too, but applied by hand (megatron.py, build.py), not by DTensor
    "megatron": lambda w, o: Layout(dp=1, tp=w),
    "pp": lambda w, o: Layout(dp=1, pp=w),
    # the sequence split over every rank, attention around a ring (cp.py)
    "cp": lambda w, o: Layout(dp=1, cp=w, overlap=False),
    # the batch over every rank as dp, each rank holding 1/w of the experts (ep.py)
    "ep": lambda w, o: Layout(dp=w, ep=w, overlap=False),
    # dp x ep: experts over pairs of ranks, each pair's experts replicated over the others
    "dp_ep": lambda w, o: Layout(dp=w, ep=2, overlap=False),
    "dp_tp": lambda w, o: Layout(dp=w // 2, tp=2, zero=3),
    "dp_cp": lambda w, o: Layout(dp=w // 2, cp=2, overlap=False),
}
# The names ``parallelize`` applies to any model: all but megatron, whose hand-written layers
# exist for the built-in models only (so these are the presets a user's own model may take).
PRESET_LAYOUTS: dict[str, Callable[[int, bool], Layout]] = {
    name: make for name, make in STRATEGY_LAYOUTS.items() if name != "megatron"
}


def fsdp_blocks(model: nn.Module) -> list[nn.Module]:
    """The repeated blocks FSDP wraps one by one: the largest ModuleList/ModuleDict."""
    best: nn.Module | None = None
    for module in model.modules():
        if isinstance(module, nn.ModuleList | nn.ModuleDict) and (
            best is None or len(module) > len(best)  # type: ignore[arg-type]
        ):
            best = module
    if best is None:
        return []
    return list(best.values() if isinstance(best, nn.ModuleDict) else best)


def default_tp_plan(model: nn.Module) -> TpPlan:
    """A Hugging Face model's own plan (its config's ``base_model_tp_plan``), a ``tp_plan``
    dict on the model, or a built-in model's plan; else a clear error."""
    plan = hf_tp_plan(model)
    if plan:
        return plan
    own = getattr(model, "tp_plan", None)
    if isinstance(own, Mapping) and own:
        return own
    return plan_for(model)  # raises with the choices when there is none


def check_layout(
    model: nn.Module, layout: Layout, dims: ParallelDims, *, stages_per_rank: int = 1
) -> dict[str, Any]:
    """Everything about ``model`` that ``layout`` needs, checked before any split: the
    resolved TP plan and the pipeline split points (``pp * stages_per_rank`` stages)."""
    out: dict[str, Any] = {"tp_plan": None, "pp_split": None}
    if dims.tp > 1:
        plan = layout.tp_plan if layout.tp_plan is not None else default_tp_plan(model)
        out["tp_plan"] = resolve_tp_plan(model, plan, dims.tp)
    if dims.pp > 1:
        stages = dims.pp * stages_per_rank
        if layout.pp_split is None and isinstance(getattr(model, "layers", None), nn.ModuleDict):
            n = len(model.layers)  # type: ignore[arg-type]
            if n % stages:
                valid = [d for d in range(1, n + 1) if n % d == 0]
                raise ParallelError(
                    f"pp={dims.pp} x stages_per_rank={stages_per_rank} = {stages} stages do "
                    f"not divide n_layers={n}; the number of stages must be one of {valid}"
                )
            return out  # workbench models: split_stage (ends set to None, tied head synced)
        points = list(layout.pp_split or default_split_points(model, stages))
        stage_units(model, points, stages)
        out["pp_split"] = points
    return out


@dataclass(slots=True)
class Parallelized:
    """The wrapped model, the group the reported loss is reduced over, and how; then (a
    pipeline replicated over dp) the group it is averaged over."""

    model: nn.Module
    loss_group: dist.ProcessGroup | None
    loss_reduce: str
    loss_mean_group: dist.ProcessGroup | None = None


def parallelize(
    model: nn.Module,
    layout: Layout,
    dims: ParallelDims,
    *,
    loss_fn: Callable[[Any, Any], torch.Tensor],
    microbatches: int = 2,
    schedule: str = "gpipe",
    stages_per_rank: int | None = None,
    recorder: Any | None = None,
    param_dtype: torch.dtype | None = None,
    fsdp_units: Sequence[nn.Module] | None = None,
) -> Parallelized:
    """Apply ``layout`` to ``model`` on this rank, one dimension at a time."""
    if dims.world_size == 1:
        return Parallelized(model, None, "none")
    v = check_schedule(schedule, stages_per_rank, microbatches, dims.pp) if dims.pp > 1 else 1
    checked = check_layout(model, layout, dims, stages_per_rank=v)
    if dims.pp > 1:
        # This rank's stages first; then tp and dp apply to each as to a whole model.
        pp_mesh = dims.submesh("pp")
        index = dist.get_rank(pp_mesh.get_group())
        n_stages = dims.pp * v
        staged = []
        for i in stage_indices(schedule, index, dims.pp, v):
            if checked["pp_split"] is not None:
                stage = split_by_points(model, checked["pp_split"], i, n_stages)
            else:
                stage = split_stage(model, i, n_stages)
            plan = checked["tp_plan"]
            if plan is not None:  # the plan's patterns, narrowed to the modules it kept
                plan = {
                    n: style for pat, style in plan.items() for n in matching_modules(stage, pat)
                }
            staged.append(
                _apply_tp_dp(stage, layout, dims, plan, param_dtype, fsdp_units, ddp=False)
            )
        replicas = dims.submesh("dp").get_group() if dims.dp > 1 else None
        pipe = apply_pp(
            model,
            pp_mesh,
            loss_fn=loss_fn,
            microbatches=microbatches,
            schedule=schedule,
            stages_per_rank=v,
            recorder=recorder,
            stage_modules=staged,
            dp_group=replicas if layout.zero < 2 else None,  # FSDP reduces its own
        )
        return Parallelized(pipe, pp_mesh.get_group(), "sum", replicas)
    if dims.cp > 1:
        return _apply_cp(model, dims)
    if dims.ep > 1:  # experts over the dp ranks; shared gradients averaged by its sync()
        group = dims.submesh("dp").get_group()
        experts = model.config.n_experts  # type: ignore[union-attr]
        return Parallelized(apply_ep(model, dims, experts), group, "mean")
    model = _apply_tp_dp(model, layout, dims, checked["tp_plan"], param_dtype, fsdp_units)
    if dims.dp > 1:
        return Parallelized(model, dims.submesh("dp").get_group(), "mean")
    return Parallelized(model, None, "none")


def _apply_cp(model: nn.Module, dims: ParallelDims) -> Parallelized:
    """The sequence over the cp ranks (ring attention), the gradients averaged over every
    rank that holds other tokens: the cp ranks and, with dp, their replicas. DDP without
    overlap: its bucket all-reduces would share the group with the ring's sends."""
    use = getattr(model, "use_context_parallel", None)
    if not callable(use):
        raise ParallelError(
            f"cp={dims.cp} needs a model whose attention runs around a ring; "
            f"{type(model).__name__} has no use_context_parallel (the built-in GPT has)"
        )
    use(ContextShard.of(dims.submesh("cp").get_group()))
    mesh = dims.mesh if dims.mesh.ndim == 1 else dims.mesh["dp", "cp"]._flatten()
    wrapped = apply_dp(model, mesh, overlap=False)
    return Parallelized(wrapped, mesh.get_group(), "mean")


def _apply_tp_dp(
    model: nn.Module,
    layout: Layout,
    dims: ParallelDims,
    plan: Mapping[str, ParallelStyle] | None,
    param_dtype: torch.dtype | None,
    fsdp_units: Sequence[nn.Module] | None,
    *,
    ddp: bool = True,
) -> nn.Module:
    """The tensor- and data-parallel dimensions, in that order, on a model or a stage.
    ``ddp=False``: zero=0/1 leaves the model unwrapped (a pipeline stage averages its
    gradients itself, ``PipelineModule.sync_dp``)."""
    if dims.tp > 1:
        model = apply_tp(model, dims.submesh("tp"), plan=dict(plan) if plan is not None else None)
    if dims.dp > 1:
        dp_mesh = dims.submesh("dp")
        if layout.zero >= 2:
            units = fsdp_units if fsdp_units is not None else _default_units(model)
            model = apply_fsdp(
                model, dp_mesh, stage=layout.zero, param_dtype=param_dtype, blocks=units
            )
        elif ddp:  # ZeRO-1 is DDP here; its optimizer is sharded when it is made
            model = apply_dp(model, dp_mesh, overlap=layout.overlap or layout.zero == 1)
    return model


def _default_units(model: nn.Module) -> list[nn.Module]:
    layers = getattr(model, "layers", None)
    units = list(layers.values()) if isinstance(layers, nn.ModuleDict) else fsdp_blocks(model)
    # A pipeline stage keeps its own blocks; the others are parameterless stand-ins.
    return [u for u in units if any(True for _ in u.parameters())]


def check_zero_optimizer(optimizer: torch.optim.Optimizer) -> None:
    """ZeRO-1 rebuilds the optimizer from its class and defaults: one parameter group only."""
    if len(optimizer.param_groups) != 1:
        raise ConfigError(
            f"zero=1 shards the optimizer by rebuilding it from its class and defaults; "
            f"{type(optimizer).__name__} has {len(optimizer.param_groups)} parameter groups, "
            "and only one is supported; use zero=0, 2 or 3"
        )
