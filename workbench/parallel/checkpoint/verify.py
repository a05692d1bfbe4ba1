"""What a load reads, checked before it changes anything: signature, sums, meta, RNG files.

Each rank checks its share of the files against the signed manifest (the shards split
among the ranks, so each is hashed once in all), then parses and checks ``meta.json``
and its own RNG files. Only what passes reaches ``checkpoint.load_checkpoint``, which
reads the shards into copies; a failure here leaves the run untouched.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workbench.errors import CheckpointError
from workbench.parallel.checkpoint.layout import (
    PREFIX,
    choose_checkpoint,
    committed_checkpoints,
    rng_name,
)
from workbench.parallel.checkpoint.meta import RngState, parse_meta, parse_rng
from workbench.parallel.checkpoint.steps import rank_of, world_of
from workbench.parallel.checkpoint.trust import (
    checkpoint_key,
    read_manifest,
    read_verified,
    verify_files,
)
from workbench.parallel.step import TrainStep

__all__ = ["Verified", "verify"]


@dataclass(frozen=True, slots=True)
class Verified:
    """Everything a load needs from the checkpoint, read and checked before any change."""

    path: Path
    digests: dict[str, str]
    meta: dict[str, Any]
    rng: RngState | None


def verify(train_step: TrainStep, root: Path, step: int | None, key: bytes | None) -> Verified:
    """Rank-local: the checkpoint is signed, this rank's share of the files is intact,
    ``meta.json`` and this rank's RNG files are valid and match the run."""
    rank, world = rank_of(train_step), world_of(train_step)
    key = checkpoint_key() if key is None else key
    path = choose_checkpoint(root, step) if step is not None else newest_signed(root, key)
    where = repr(str(path))
    digests = read_manifest(path, key)
    # The shards are checked once in all, split among the ranks (agree() then tells every
    # rank); the small files each rank parses itself are read once and checked here.
    names = sorted(digests)
    verify_files(path, digests, [n for n in names[rank::world] if not n.startswith("rng/")])
    verify_files(path, digests, [".metadata"])
    meta = parse_meta(read_verified(path, digests, "meta.json"), where)
    if meta["step"] != int(path.name[len(PREFIX) :]):
        raise CheckpointError(
            f"meta.json of the checkpoint at {where} says step {meta['step']}, its directory "
            f"name says {path.name}; it was moved or edited"
        )
    _check_fits_run(train_step, meta, where)
    rng = None
    if rank < meta["world_size"]:  # a rank new to a bigger world keeps its own RNG
        name = rng_name(rank)
        rng = parse_rng(
            read_verified(path, digests, f"{name}.pt"),
            read_verified(path, digests, f"{name}.json"),
            name,
            where,
        )
    return Verified(path=path, digests=digests, meta=meta, rng=rng)


def _signed_step(path: Path, key: bytes) -> None:
    """What every rank can check of a checkpoint alike (the same files): its manifest is
    signed with ``key`` and its ``meta.json`` is the one it vouches for, of this step."""
    digests = read_manifest(path, key)
    meta = parse_meta(read_verified(path, digests, "meta.json"), repr(str(path)))
    if meta["step"] != int(path.name[len(PREFIX) :]):
        raise CheckpointError(f"its meta.json says step {meta['step']}")


def newest_signed(root: Path, key: bytes) -> Path:
    """The newest checkpoint under ``root`` that is signed with ``key`` (a load without a
    step: what rollback uses). Newer ones that are not (a folder someone else put there,
    one changed after the save) are skipped with a warning naming each and why, so one
    stray ``step-N`` does not stop every rollback."""
    skipped: list[str] = []
    for _, path in sorted(committed_checkpoints(root).items(), reverse=True):
        try:
            _signed_step(path, key)
        except CheckpointError as exc:
            skipped.append(f"{path.name} ({exc})")
            continue
        if skipped:
            warnings.warn(
                f"loading {path.name}; newer checkpoints under {str(root)!r} were skipped: "
                + "; ".join(skipped),
                stacklevel=3,
            )
        return path
    if skipped:
        raise CheckpointError(
            f"no checkpoint under {str(root)!r} is signed with your checkpoint key: "
            + "; ".join(skipped)
        )
    return choose_checkpoint(root, None)  # none at all: its error says so


def _check_fits_run(train_step: TrainStep, meta: dict[str, Any], where: str) -> None:
    """The checkpoint is of this run's model preset, and the run can restore its data
    position (the parameters of the user's own model are compared later, on load)."""
    spec = train_step.spec
    named = spec is not None and isinstance(spec.model, str)
    if named and meta.get("model") not in (None, spec.model):
        raise CheckpointError(
            f"the checkpoint at {where} is of model {meta['model']!r}, this run is "
            f"{spec.model!r}; load it into a run of the same model"
        )
    if train_step.loader is None:
        raise CheckpointError(
            "this TrainStep was made without its loader (loader=None), so its data "
            "position cannot be restored; build it with build_train_step or pass loader="
        )
