"""``RunSpec``: everything that defines one training run, validated when it is made."""

from __future__ import annotations

from dataclasses import dataclass, fields

from workbench import validate
from workbench.errors import ConfigError
from workbench.parallel.dims import ParallelDims, check_batch_split
from workbench.parallel.models import PRESETS
from workbench.parallel.options import PRECISIONS
from workbench.parallel.parallelize import STRATEGY_LAYOUTS, layout_for
from workbench.parallel.pp_schedules import SCHEDULES, check_schedule
from workbench.parallel.seeding import DEFAULT_SEED, MAX_SEED
from workbench.vocab import RUN_OPTIMIZERS

__all__ = [
    "DEFAULT_LR",
    "MAX_BATCH_SIZE",
    "MAX_SEED",
    "OPTIMIZERS",
    "RUN_OPTIONS",
    "STRATEGIES",
    "RunSpec",
]

# single: one device, no communication.  dp: DDP.  zero1: DDP + ZeroRedundancyOptimizer.
# zero2 / fsdp: fully_shard without / with resharding after forward (ZeRO-2 / ZeRO-3).
# tp: DTensor tensor parallel.  megatron: hand-written f/g tensor parallel (MLP blocks).
# pp: pipeline.  dp_tp: 2-D mesh, TP over pairs of ranks, FSDP over the rest.
# The names and what each means are one table, parallelize.STRATEGY_LAYOUTS.
STRATEGIES: tuple[str, ...] = tuple(STRATEGY_LAYOUTS)
OPTIMIZERS = RUN_OPTIMIZERS  # "sgd" has momentum 0.9; see workbench.vocab
DEFAULT_LR: dict[str, float] = {"sgd": 1e-2, "adamw": 1e-3}


# A bound that keeps a typo from reaching the engines: the data set holds 32 global batches
# (build.py), so a huge batch would exhaust every rank's memory before the first step. The
# seed seeds numpy too (``seeding``): below 2**32.
MAX_BATCH_SIZE = 65536


@dataclass(kw_only=True, frozen=True)
class RunSpec:
    """One run. ``batch_size`` is the *global* batch: samples per optimizer step, all ranks.

    ``overlap`` applies to ``dp``: True is DDP as shipped (bucket all-reduce during
    backward), False defers the all-reduce to the sync phase. ``microbatches`` and
    ``schedule`` apply to ``pp``; ``grad_accum`` splits each rank's batch into that many
    forward/backward passes before one optimizer step (``pp`` uses ``microbatches``).
    ``lr=None`` takes the optimizer's default (``DEFAULT_LR``: AdamW 1e-3, SGD 1e-2 with
    momentum 0.9).
    """

    model: str = "gpt-tiny"
    strategy: str = "dp"
    batch_size: int = 8
    optimizer: str = "adamw"
    lr: float | None = None
    overlap: bool = False
    checkpointing: bool = False
    precision: str = "fp32"
    microbatches: int = 2
    schedule: str = "gpipe"
    stages_per_rank: int | None = None  # None: the schedule's own (pp_schedules)
    grad_accum: int = 1
    seed: int = DEFAULT_SEED
    trace: bool = True
    per_module: bool = False

    def __post_init__(self) -> None:
        validate.choice("model", self.model, PRESETS)
        validate.choice("strategy", self.strategy, STRATEGIES)
        validate.choice("optimizer", self.optimizer, OPTIMIZERS)
        validate.choice("precision", self.precision, PRECISIONS)
        validate.choice("schedule", self.schedule, SCHEDULES)
        check_schedule(self.schedule, self.stages_per_rank, self.microbatches, 1)
        validate.integer(
            "batch_size", self.batch_size, minimum=1, maximum=MAX_BATCH_SIZE, what="a batch size"
        )
        # Upper bounds of these follow from batch_size (check_batch lists the divisors).
        validate.integer("microbatches", self.microbatches, minimum=1)
        validate.integer("grad_accum", self.grad_accum, minimum=1)
        validate.integer("seed", self.seed, minimum=0, maximum=MAX_SEED)
        validate.number(
            "lr",
            self.lr,
            minimum=0,
            open_minimum=True,
            none_means=f"the optimizer's default, {DEFAULT_LR[self.optimizer]}",
            what="a learning rate",
        )
        for name in ("overlap", "checkpointing", "trace", "per_module"):
            validate.boolean(name, getattr(self, name))
        if self.strategy == "pp" and self.grad_accum != 1:
            raise ConfigError(
                f"grad_accum={self.grad_accum} is not valid with strategy='pp': a pipeline "
                "already accumulates over its micro-batches; set microbatches instead"
            )

    @property
    def learning_rate(self) -> float:
        """``lr``, or the optimizer's default when ``lr`` is None."""
        return float(self.lr) if self.lr is not None else DEFAULT_LR[self.optimizer]

    def dims(self, world_size: int) -> ParallelDims:
        """The parallel layout this strategy uses on ``world_size`` ranks (``layout_for``;
        ``single`` is one device whatever the world size)."""
        layout = layout_for(self.strategy, world_size, overlap=self.overlap)
        return layout.dims(1 if self.strategy == "single" else world_size)

    def check_batch(self, dims: ParallelDims) -> None:
        """The global batch must split evenly over dp ranks, accumulation and micro-batches."""
        check_batch_split(self.batch_size, self.grad_accum, self.microbatches, dims)
        if dims.pp > 1:  # the schedule's needs, the model's depth included
            layers = PRESETS[self.model].n_layers
            check_schedule(self.schedule, self.stages_per_rank, self.microbatches, dims.pp, layers)


# The keyword names a run takes (Stepper's and rebuild's options, checked by name first).
RUN_OPTIONS: tuple[str, ...] = tuple(f.name for f in fields(RunSpec))
