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
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from workbench.config import MAX_ENGINES
from workbench.errors import ConfigError
from workbench.parallel.run_spec import RunSpec

if TYPE_CHECKING:
    from workbench.session.training import TrainingSession

__all__ = [
    "grow_and_roll_back",
    "resize_and_roll_back",
    "resized_spec",
    "shrink_and_roll_back",
    "usable_after_loss",
]

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


def resize_and_roll_back(session: TrainingSession, spec: RunSpec, why: str) -> str:
    """Rebuild the run on the cluster's current ranks under ``spec`` and load the last
    checkpoint into it (DCP reshards it to the new layout); says what was done."""
    from workbench.session.roll_back import roll_back

    world = session.cluster.world_size
    state = session._state
    # the old ranks' statuses and cursors go with the old world; roll_back reads the step
    # reached from the survivors' before it rebuilds
    state.status = {r: s for r, s in state.status.items() if r < world}
    state.cursors = {}
    state.spec = spec
    session._reference = []
    return f"{why}; {roll_back(session)}"


def _check_resizable(session: TrainingSession, what: str) -> None:
    if not isinstance(session.spec, RunSpec):
        raise ConfigError(
            f"{what} resizes runs of the built-in models (RunSpec); a run of your own model "
            "keeps its world size: recover it with session.recover(shrink=False) / "
            "`%wb restart`, which replaces the lost engines"
        )


def shrink_and_roll_back(session: TrainingSession) -> str:
    """Drop the lost ranks (and survivors the layout cannot use), re-form the group at the
    smaller world size, rebuild the run there and load the last checkpoint."""
    _check_resizable(session, "a shrink")
    cluster = session.cluster
    world, spec = cluster.world_size, session.spec
    dead = cluster.lost_ranks()
    orphans = usable_after_loss(spec, world, dead)  # before anything is changed
    new_spec, note = resized_spec(spec, world, world - len(dead) - len(orphans))
    if session._elastic_base is None:  # what a grow back to this size restores
        session._elastic_base = (spec, world)
    report = cluster.recover_sync(shrink=True, drop=tuple(orphans))
    why = f"shrunk from {world} to {cluster.world_size} ranks ({report}); {note}"
    return resize_and_roll_back(session, new_spec, why)


def session_grow(session: TrainingSession, n: int = 1, *, hosts: object = None) -> str:
    """Add ``n`` ranks (on ``hosts`` when given) at a checkpoint boundary (saved now unless
    the last one is at this step) and continue at the bigger world size with the same
    global batch: the inverse of a shrink. Returns (and keeps in ``last_recovery``) what
    was done."""
    session.last_recovery = grow_and_roll_back(session, n, hosts)
    return session.last_recovery


def grow_and_roll_back(session: TrainingSession, n: int, hosts: object = None) -> str:
    """At a step boundary: checkpoint, add ``n`` ranks, rebuild the run at the bigger
    world size and load that checkpoint into it (the inverse of a shrink)."""
    from workbench import validate
    from workbench.cluster.hosts.host_placement import check_hosts

    validate.integer("n", n, minimum=1, maximum=MAX_ENGINES, what="a number of ranks to add")
    if hosts is not None:  # before the checkpoint below: a bad value changes nothing
        hosts = check_hosts("hosts", hosts, session.cluster.config.launcher)
    _check_resizable(session, "grow()")
    cluster = session.cluster
    if session.checkpoint_dir is None:
        raise ConfigError(
            "grow() adds ranks at a checkpoint boundary and this session has no "
            "checkpoint_dir; make it with TrainingSession(..., checkpoint_dir=...)"
        )
    world, spec = cluster.world_size, session.spec
    if session.built and session.next_phase != (session.phases or ["data"])[0]:
        raise ConfigError(
            f"grow() waits for a step boundary; the run is part-way through step "
            f"{session.step_index} (next phase {session.next_phase!r}): finish it with step()"
        )
    saved = [m["step"] for m in session.checkpoints()]
    if session.built and (not saved or saved[-1] != session.step_index):
        session.save()  # the checkpoint boundary the new ranks start from
    report = cluster.grow_sync(n, hosts=hosts)
    base = session._elastic_base
    if base is not None and base[1] == cluster.world_size:
        new_spec, note = base[0], "back to the spec the run started with"
        session._elastic_base = None
    else:
        new_spec, note = resized_spec(spec, world, cluster.world_size)
    why = f"grown from {world} to {cluster.world_size} ranks ({report}); {note}"
    return resize_and_roll_back(session, new_spec, why)
