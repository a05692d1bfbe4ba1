"""The atomic write of a checkpoint directory: a temporary directory, renamed when complete.

Every rank writes into ``<root>/.tmp-step-00000003``; only once all ranks finished does
rank 0 rename it to ``<root>/step-00000003``. A save that dies halfway leaves at most a
``.tmp-*`` directory, which loads ignore (``checkpoint.layout`` lists only committed
ones) and the next save removes. The files themselves are fsynced before the rename.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from workbench.parallel.checkpoint.layout import list_checkpoints

__all__ = ["commit", "prepare", "prune", "temp_dir", "write_json"]

_TMP = ".tmp-"
_TRASH = ".old-"


def temp_dir(final: Path) -> Path:
    """Where the ranks write the checkpoint that becomes ``final``."""
    return final.with_name(f"{_TMP}{final.name}")


def prepare(root: Path, tmp: Path) -> None:
    """Rank 0, before any rank writes: ``root`` exists, what a save that died halfway
    left is gone, and ``tmp`` (with its ``rng/``) is new and empty."""
    root.mkdir(parents=True, exist_ok=True)
    for stale in root.glob(f"{_TMP}*"):
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
