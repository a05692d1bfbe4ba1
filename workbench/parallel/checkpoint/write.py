"""The atomic write of a checkpoint directory: a temporary directory, renamed when complete.

Every rank writes into ``<root>/.wb-tmp-step-00000003``; only once all ranks finished
does rank 0 rename it to ``<root>/step-00000003``. A save that dies halfway leaves at most
a ``.wb-tmp-step-*`` directory, which loads ignore (``checkpoint.layout`` lists only
committed ones) and the next save removes (only those: other folders are the user's).
A ``step-*`` folder that is not a checkpoint is never replaced. The files themselves
are fsynced before the rename.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

from workbench.errors import CheckpointError
from workbench.parallel.checkpoint.layout import PREFIX, list_checkpoints
from workbench.parallel.checkpoint.trust import MANIFEST

__all__ = ["commit", "prepare", "prune", "temp_dir", "write_json"]

# The workbench's own temporary folders beside the checkpoints, and nothing else: a save
# deletes the leftovers of a save that died, never a folder of the user's that happens to
# start with ``.tmp-``. ``.tmp-step-<8 digits>`` is what workbench wrote before.
_TMP = ".wb-tmp-"
_TRASH = ".wb-old-"
_OURS = re.compile(rf"(\{_TMP}|\{_TRASH}|\.tmp-){PREFIX}\d{{8}}")


def temp_dir(final: Path) -> Path:
    """Where the ranks write the checkpoint that becomes ``final``."""
    return final.with_name(f"{_TMP}{final.name}")


def _is_checkpoint(path: Path) -> bool:
    """Whether ``path`` holds a checkpoint (its ``meta.json`` and ``manifest.json`` are
    files, as a save leaves them), not merely a folder of that name."""
    return all(os.path.isfile(path / name) for name in ("meta.json", MANIFEST))


def prepare(root: Path, tmp: Path, final: Path) -> None:
    """Rank 0, before any rank writes: ``root`` exists, what a save that died halfway
    left is gone, ``tmp`` (with its ``rng/``) is new and empty, and ``final`` is either
    absent or a checkpoint (one the user keeps there is never replaced)."""
    if final.exists() and not _is_checkpoint(final):
        raise CheckpointError(
            f"{str(final)!r} exists and is not a checkpoint (no meta.json and "
            f"{MANIFEST}); refusing to replace it: move it away or save under another root"
        )
    root.mkdir(parents=True, exist_ok=True)
    for stale in root.iterdir():
        if _OURS.fullmatch(stale.name) and stale.is_dir() and not stale.is_symlink():
            shutil.rmtree(stale, ignore_errors=True)
    (tmp / "rng").mkdir(parents=True)


def write_json(path: Path, data: dict[str, Any]) -> None:
    with open(path, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())


def commit(tmp: Path, final: Path) -> None:
    """Rename ``tmp`` to ``final``; a checkpoint of the same step (after a rollback) is
    moved aside first and deleted only once the new one is in place."""
    old = None
    if final.exists():
        if not _is_checkpoint(final):  # put there while the ranks wrote
            raise CheckpointError(
                f"{str(final)!r} appeared during the save and is not a checkpoint; "
                "refusing to replace it"
            )
        old = final.with_name(f"{_TRASH}{final.name}")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
    os.replace(tmp, final)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def prune(root: Path, keep_last: int) -> None:
    """Delete all but the newest ``keep_last`` checkpoints under ``root``."""
    for old in list_checkpoints(root)[:-keep_last]:
        shutil.rmtree(old["path"], ignore_errors=True)
