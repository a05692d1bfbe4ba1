"""The ``%wb`` subcommand registry: each command module registers its handlers here.

A subcommand is a parser factory and a handler ``(magics, args)``; ``%wb <cmd> --help``
works everywhere because each command builds its own parser. The registry imports nothing
of the magics themselves, so command modules and ``core`` never import each other.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from workbench.magics.args import MagicParser

__all__ = ["COMMANDS", "Command", "command", "usage"]


@dataclass(frozen=True)
class Command:
    """A ``%wb`` subcommand: a parser factory and a handler(magics, args)."""

    help: str
    parser: Callable[[MagicParser], None]
    run: Callable[[Any, Any], Any]


COMMANDS: dict[str, Command] = {}


def command(name: str, help: str, parser: Callable[[MagicParser], None]) -> Callable[..., Any]:
    def register(fn: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
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
