"""The planner's plan for a run the workbench executes, to hold against what it measured.

``run_plan`` turns a run's settings (a ``Layout`` on ``world_size`` ranks, the global batch,
the sequence length, the optimizer and precision) into the planner's ``ParallelSpec`` and
``TrainingSpec`` and evaluates them for ``LOCAL_CPU`` (local gloo ranks). The demo does
this for the built-in models (``planner_model(name)``); ``wb.compare`` and the tests for
the user's model (``model_spec.user_model_spec``). Model state and data-parallel bytes are
arithmetic on the parameter count, so for DDP, ZeRO-1 and FSDP they match the tracer's
storage and collective counts to the byte when every parameter's first dimension divides
by the dp degree (FSDP pads each parameter's shard to equal size; ZeRO-1 places whole
parameters, so its optimizer share is the planner's only for an even split).
"""

from __future__ import annotations

from typing import Any

from workbench.errors import ConfigError
from workbench.parallel.parallelize import Layout
from workbench.planner import (
    HardwareSpec,
    LinkSpec,
    ModelSpec,
    ParallelSpec,
    Plan,
    TrainingSpec,
    evaluate,
)

__all__ = ["LOCAL_CPU", "parallel_spec", "run_plan"]

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
        zero=layout.zero if dims.dp > 1 else 0,
        micro_batches=micro_batches,
        schedule=schedule,
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
    **training: Any,
) -> Plan:
    """The plan of one run: ``batch_size`` is the global batch (all dp ranks), split in
    ``grad_accum`` micro-batches per rank (``microbatches`` under a pipeline)."""
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
    layout_spec = parallel_spec(layout, world_size, micro_batches=m, schedule=schedule)
    return evaluate(model, spec, layout_spec, hardware)
