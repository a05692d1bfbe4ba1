"""The ``%wb`` line magic and ``%%wb`` cell magic: thin adapters over ``workbench.Cluster``.

Subcommands are small functions registered in ``COMMANDS``; each builds its own parser, so
``%wb <cmd> --help`` works everywhere and bad arguments raise ``UsageError``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class

from workbench.cluster import Cluster
from workbench.magics.args import HelpShown, MagicParser, parse_ranks, split_line
from workbench.magics.render import show_results

__all__ = ["COMMANDS", "Command", "WorkbenchMagics"]


@dataclass(frozen=True)
class Command:
    """A ``%wb`` subcommand: a parser factory and a handler(magics, args)."""

    help: str
    parser: Callable[[MagicParser], None]
    run: Callable[[WorkbenchMagics, Any], Any]


COMMANDS: dict[str, Command] = {}


def command(name: str, help: str, parser: Callable[[MagicParser], None]) -> Callable[..., Any]:
    def register(
        fn: Callable[[WorkbenchMagics, Any], Any],
    ) -> Callable[[WorkbenchMagics, Any], Any]:
        COMMANDS[name] = Command(help=help, parser=parser, run=fn)
        return fn

    return register


def _usage() -> str:
    width = max(len(n) for n in COMMANDS)
    rows = "\n".join(f"  {n:<{width}}  {c.help}" for n, c in COMMANDS.items())
    return (
        "usage: %wb COMMAND [options]   (each command has --help)\n\n"
        f"commands:\n{rows}\n\n"
        "cell magic:\n  %%wb [--ranks R] [--timeout S]   run the cell on the ranks"
    )


@functools.cache
def _cell_parser() -> MagicParser:
    """Built once: %%wb parses its line on every cell, and building argparse is the cost."""
    p = MagicParser(prog="%%wb", description="Run this cell on every rank (or some ranks).")
    p.add_argument("--ranks", "-r", default=None, help="'all' (default), '0,2' or '0-3'")
    p.add_argument("--timeout", "-t", type=float, default=None, help="seconds before giving up")
    p.add_argument("--no-labels", action="store_true", help="do not prefix output with [rank N]")
    return p


@magics_class
class WorkbenchMagics(Magics):
    """Holds the notebook's current cluster; everything else lives in the library."""

    def __init__(self, shell: Any) -> None:
        super().__init__(shell)
        self.cluster: Cluster | None = None

    def require_cluster(self) -> Cluster:
        # A "broken" cluster (dead controller) is returned: its calls say what happened.
        if self.cluster is None or self.cluster.state not in ("running", "degraded", "broken"):
            raise UsageError("no cluster is running; start one first with `%wb start -n 2`")
        return self.cluster

    @line_magic
    def wb(self, line: str) -> Any:
        argv = split_line(line)
        if not argv or argv[0] in ("-h", "--help", "help"):
            print(_usage())
            return None
        name, rest = argv[0], argv[1:]
        cmd = COMMANDS.get(name)
        if cmd is None:
            raise UsageError(
                f"unknown command {name!r}; valid commands: {', '.join(COMMANDS)} "
                "(see `%wb --help`)"
            )
        parser = MagicParser(prog=f"%wb {name}", description=cmd.help)
        cmd.parser(parser)
        try:
            args = parser.parse(rest)
        except HelpShown:
            return None
        return cmd.run(self, args)

    @cell_magic("wb")
    def wb_cell(self, line: str, cell: str) -> None:
        try:
            args = _cell_parser().parse(split_line(line))
        except HelpShown:
            return
        if args.timeout is not None and not args.timeout > 0:  # also catches nan
            raise UsageError(f"--timeout {args.timeout} must be a positive number of seconds")
        cluster = self.require_cluster()
        ranks = parse_ranks(args.ranks, cluster.world_size)
        results = cluster.execute(cell, ranks=ranks, timeout=args.timeout)
        show_results(results, label_single=not args.no_labels)


# Register the built-in subcommands (they import this module for ``command``).
from workbench.magics import cluster_cmds as _cluster_cmds  # noqa: E402, F401
from workbench.magics import step_cmds as _step_cmds  # noqa: E402, F401
from workbench.magics import ui_cmds as _ui_cmds  # noqa: E402, F401

# isort: split
# After the commands above, so `%wb --help` lists them first.
from workbench.magics import checkpoint_cmds as _checkpoint_cmds  # noqa: E402, F401
