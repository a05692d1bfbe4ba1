"""Where checkpoints live on disk: one directory per step, listed and chosen by step.

``<root>/step-00000003`` is the checkpoint of step 3 once its ``meta.json`` exists (a save
renames its temporary directory into place only when complete). Listing reads each
``meta.json`` (at most ``SMALL_FILE_BYTES`` of it) but verifies nothing: that is the load's
job (``checkpoint.load_checkpoint``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from workbench.errors import CheckpointError
from workbench.parallel.checkpoint.meta import parse_meta
from workbench.parallel.checkpoint.trust import read_capped

__all__ = [
    "PREFIX",
    "checkpoint_name",
    "choose_checkpoint",
    "committed_checkpoints",
    "list_checkpoints",
    "rng_name",
]

PREFIX = "step-"


def checkpoint_name(step: int) -> str:
    return f"{PREFIX}{step:08d}"


def rng_name(rank: int) -> str:
    """A rank's RNG files inside a checkpoint, without the suffix (``.pt`` / ``.json``)."""
    return f"rng/rank-{rank:05d}"


def committed_checkpoints(root: Path) -> dict[int, Path]:
    """Checkpoint directories by the step in their name (those with a ``meta.json``)."""
    if not root.is_dir():
        return {}
    found: dict[int, Path] = {}
    for path in root.iterdir():
        digits = path.name[len(PREFIX) :]
        if path.name.startswith(PREFIX) and digits.isdigit() and (path / "meta.json").is_file():
            found[int(digits)] = path
    return dict(sorted(found.items()))


def list_checkpoints(root: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Complete checkpoints under ``root``, oldest first: each ``meta.json`` plus ``path``.

    Directories without ``meta.json`` (a save that died) or with one that is not valid
    are not listed (loading one names what is wrong with it). Nothing here is verified
    against the manifest: this is a listing, not a load.
    """
    found: list[dict[str, Any]] = []
    for step, path in committed_checkpoints(Path(root)).items():
        try:
            data = read_capped(path / "meta.json", f"meta.json of {str(path)!r}")
            meta = parse_meta(data, repr(str(path)))
        except (OSError, CheckpointError):
            continue
        if meta["step"] == step:
            found.append({**meta, "path": str(path)})
    return found


def choose_checkpoint(root: Path, step: int | None) -> Path:
    if step is not None and (isinstance(step, bool) or not isinstance(step, int) or step < 0):
        raise CheckpointError(f"step={step!r} is not valid; it must be an integer >= 0 or None")
    available = committed_checkpoints(root)
    if not available:
        raise CheckpointError(f"no complete checkpoint under {str(root)!r}; save one first")
    if step is None:
        return available[max(available)]
    if step not in available:
        raise CheckpointError(
            f"step={step!r} has no checkpoint under {str(root)!r}; "
            f"available steps: {list(available)}"
        )
    return available[step]
