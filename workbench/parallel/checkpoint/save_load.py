"""Checkpoints of a ``TrainStep`` with torch.distributed.checkpoint (DCP).

A checkpoint is a directory ``<root>/step-00000003`` holding

- the DCP shards of ``{"model": ..., "optim": ...}`` as ``get_state_dict`` returns them:
  each rank writes the shards it owns (DDP: rank 0 writes the replicated tensors once;
  FSDP2 / DTensor: every rank its shard), so a load under another layout reshards;
- ``rng/rank-00001.pt``: each rank's torch RNG states (tensors only, loaded with
  ``weights_only=True``) and ``rng/rank-00001.json``: its Python ``random`` and numpy
  states (numpy's absent from checkpoints written before runs seeded it);
- ``meta.json``: step, data position, last loss, strategy, world size and the run's spec;
- ``manifest.json``: the SHA-256 sum of every other file, signed (HMAC) with a key kept
  outside the checkpoint (``checkpoint.trust``).

Saving is atomic: every rank writes into ``<root>/.wb-tmp-step-00000003``; only after all
ranks finished does rank 0 write ``meta.json`` and the manifest and rename the directory
into place (``checkpoint.write``). A save that fails or dies halfway leaves the previous
checkpoint untouched (and at most a ``.wb-tmp-*`` directory that loads ignore and the
next save removes). A load without a step takes the newest checkpoint signed with the key,
warning which newer ones it skipped (``checkpoint.verify.newest_signed``).

Loading is all-or-nothing: the manifest's signature and every sum are checked (the files
split among the ranks), ``meta.json`` and the RNG files parsed and checked
(``checkpoint.verify``), and DCP reads
into copies of the state dicts; the run (weights, optimizer, RNG, step, data position)
is replaced only once every rank got that far. DCP reads through ``checkpoint.reader``:
no arbitrary unpickling, even of verified files.

All three functions are collective for distributed strategies: call them on every rank.
A failure on one rank is exchanged at the next step (``checkpoint.steps``), so every rank
raises the same ``CheckpointError`` naming the failing rank(s) and none waits in a
collective.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from workbench.errors import CheckpointError
from workbench.parallel.checkpoint.layout import checkpoint_name, list_checkpoints, rng_name
from workbench.parallel.checkpoint.meta import (
    FORMAT,
    check_same_model,
    make_meta,
    param_shapes,
    rng_state,
    set_rng_state,
)
from workbench.parallel.checkpoint.reader import VerifiedReader, WeightsOnlyPlanner
from workbench.parallel.checkpoint.steps import Steps, tagged, world_of
from workbench.parallel.checkpoint.trust import checkpoint_key, write_manifest
from workbench.parallel.checkpoint.verify import Verified, verify
from workbench.parallel.checkpoint.write import commit, prepare, prune, temp_dir, write_json
from workbench.parallel.step import TrainStep

__all__ = [
    "FORMAT",
    "SUPPORTED_STRATEGIES",
    "list_checkpoints",
    "load_checkpoint",
    "save_checkpoint",
]

# zero1 (ZeroRedundancyOptimizer), megatron (hand-sharded plain tensors that DCP would take
# for replicated copies) and pp (per-stage modules) are not expressed as DTensor shards, so
# DCP cannot save or reshard them correctly; they are refused rather than saved wrongly.
SUPPORTED_STRATEGIES: tuple[str, ...] = ("single", "dp", "zero2", "fsdp", "tp", "dp_tp")
# A run of the user's own model (strategy "user:<layout>") is checked by what it is made
# of, for the same reasons: no pipeline stages, no ZeroRedundancyOptimizer.
USER_PREFIX = "user:"
USER_SUPPORTED = "DDP (zero=0), FSDP (zero=2 or 3) and TP, alone or as dp x tp"


def _user_refusal(train_step: TrainStep) -> str | None:
    """Why a run of the user's own model cannot be checkpointed, or None."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    from workbench.parallel.pp import PipelineModule

    if isinstance(train_step.model, PipelineModule):
        return "pipeline stages (pp > 1) are per-stage modules DCP cannot reshard"
    if isinstance(train_step.optimizer, ZeroRedundancyOptimizer):
        return "ZeRO-1's optimizer state (zero=1) is not held as DTensor shards"
    return None


def _check_strategy(train_step: TrainStep) -> None:
    if train_step.strategy.startswith(USER_PREFIX):
        why = _user_refusal(train_step)
        if why is not None:
            raise CheckpointError(
                f"strategy={train_step.strategy!r} cannot be checkpointed: {why}; "
                f"checkpoints of your own model support {USER_SUPPORTED}"
            )
        return
    if train_step.strategy not in SUPPORTED_STRATEGIES:
        raise CheckpointError(
            f"strategy={train_step.strategy!r} cannot be checkpointed; checkpoints support "
            f"{', '.join(SUPPORTED_STRATEGIES)}"
        )


def _check_save(train_step: TrainStep, keep_last: int | None) -> None:
    """What a save refuses before any rank writes: the strategy, ``keep_last``, and a
    step in progress (its state is between two steps' and no load could resume it)."""
    _check_strategy(train_step)
    if keep_last is not None and (
        isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 1
    ):
        raise CheckpointError(
            f"keep_last={keep_last!r} is not valid; it must be an integer >= 1 or None"
        )
    if not train_step.at_step_boundary:
        raise CheckpointError(
            f"cannot checkpoint in the middle of step {train_step.step} (next phase "
            f"{train_step.phase!r}); finish the step first (step(), not phase())"
        )


