"""The ``%wb`` subcommand registry: each command module registers its handlers here.

A subcommand is a parser factory and a handler ``(magics, args)``; ``%wb <cmd> --help``
works everywhere because each command builds its own parser. The registry imports nothing
of the magics themselves, so command modules and ``core`` never import each other.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from workbench.magics.args import MagicParser

if TYPE_CHECKING:
    from workbench.cluster import Cluster
    from workbench.session.traced_log import TraceLog

__all__ = ["COMMANDS", "Command", "MagicsState", "command", "usage"]


class MagicsState(Protocol):
    """What a subcommand asks of the ``%wb`` magics object (``core.WorkbenchMagics``, the
    owner of the notebook's clusters and trace log). Commands name only this, so ``core``
    imports them (to register) and they never import ``core`` back."""

    load_import_s: float | None
    trace_log: TraceLog | None

    @property
    def cluster(self) -> Cluster | None: ...
    def require_cluster(self) -> Cluster: ...
    def running_started_here(self) -> Cluster | None: ...
    def remember(self, cluster: Cluster) -> None: ...
    def current_trace_log(self) -> TraceLog: ...


@dataclass(frozen=True)
class Command:
    """A ``%wb`` subcommand: a parser factory and a handler(magics, args)."""

    help: str
    parser: Callable[[MagicParser], None]
    run: Callable[[MagicsState, Any], Any]


COMMANDS: dict[str, Command] = {}


def command(name: str, help: str, parser: Callable[[MagicParser], None]) -> Callable[..., Any]:
    def register(fn: Callable[[MagicsState, Any], Any]) -> Callable[[MagicsState, Any], Any]:
        COMMANDS[name] = Command(help=help, parser=parser, run=fn)
        return fn

    return register


def usage() -> str:
    width = max(len(n) for n in COMMANDS)
    rows = "\n".join(f"  {n:<{width}}  {c.help}" for n, c in COMMANDS.items())
    return (
        "usage: %wb COMMAND [options]   (each command has --help)\n\n"
        f"commands:\n{rows}\n\n"
        "cell magic:\n  %%wb [--ranks R] [--timeout S]   run the cell on the ranks"
    )
