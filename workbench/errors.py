"""One exception tree for the whole workbench.

Every message names the bad value, the valid choices and, where there is one, the fix.
User input is validated with these, never with ``assert``.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = [
    "CheckpointError",
    "ClusterError",
    "CollectiveTimeout",
    "ConfigError",
    "EngineDied",
    "ParallelError",
    "RankError",
    "WorkbenchError",
    "choices_error",
]


class WorkbenchError(Exception):
    """Base class of every error the workbench raises on purpose."""


class ConfigError(WorkbenchError, ValueError):
    """A setting is out of range or not one of the valid choices."""


class ParallelError(ConfigError):
    """A parallel layout is impossible (sizes that do not divide, wrong world size, ...)."""


class ClusterError(WorkbenchError):
    """The cluster could not start, is not running, or lost an engine."""


class EngineDied(ClusterError):
    """An engine process exited while the workbench was using it."""

    def __init__(self, message: str, *, ranks: list[int] | None = None) -> None:
        super().__init__(message)
        self.ranks = list(ranks or [])


class RankError(ClusterError):
    """Code raised on one or more ranks; ``failures`` maps rank -> formatted traceback."""

    def __init__(self, message: str, *, failures: dict[int, str] | None = None) -> None:
        super().__init__(message)
        self.failures = dict(failures or {})


class CollectiveTimeout(ClusterError):
    """A cell or step did not finish in time; ``report`` says who waited where."""

    def __init__(self, message: str, *, report: object | None = None) -> None:
        super().__init__(message)
        self.report = report


class CheckpointError(WorkbenchError):
    """A checkpoint is missing, incomplete or does not match the run."""


def choices_error(
    name: str, value: object, choices: Iterable[object], *, cls: type[ConfigError] = ConfigError
) -> ConfigError:
    """Build the standard "bad value, valid choices" error."""
    listed = ", ".join(repr(c) for c in choices)
    return cls(f"{name}={value!r} is not valid; choose one of: {listed}")
