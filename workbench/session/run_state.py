"""What a training session knows about its run between calls: per-rank status, cursors,
events; and the checks of its checkpoint options (made before anything is built)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workbench.errors import ConfigError
from workbench.parallel.models import get_config
from workbench.parallel.run_spec import RunSpec
from workbench.trace import Event

__all__ = [
    "Listener",
    "RankStatus",
    "RunState",
    "autosave_settings",
    "check_checkpoint_options",
    "checkpoint_root",
    "validate_layout",
]

Listener = Callable[[list[Event]], None]


@dataclass(slots=True)
class RankStatus:
    rank: int
    step: int = 0
    next_phase: str = "data"
    loss: float | None = None
    error: str | None = None


@dataclass(slots=True)
class RunState:
    spec: RunSpec
    phases: list[str] = field(default_factory=list)
    cursors: dict[int, int] = field(default_factory=dict)
    status: dict[int, RankStatus] = field(default_factory=dict)


def check_checkpoint_options(
    checkpoint_dir: str | Path | None,
    checkpoint_every: int | None,
    keep_last: int | None,
    checkpoint_key: bytes | None,
) -> None:
    """One clear ``ConfigError`` for a bad checkpoint option, before any work starts."""
    if checkpoint_every is not None and (
        isinstance(checkpoint_every, bool)
        or not isinstance(checkpoint_every, int)
        or checkpoint_every < 1
    ):
        raise ConfigError(
            f"checkpoint_every={checkpoint_every!r} is not valid; it must be an integer "
            ">= 1 or None (no automatic checkpoints)"
        )
    if checkpoint_key is not None and (
        not isinstance(checkpoint_key, bytes) or len(checkpoint_key) < 16
    ):
        raise ConfigError(
            "checkpoint_key must be bytes of at least 16 (random) bytes, or None for the "
            "per-user key file"
        )
    if checkpoint_every is not None and checkpoint_dir is None:
        raise ConfigError("checkpoint_every needs checkpoint_dir= (where to write them)")
    if keep_last is not None and (
        isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 1
    ):
        raise ConfigError(f"keep_last={keep_last!r} is not valid; use an integer >= 1 or None")


def checkpoint_root(path: str | Path | None, default: str | None) -> str:
    """The absolute checkpoint directory: ``path``, else the session's ``checkpoint_dir``."""
    root = path if path is not None else default
    if root is None:
        raise ConfigError(
            "no checkpoint directory: pass one (save('ckpt')) or create the session "
            "with checkpoint_dir="
        )
    return str(Path(root).absolute())


def autosave_settings(
    checkpoint_dir: str | None,
    every: int | None,
    keep_last: int | None,
    key: Callable[[], bytes],
) -> dict[str, Any] | None:
    """What the engines need to checkpoint every ``every`` steps, or None (no autosave).
    ``key`` is called only when there is something to sign."""
    if every is None or checkpoint_dir is None:
        return None
    return {"root": checkpoint_dir, "every": every, "keep_last": keep_last, "key": key()}


def validate_layout(spec: RunSpec, world_size: int) -> None:
    """Impossible layouts fail here, on the client, with the message naming the fix,
    instead of as the same error raised on every engine."""
    dims = spec.dims(world_size)
    dims.validate_for(get_config(spec.model, seed=spec.seed))
    spec.check_batch(dims)
