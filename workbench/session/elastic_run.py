"""A training run at a new world size: after a shrink (ranks lost) or a grow (ranks added).

The **global batch is kept**: it is what the optimizer sees, so the loss curve stays the
uninterrupted run's. Fewer data-parallel ranks each take a bigger share, cut into more
gradient-accumulation micro-batches so a micro-batch is no bigger than before (memory);
more ranks the reverse. The data position is a count of global batches, so the next step
takes the next ``batch_size`` samples of the same shuffled order whatever the world size:
nothing is skipped or repeated (``TrainStep.sample_ids`` records which were taken). Only a
global batch that the new data-parallel size does not divide changes, to the nearest one
that it does, and the report says so (the curve then differs from the uninterrupted one).

Tensor- and pipeline-parallel groups cannot lose a member: a layout shrinks only along
data parallelism, by whole groups (``usable_after_loss``).

The layout arithmetic only: ``TrainingSession`` (``training.py``) owns the run and does
the shrink, the grow and the roll-back with these answers.
"""

from __future__ import annotations

from dataclasses import replace

from workbench.errors import ConfigError
from workbench.parallel.run_spec import RunSpec

__all__ = ["check_resizable", "resized_spec", "usable_after_loss"]

# Strategies whose one model-parallel group spans every rank: no rank can be lost.
_ALL_IN_ONE_GROUP = {"tp": "tensor", "megatron": "tensor", "pp": "pipeline"}


# Layouts that only split the batch: on one rank left they are the single-device run.
_DATA_PARALLEL = ("dp", "zero1", "zero2", "fsdp")


def _dp(spec: RunSpec, world: int) -> int:
    return 1 if spec.strategy == "single" or world == 1 else spec.dims(world).dp


def usable_after_loss(spec: RunSpec, world: int, dead: list[int]) -> list[int]:
    """Survivors the layout cannot use (a TP pair's partner of a lost rank): they leave too.
    Raises ``ConfigError`` naming a layout that would fit when no complete group is left."""
    left = world - len(dead)
    if not dead or spec.strategy == "single" or spec.strategy in _DATA_PARALLEL:
        return []
    if spec.strategy in _ALL_IN_ONE_GROUP:
        kind = _ALL_IN_ONE_GROUP[spec.strategy]
        raise ConfigError(
            f"strategy={spec.strategy!r} puts all {world} ranks in one {kind}-parallel group, "
            f"so losing ranks {sorted(dead)} leaves no complete group to go on with; layouts "
            "that can shrink: strategy='dp_tp' (loses whole tp=2 pairs) or a data-parallel "
            f"one ('dp', 'zero1', 'zero2', 'fsdp'); or start strategy={spec.strategy!r} "
            f"again on the {left} ranks left"
        )
    # dp_tp: tp=2 pairs of consecutive ranks (the mesh's innermost dimension)
    pairs = [(r - r % 2, r - r % 2 + 1) for r in sorted(dead)]
    orphans = sorted({p for pair in pairs for p in pair} - set(dead))
    if left - len(orphans) < 2:
        raise ConfigError(
            f"strategy='dp_tp' on {world} ranks keeps tensor-parallel pairs (0,1), (2,3), ...; "
            f"losing ranks {sorted(dead)} leaves no complete pair; a layout that fits the "
            f"{left} rank(s) left: strategy='single'"
            + (f" or a data-parallel one ('dp', 'fsdp') on {left} ranks" if left >= 2 else "")
        )
    return orphans


def _accum_for(per_rank: int, micro: int) -> int:
    """The fewest micro-batches that split ``per_rank`` evenly, none bigger than ``micro``."""
    return next(k for k in range(1, per_rank + 1) if per_rank % k == 0 and per_rank // k <= micro)


def resized_spec(spec: RunSpec, old_world: int, new_world: int) -> tuple[RunSpec, str]:
    """``spec`` for ``new_world`` ranks with the global batch kept when the new
    data-parallel size divides it (else the nearest batch it divides), and what changed."""
    old_dp, new_dp = _dp(spec, old_world), _dp(spec, new_world)
    micro = max(spec.batch_size // old_dp // max(spec.grad_accum, 1), 1)
    batch = spec.batch_size
    note = f"global batch {batch} kept"
    if batch % new_dp:
        lower, upper = batch - batch % new_dp, batch - batch % new_dp + new_dp
        batch = upper if lower == 0 or upper - batch <= batch - lower else lower
        note = (
            f"global batch {spec.batch_size} does not split over {new_dp} data-parallel "
            f"ranks: changed to the nearest that does, {batch} (the loss curve and the data "
            "order now differ from the uninterrupted run's)"
        )
    accum = 1 if spec.strategy == "pp" else _accum_for(batch // new_dp, micro)
    new = replace(spec, batch_size=batch, grad_accum=accum)
    note = f"{note}, gradient accumulation {spec.grad_accum} -> {accum}"
    if new_world == 1 and spec.strategy in _DATA_PARALLEL:
        # a data-parallel layout needs 2 ranks; alone, the rank trains the whole model
        # itself, which is the run the data-parallel one is checked against
        new = replace(new, strategy="single")
        note += f"; on the 1 rank left, strategy {spec.strategy!r} -> 'single'"
    return new, note


def check_resizable(spec: object, what: str) -> None:
    """Only a built-in model's run (``RunSpec``) changes its layout with the world size."""
    if not isinstance(spec, RunSpec):
        raise ConfigError(
            f"{what} resizes runs of the built-in models (RunSpec); a run of your own model "
            "keeps its world size: recover it with session.recover(shrink=False) / "
            "`%wb restart`, which replaces the lost engines"
        )
