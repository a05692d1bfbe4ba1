"""Checkpoints of a ``TrainStep`` with torch.distributed.checkpoint (DCP).

A checkpoint is a directory ``<root>/step-00000003`` holding

- the DCP shards of ``{"model": ..., "optim": ...}`` as ``get_state_dict`` returns them:
  each rank writes the shards it owns (DDP: rank 0 writes the replicated tensors once;
  FSDP2 / DTensor: every rank its shard), so a load under another layout reshards;
- ``rng/rank-00001.pt``: each rank's torch RNG states (tensors only, loaded with
  ``weights_only=True``) and ``rng/rank-00001.json``: its Python ``random`` state;
- ``meta.json``: step, data position, last loss, strategy, world size and the run's spec;
- ``manifest.json``: the SHA-256 sum of every other file, signed (HMAC) with a key kept
  outside the checkpoint (``checkpoint_trust``).

Saving is atomic: every rank writes into ``<root>/.tmp-step-00000003``; only after all
ranks finished does rank 0 write ``meta.json`` and the manifest and rename the directory
into place. A save that dies halfway leaves a ``.tmp-*`` directory that loads ignore and
the next save removes, and the previous checkpoint untouched.

Loading trusts only what the key vouches for: the manifest's signature and every sum are
checked before DCP reads anything, and DCP then reads through ``checkpoint_reader`` (no
arbitrary unpickling even of verified files).

All three functions are collective for distributed strategies: call them on every rank.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from workbench.errors import CheckpointError
from workbench.parallel.checkpoint_reader import (
    VerifiedReader,
    WeightsOnlyPlanner,
    describe_failure,
)
from workbench.parallel.checkpoint_trust import (
    checkpoint_key,
    read_manifest,
    verify_files,
    write_manifest,
)
from workbench.parallel.step import TrainStep

__all__ = [
    "FORMAT",
    "SUPPORTED_STRATEGIES",
    "list_checkpoints",
    "load_checkpoint",
    "save_checkpoint",
]

FORMAT = 1
_PREFIX = "step-"
_TMP = ".tmp-"
_TRASH = ".old-"
# zero1 (ZeroRedundancyOptimizer), megatron (hand-sharded plain tensors that DCP would take
# for replicated copies) and pp (per-stage modules) are not expressed as DTensor shards, so
# DCP cannot save or reshard them correctly; they are refused rather than saved wrongly.
SUPPORTED_STRATEGIES: tuple[str, ...] = ("single", "dp", "zero2", "fsdp", "tp", "dp_tp")


def _distributed(train_step: TrainStep) -> bool:
    return train_step.strategy != "single" and dist.is_initialized()


def _rank(train_step: TrainStep) -> int:
    return dist.get_rank() if _distributed(train_step) else 0


def _barrier(train_step: TrainStep) -> None:
    if _distributed(train_step):
        dist.barrier()


@contextmanager
def _quiet_single(train_step: TrainStep) -> Iterator[None]:
    """DCP warns that it assumes one process when there is no process group: expected
    for ``single``, so not shown."""
    with warnings.catch_warnings():
        if not _distributed(train_step):
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def _check_strategy(train_step: TrainStep) -> None:
    if train_step.strategy not in SUPPORTED_STRATEGIES:
        raise CheckpointError(
            f"strategy={train_step.strategy!r} cannot be checkpointed; checkpoints support "
            f"{', '.join(SUPPORTED_STRATEGIES)}"
        )


def _name(step: int) -> str:
    return f"{_PREFIX}{step:08d}"


def _rng_state() -> tuple[dict[str, Any], dict[str, Any]]:
    tensors: dict[str, Any] = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        tensors["cuda"] = torch.cuda.get_rng_state_all()
    version, internal, gauss = random.getstate()
    return tensors, {"version": version, "state": list(internal), "gauss": gauss}


def _set_rng_state(tensors: dict[str, Any], py: dict[str, Any]) -> None:
    torch.set_rng_state(tensors["cpu"])
    if "cuda" in tensors and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(tensors["cuda"])
    random.setstate((py["version"], tuple(py["state"]), py["gauss"]))


def _meta(train_step: TrainStep, world: int) -> dict[str, Any]:
    spec = train_step.spec
    spec_fields: dict[str, Any] | None = None
    if spec is not None:
        from dataclasses import asdict

        spec_fields = asdict(spec)
    return {
        "format": FORMAT,
        "step": train_step.step,
        "data_position": train_step.data_position,
        "last_loss": train_step.last_loss,
        "strategy": train_step.strategy,
        "world_size": world,
        "model": spec_fields["model"] if spec_fields else None,
        "spec": spec_fields,
    }


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
    _check_strategy(train_step)
    key = checkpoint_key() if key is None else key
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
    root = Path(root)
    rank = _rank(train_step)
    world = dist.get_world_size() if _distributed(train_step) else 1
    final = root / _name(train_step.step)
    tmp = root / f"{_TMP}{_name(train_step.step)}"
    if rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        for stale in root.glob(f"{_TMP}*"):  # left by a save that died halfway
            shutil.rmtree(stale, ignore_errors=True)
        (tmp / "rng").mkdir(parents=True)
    _barrier(train_step)

    recorder = train_step.recorder
    previous, recorder.phase = recorder.phase, "checkpoint"  # tags DCP's own collectives
    try:
        model_sd, optim_sd = get_state_dict(train_step.model, train_step.optimizer)
        with _quiet_single(train_step):
            dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(tmp))
        tensors, py = _rng_state()
        torch.save(tensors, tmp / "rng" / f"rank-{rank:05d}.pt")
        (tmp / "rng" / f"rank-{rank:05d}.json").write_text(json.dumps(py))
        _barrier(train_step)  # every rank's files are written before the commit
        if rank == 0:
            _write_json(tmp / "meta.json", _meta(train_step, world))
            write_manifest(tmp, key)  # last: it signs every other file
            _commit(tmp, final)
            if keep_last is not None:
                for old in list_checkpoints(root)[:-keep_last]:
                    shutil.rmtree(old["path"], ignore_errors=True)
        _barrier(train_step)
    finally:
        recorder.phase = previous
    return final


def _write_json(path: Path, data: dict[str, Any]) -> None:
    with open(path, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())


def _commit(tmp: Path, final: Path) -> None:
    """Rename ``tmp`` to ``final``; a checkpoint of the same step (after a rollback) is
    moved aside first and deleted only once the new one is in place."""
    old = None
    if final.exists():
        old = final.with_name(f"{_TRASH}{final.name}")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
    os.replace(tmp, final)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def list_checkpoints(root: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Complete checkpoints under ``root``, oldest first: each ``meta.json`` plus ``path``.

    Directories without ``meta.json`` (a save that died) are not listed.
    """
    root = Path(root)
    if not root.is_dir():
        return []
    found: list[dict[str, Any]] = []
    for path in root.iterdir():
        meta_path = path / "meta.json"
        if not path.name.startswith(_PREFIX) or not meta_path.is_file():
            continue
        try:
            meta = json.loads(meta_path.read_text())
        except (OSError, ValueError):
            continue
        if meta.get("format") != FORMAT:
            continue
        meta["path"] = str(path)
        found.append(meta)
    return sorted(found, key=lambda m: int(m["step"]))


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
    whose files all match it is read.
    """
    _check_strategy(train_step)
    key = checkpoint_key() if key is None else key
    available = list_checkpoints(root)
    if not available:
        raise CheckpointError(f"no complete checkpoint under {str(root)!r}; save one first")
    if step is None:
        meta = available[-1]
    else:
        matches = [m for m in available if int(m["step"]) == step]
        if not matches:
            raise CheckpointError(
                f"step={step!r} has no checkpoint under {str(root)!r}; "
                f"available steps: {[int(m['step']) for m in available]}"
            )
        meta = matches[0]
    spec = train_step.spec
    if spec is not None and meta.get("model") not in (None, spec.model):
        raise CheckpointError(
            f"the checkpoint at {meta['path']!r} is of model {meta['model']!r}, this run is "
            f"{spec.model!r}; load it into a run of the same model"
        )
    path = Path(meta["path"])
    digests = read_manifest(path, key)
    # Before DCP (or anything else) reads a file; .metadata and meta.json must be signed.
    verify_files(path, digests, sorted({*digests, ".metadata", "meta.json"}))
    meta = {**json.loads((path / "meta.json").read_text()), "path": str(path)}
    recorder = train_step.recorder
    previous, recorder.phase = recorder.phase, "checkpoint"
    try:
        model_sd, optim_sd = get_state_dict(train_step.model, train_step.optimizer)
        state = {"model": model_sd, "optim": optim_sd}
        with _quiet_single(train_step):
            try:
                dcp.load(
                    state,
                    storage_reader=VerifiedReader(str(path), digests[".metadata"]),
                    planner=WeightsOnlyPlanner(),
                )
            except CheckpointException as exc:  # a BaseException: not caught by Exception
                raise CheckpointError(
                    f"reading the checkpoint at {str(path)!r} failed: {describe_failure(exc)}"
                ) from None
        set_state_dict(
            train_step.model,
            train_step.optimizer,
            model_state_dict=state["model"],
            optim_state_dict=state["optim"],
        )
    finally:
        recorder.phase = previous
    rank = _rank(train_step)
    rng_pt = path / "rng" / f"rank-{rank:05d}.pt"
    rng_json = path / "rng" / f"rank-{rank:05d}.json"
    if rng_pt.is_file() and rng_json.is_file():  # absent for ranks new to a bigger world
        tensors = torch.load(rng_pt, weights_only=True)
        _set_rng_state(tensors, json.loads(rng_json.read_text()))
    train_step.restore_position(
        step=int(meta["step"]),
        data_position=int(meta["data_position"]),
        last_loss=meta.get("last_loss"),
    )
    _barrier(train_step)
    return meta
