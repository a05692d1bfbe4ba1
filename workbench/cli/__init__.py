"""The ``workbench`` command line: subcommands registered from small modules.

Each module in ``SUBCOMMANDS`` exposes ``register(subparsers)``, which adds its parser and
sets ``handler`` (``args -> int``) as a default. Adding a command is one line here.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from workbench.errors import WorkbenchError

__all__ = ["SUBCOMMANDS", "build_parser", "main"]

# Module names (under workbench.cli) that provide subcommands. Missing modules are skipped
# so a partial install still runs the commands it has.
SUBCOMMANDS: tuple[str, ...] = ("plan", "calibrate", "demo")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="workbench",
        description="A workbench for distributed PyTorch training: plan, calibrate, demo.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMANDS:
        try:
            module = importlib.import_module(f"workbench.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"workbench.cli.{name}":
                continue
            raise
        module.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit code (2 for usage and configuration errors)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse already printed the usage error (or --help)
        return exc.code if isinstance(exc.code, int) else 2
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return 2
    try:
        return int(handler(args) or 0)
    except WorkbenchError as exc:
        print(f"workbench {args.command}: error: {exc}", file=sys.stderr)
        return 2