# -- save --------------------------------------------------------------------------------
def save_checkpoint(
    train_step: TrainStep,
    root: str | os.PathLike[str],
    *,
    keep_last: int | None = None,
    key: bytes | None = None,
) -> Path:
    """Save ``train_step`` (at a step boundary) under ``root``; returns the checkpoint dir.

    ``keep_last=N`` then deletes all but the newest N checkpoints. ``key`` signs the
    manifest (default: ``checkpoint_key()``, the per-user key file).
    """
    _check_save(train_step, keep_last)
    root = Path(root)
    final = root / checkpoint_name(train_step.step)
    tmp = temp_dir(final)
    steps = Steps(train_step, f"saving step {train_step.step} to {str(root)!r}")
    rank, world = steps.rank, world_of(train_step)
    kept = " (the previous checkpoints are unchanged)"
    with tagged(train_step):
        with steps.local():
            if rank == 0:  # only rank 0 signs; a bad key fails before anything is written
                key = checkpoint_key() if key is None else key
                prepare(root, tmp, final)
        steps.agree(kept)
        shapes: dict[str, list[int]] = {}
        try:
            with steps.local():
                model_sd, optim_sd = get_state_dict(train_step.model, train_step.optimizer)
                shapes = param_shapes(model_sd)
            steps.agree(kept)
            with steps.local():
                dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(tmp))
                tensors, py = rng_state()
                torch.save(tensors, tmp / f"{rng_name(rank)}.pt")
                write_json(tmp / f"{rng_name(rank)}.json", py)
            steps.agree(kept)  # every rank's files are written before the commit
            with steps.local():
                if rank == 0:
                    write_json(tmp / "meta.json", make_meta(train_step, world, shapes))
                    # last: it signs every other file
                    write_manifest(tmp, checkpoint_key() if key is None else key)
                    commit(tmp, final)
                    if keep_last is not None:
                        prune(root, keep_last)
            steps.agree(kept)
        except CheckpointError:
            if rank == 0:  # nothing half-written is left behind
                shutil.rmtree(tmp, ignore_errors=True)
            raise
    return final


# -- load --------------------------------------------------------------------------------
def _copy(value: Any) -> Any:
    """A detached copy of a state dict (DTensors stay DTensors): DCP reads into it, so
    the live tensors that ``get_state_dict`` returns views of stay untouched."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_copy(v) for v in value)
    return value


def load_checkpoint(
    train_step: TrainStep,
    root: str | os.PathLike[str],
    step: int | None = None,
    *,
    key: bytes | None = None,
) -> dict[str, Any]:
    """Load the checkpoint of ``step`` (default: the newest) into ``train_step``.

    The layout may differ from the one saved (e.g. saved under fsdp, loaded under dp): DCP
    reshards to whatever ``train_step`` holds. Returns the checkpoint's metadata. Only a
    checkpoint whose manifest is signed with ``key`` (default: ``checkpoint_key()``) and
    whose files all match it is read. All or nothing: on any error, on any rank, every
    rank raises ``CheckpointError`` and the run is as it was.
    """
    _check_strategy(train_step)
    steps = Steps(train_step, f"loading a checkpoint from {str(root)!r}")
    unchanged = " (the run is unchanged)"
    optimizer = train_step.optimizer
    # get_state_dict initialises an optimizer that has no state yet (a step with lr 0);
    # a failed load must not leave that behind either.
    fresh_optimizer = not optimizer.state
    verified: Verified | None = None
    with tagged(train_step):
        try:
            with steps.local():
                verified = verify(train_step, Path(root), step, key)
            steps.agree(unchanged)
            if verified is None:  # agree() raised for whatever stopped verify
                raise CheckpointError(f"{steps.what} failed")
            steps.what = f"loading the checkpoint at {str(verified.path)!r}"
            with steps.local():
                model_sd, optim_sd = get_state_dict(train_step.model, optimizer)
                check_same_model(
                    verified.meta.get("params"), param_shapes(model_sd), repr(str(verified.path))
                )
                state = _copy({"model": model_sd, "optim": optim_sd})
            steps.agree(unchanged)
            with steps.local():
                dcp.load(
                    state,
                    storage_reader=VerifiedReader(str(verified.path), verified.digests),
                    planner=WeightsOnlyPlanner(),
                )
            steps.agree(unchanged)
        except CheckpointError:
            if fresh_optimizer:
                optimizer.state.clear()
            raise
        # Every rank has read and checked everything: only now is the run replaced.
        with steps.local():
            _replace_run(train_step, state, verified)
        steps.agree(" while replacing the run's state; reset() or load again")
    return {**verified.meta, "path": str(verified.path)}


def _replace_run(train_step: TrainStep, state: dict[str, Any], verified: Verified) -> None:
    """The run takes the loaded weights, optimizer state, RNG, step and data position."""
    set_state_dict(
        train_step.model,
        train_step.optimizer,
        model_state_dict=state["model"],
        optim_state_dict=state["optim"],
    )
    if verified.rng is not None:
        set_rng_state(*verified.rng)
    meta = verified.meta
    train_step.restore_position(
        step=meta["step"],
        data_position=meta["data_position"],
        last_loss=meta.get("last_loss"),
    )
