"""One exception tree for the whole workbench.

Every message names the bad value, the valid choices and, where there is one, the fix.
User input is validated with these, never with ``assert``.

The tree (as httpx draws its own)::

    WorkbenchError
    ├── ConfigError (also a ValueError)     a setting out of range or not a valid choice
    │   └── ParallelError                   a layout that cannot be built
    ├── ClusterError                        the cluster could not start, or lost a rank
    │   ├── EngineDied                      an engine process exited
    │   │   ├── EngineUnresponsive          alive but not answering (frozen, stopped)
    │   │   └── HostLost                    every engine of a host gone, the host silent
    │   ├── RankError                       code raised on ranks (``failures``)
    │   ├── CollectiveTimeout               no finish in time (``report``: who waited where)
    │   ├── RankFailed                      on an engine: this rank failed part-way
    │   ├── PeerFailed                      on an engine: stopped because another failed
    │   └── DebuggerUnavailable             on an engine: breakpoint() with no one to answer
    ├── DebuggerQuit                        on an engine: ``q`` at a rank's pdb prompt
    ├── CheckpointError                     missing, incomplete, untrusted or mismatched
    └── UserCodeError                       the user's model, data or loss failed
"""

from __future__ import annotations

import re
from collections.abc import Iterable

__all__ = [
    "CheckpointError",
    "ClusterError",
    "CollectiveTimeout",
    "ConfigError",
    "DebuggerQuit",
    "DebuggerUnavailable",
    "EngineDied",
    "EngineUnresponsive",
    "HostLost",
    "ParallelError",
    "PeerFailed",
    "RankError",
    "RankFailed",
    "UserCodeError",
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


def _message_only(error: BaseException) -> list[str]:
    """What IPython shows for a fault on the ranks: its name and message, as IPython ends a
    traceback, without the kernel-side frames (the magic, the dispatch's wait: nothing the
    user wrote). Formatting those frames was most of a dead rank's report on the first
    fault in a fresh kernel (0.25-0.55 s of IPython's first traceback, issue 31)."""
    return [f"\x1b[0;31m{type(error).__name__}\x1b[0m: {error}"]


class EngineDied(ClusterError):
    """An engine process exited while the workbench was using it."""

    def __init__(self, message: str, *, ranks: list[int] | None = None) -> None:
        super().__init__(message)
        self.ranks = list(ranks or [])

    def _render_traceback_(self) -> list[str]:
        return _message_only(self)


class HostLost(EngineDied):
    """Every engine of a host is gone and the host does not answer: nothing can be started
    there. Go on without it (``session.recover(shrink=True)``) or on another host.
    ``HostLost.of(host, ranks)`` writes the message; ``host`` names the lost host."""

    def __init__(self, message: str, *, ranks: list[int] | None = None, host: str = "") -> None:
        super().__init__(message, ranks=ranks)
        self.host = host

    @classmethod
    def of(cls, host: str, ranks: list[int]) -> HostLost:
        return cls(
            f"host {host!r} is lost (ranks {ranks}: every engine gone and the host does not "
            "answer, or Slurm has its node out of service); continue on the other hosts with "
            "session.recover(shrink=True) (`%wb restart --shrink`), or start the cluster again "
            "on hosts that answer",
            ranks=ranks,
            host=host,
        )


class EngineUnresponsive(EngineDied):
    """An engine's process still exists but stopped answering (stopped by a signal, frozen,
    or missing the controller's heartbeats); recovery replaces it like a dead one."""


class RankError(ClusterError):
    """Code raised on one or more ranks; ``failures`` maps rank -> formatted traceback."""

    def __init__(self, message: str, *, failures: dict[int, str] | None = None) -> None:
        super().__init__(message)
        self.failures = dict(failures or {})

    @classmethod
    def from_failures(cls, failures: dict[int, str]) -> RankError:
        """Message: the failing ranks, then each distinct traceback once (no colour codes)."""
        error = cls(f"failed on ranks {sorted(failures)}", failures=failures)
        body = "\n".join(_ANSI.sub("", line) for line in error._render_traceback_())
        error.args = (f"failed on ranks {sorted(failures)}:\n{body}",)
        return error

    def _render_traceback_(self) -> list[str]:
        """IPython shows this instead of the local traceback: the remote tracebacks, each
        distinct one once, headed by the ranks that raised it."""
        if not self.failures:
            return [str(self)]
        groups: dict[str, tuple[str, list[int]]] = {}
        for rank, tb in sorted(self.failures.items()):
            groups.setdefault(_traceback_key(tb), (tb, []))[1].append(rank)
        lines: list[str] = []
        for tb, ranks in groups.values():
            label = "rank" if len(ranks) == 1 else "ranks"
            lines.append(f"[{label} {', '.join(map(str, ranks))}]")
            lines.extend(tb.splitlines())
        return lines


class CollectiveTimeout(ClusterError):
    """A cell or step did not finish in time; ``report`` says who waited where.

    ``autopsy`` (``workbench.cluster.dispatch.autopsy.Autopsy``, None where none was taken) holds
    the ``verdict``, the ``culprits`` and each rank's location, stack and collective."""

    def __init__(
        self, message: str, *, report: object | None = None, autopsy: object | None = None
    ) -> None:
        super().__init__(message)
        self.report = report
        self.autopsy = autopsy

    @property
    def verdict(self) -> str | None:
        return getattr(self.autopsy, "verdict", None)

    @property
    def culprits(self) -> list[int]:
        return list(getattr(self.autopsy, "culprits", None) or [])

    def _render_traceback_(self) -> list[str]:
        return _message_only(self)

    def _repr_html_(self) -> str:
        import html

        table = getattr(self.autopsy, "_repr_html_", None)
        text = f"<pre>{html.escape(str(self))}</pre>"
        return text + (table() if callable(table) else "")


class RankFailed(ClusterError):
    """Raised on an engine: this rank failed part-way and closed its process group, so no
    peer waits for it (``workbench.engine.fail_together``)."""


class PeerFailed(ClusterError):
    """Raised on an engine: this rank stopped because another rank failed (the process
    group was closed under it)."""


class DebuggerUnavailable(ClusterError):
    """Raised on an engine: ``breakpoint()`` / ``pdb.set_trace()`` ran where no one can
    answer pdb's prompts (no stdin: nbclient, nbval, ``Cluster.execute`` from a script);
    the message says how to debug instead (``workbench.engine.rank_debug``)."""

    def _render_traceback_(self) -> list[str]:
        return _message_only(self)


class DebuggerQuit(WorkbenchError):
    """Raised on an engine: the person typed ``q`` at a rank's pdb prompt, which stops
    that rank's cell (``workbench.engine.rank_debug``). Not a ``bdb.BdbQuit``: IPython
    ends a cell on that without a word, and the cell's error must say why it stopped."""

    def _render_traceback_(self) -> list[str]:
        return _message_only(self)


class CheckpointError(WorkbenchError):
    """A checkpoint is missing, incomplete or does not match the run. ``ranks``: the ranks
    that failed, when every rank of a collective save / load agreed on it (else None)."""

    def __init__(self, message: str, *, ranks: list[int] | None = None) -> None:
        super().__init__(message)
        self.ranks = None if ranks is None else list(ranks)


class UserCodeError(WorkbenchError):
    """The user's own model, data, loss or optimizer failed (or never arrived) on a rank."""


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_CELL_COUNT = re.compile(r"In\s*\[\d+\]")


def _traceback_key(tb: str) -> str:
    """Tracebacks that differ only in colour codes or the engine's cell counter are equal."""
    return _CELL_COUNT.sub("In[*]", _ANSI.sub("", tb))


def choices_error(
    name: str, value: object, choices: Iterable[object], *, cls: type[ConfigError] = ConfigError
) -> ConfigError:
    """Build the standard "bad value, valid choices" error."""
    listed = ", ".join(repr(c) for c in choices)
    return cls(f"{name}={value!r} is not valid; choose one of: {listed}")
