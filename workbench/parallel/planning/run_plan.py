"""The planner's plan for a run the workbench executes, to hold against what it measured.

``run_plan`` turns a run's settings (a ``Layout`` on ``world_size`` ranks, the global batch,
the sequence length, the optimizer and precision) into the planner's ``ParallelSpec`` and
``TrainingSpec`` and evaluates them for ``LOCAL_CPU`` (local gloo ranks). Given the model
module it also derives the ``Placement`` (``placement.module_placement``: the same TP plan,
split points and stage cuts ``parallelize`` applies), so model state and data-parallel bytes
are the tracer's to the byte for every layout: FSDP's padded shards, ZeRO-1's
whole-parameter partition, the modules a TP plan leaves whole, a pipeline stage's contents.
``strategy_plan`` does this for a built-in run (``RunSpec``: the demo's rows); ``wb.compare``
and the tests for the user's model (``model_spec.user_model_spec`` and the module).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from workbench.errors import ConfigError
from workbench.parallel.models import build_model, get_config, planner_model
from workbench.parallel.parallelize import Layout, layout_for
from workbench.parallel.placement import module_placement
from workbench.parallel.run_spec import RunSpec
from workbench.planner import (
    HardwareSpec,
    LinkSpec,
    ModelSpec,
    ParallelSpec,
    Plan,
    TrainingSpec,
    evaluate,
)
from workbench.vocab import planner_name

__all__ = ["LOCAL_CPU", "parallel_spec", "run_plan", "strategy_layout", "strategy_plan"]

# Local gloo ranks on CPU: what the demo's planner rows are evaluated for.
LOCAL_CPU = HardwareSpec(
    name="cpu",
    memory=24 * 2**30,
    peak_flops=5e10,
    intra=LinkSpec(bandwidth=1e9, latency=1e-4),
    inter=LinkSpec(bandwidth=1e9, latency=1e-4),
    gpus_per_node=2,
    kind="cpu",
)


def parallel_spec(
    layout: Layout,
    world_size: int,
    *,
    micro_batches: int = 1,
    schedule: str = "gpipe",
    vocab_parallel: bool = False,
) -> ParallelSpec:
    """The planner's ``ParallelSpec`` of ``layout`` on ``world_size`` ranks.

    ``vocab_parallel`` is False by default: the workbench's TP plans (and a user plan that
    names only the blocks) keep the embedding whole on every rank."""
    dims = layout.dims(world_size)
    return ParallelSpec(
        dp=dims.dp,
        tp=dims.tp,
        pp=dims.pp,
        cp=dims.cp,
        ep=dims.ep,
        zero=layout.zero if dims.dp > 1 else 0,
        micro_batches=micro_batches,
        schedule=planner_name("schedule", schedule),
        vocab_parallel=vocab_parallel,
    )


def run_plan(
    model: ModelSpec,
    *,
    layout: Layout,
    world_size: int,
    batch_size: int,
    seq: int,
    optimizer: str,
    precision: str = "fp32",
    grad_accum: int = 1,
    microbatches: int = 2,
    schedule: str = "gpipe",
    dropout: bool = False,
    hardware: HardwareSpec = LOCAL_CPU,
    module: nn.Module | None = None,
    megatron: bool = False,
    **training: Any,
) -> Plan:
    """The plan of one run: ``batch_size`` is the global batch (all dp ranks), split in
    ``grad_accum`` micro-batches per rank (``microbatches`` under a pipeline). With the
    model's ``module`` (meta device is enough) model state comes from its placement under
    ``layout`` (``megatron``: the Megatron teaching view's split)."""
    dims = layout.dims(world_size)
    m = microbatches if dims.pp > 1 else grad_accum
    per_rank = batch_size // dims.dp
    if batch_size % dims.dp or per_rank % m:
        raise ConfigError(
            f"batch_size={batch_size} does not split into {dims.dp} ranks x {m} "
            "micro-batches; choose a multiple of their product"
        )
    spec = TrainingSpec(
        micro_batch=per_rank // m,
        seq=seq,
        precision=precision,
        optimizer=optimizer,
        dropout=dropout,
        **training,
    )
    placement = (
        module_placement(module, layout, world_size, megatron=megatron)
        if module is not None
        else None
    )
    layout_spec = parallel_spec(
        layout,
        world_size,
        micro_batches=m,
        schedule=schedule,
        vocab_parallel=placement is not None and placement.vocab_tp > 1,
    )
    return evaluate(model, spec, layout_spec, hardware, placement=placement)


def strategy_layout(spec: RunSpec, world_size: int) -> Layout:
    """The layout a built-in run applies (the Megatron view: tp over every rank)."""
    return layout_for(spec.strategy, world_size, overlap=spec.overlap)


def strategy_plan(spec: RunSpec, world_size: int) -> Plan:
    """The plan of a built-in run on ``world_size`` ranks: the preset model's placement
    under the strategy's layout, its batch, sequence, optimizer and precision."""
    config = get_config(spec.model, seed=spec.seed)
    single = spec.strategy == "single"
    return run_plan(
        planner_model(spec.model),
        layout=strategy_layout(spec, world_size),
        world_size=1 if single else world_size,
        batch_size=spec.batch_size,
        seq=getattr(config, "seq_len", 1),
        optimizer=planner_name("optimizer", spec.optimizer),
        precision=planner_name("precision", spec.precision),
        grad_accum=spec.grad_accum,
        microbatches=spec.microbatches,
        schedule=spec.schedule,
        module=build_model(config),
        megatron=spec.strategy == "megatron",
        recompute="full" if spec.checkpointing else "none",  # a block keeps only its input
    )
