"""The options of a run of the user's own model, in one place.

``UserOptions`` is the single source of truth for them: the client's ``UserSpec``
(``session/user_training.py``) and the engine's ``UserRun`` (``parallel/user_model.py``)
both extend it, so each option is declared, defaulted and validated once, and what the
client ships (``options()``) is exactly what the engine runs with.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from workbench import validate
from workbench.errors import ConfigError
from workbench.parallel.dims import ParallelDims, check_batch_split
from workbench.parallel.options import PRECISIONS
from workbench.parallel.pp_schedules import check_schedule
from workbench.parallel.seeding import DEFAULT_SEED, MAX_SEED
from workbench.parallel.user_checkpointing import Checkpointing, check_checkpointing
from workbench.vocab import planner_name

__all__ = ["UserOptions", "int_at_least"]


def int_at_least(name: str, value: object, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ConfigError(f"{name}={value!r} is not valid; it must be an integer >= {low}")


@dataclass(kw_only=True, frozen=True)
class UserOptions:
    """``batch_size`` is the global batch (all dp ranks)."""

    batch_size: int = 8
    grad_accum: int = 1
    microbatches: int = 2
    schedule: str = "gpipe"
    stages_per_rank: int | None = None  # None: the schedule's own (pp_schedules)
    precision: str = "fp32"  # or "bf16" (the planner's name "bf16-mixed" is accepted too)
    # False, True (the repeated blocks FSDP wraps) or the blocks: name patterns / classes
    checkpointing: Checkpointing = False
    seed: int = DEFAULT_SEED
    trace: bool = True
    per_module: bool = False

    def __post_init__(self) -> None:
        int_at_least("batch_size", self.batch_size, 1)
        int_at_least("grad_accum", self.grad_accum, 1)
        int_at_least("microbatches", self.microbatches, 1)
        validate.integer("seed", self.seed, minimum=0, maximum=MAX_SEED)
        check_schedule(self.schedule, self.stages_per_rank, self.microbatches, 1)
        if self.precision == planner_name("precision", "bf16"):  # the same run, spelled so
            object.__setattr__(self, "precision", "bf16")
        if self.precision not in PRECISIONS:
            raise ConfigError(
                f"precision={self.precision!r} is not valid; choose from "
                f"{[*PRECISIONS, planner_name('precision', 'bf16')]}"
            )
        object.__setattr__(self, "checkpointing", check_checkpointing(self.checkpointing))

    def options(self) -> dict[str, Any]:
        """These options alone (what the client ships for the engines' ``UserRun``)."""
        return {f.name: getattr(self, f.name) for f in fields(UserOptions)}

    def pipeline_options(self) -> dict[str, Any]:
        """What ``parallelize`` takes for the pipeline dimension."""
        return {
            "microbatches": self.microbatches,
            "schedule": self.schedule,
            "stages_per_rank": self.stages_per_rank,
        }

    def check_batch(self, dims: ParallelDims) -> None:
        check_batch_split(self.batch_size, self.grad_accum, self.microbatches, dims)
        if dims.pp > 1 and self.grad_accum != 1:
            raise ConfigError("grad_accum must be 1 with pp > 1: set microbatches instead")
        if dims.pp > 1:
            check_schedule(self.schedule, self.stages_per_rank, self.microbatches, dims.pp)
