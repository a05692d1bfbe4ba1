"""The ``workbench`` command line: subcommands registered from small modules.

Each module in ``SUBCOMMANDS`` exposes ``register(subparsers)``, which adds its parser and
sets ``handler`` (``args -> int``) as a default. Only the subcommand being run is imported
(``workbench plan`` must not pay for ``demo``'s torch import); the others appear in
``--help`` by name and one-line help. Adding a command is one line here.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from workbench.errors import WorkbenchError

__all__ = ["SUBCOMMANDS", "build_parser", "main"]

# name -> one-line help. The module workbench.cli.<name> (dashes as underscores) provides
# the full parser; a missing module is skipped so a partial install still runs the
# commands it has.
SUBCOMMANDS: dict[str, str] = {
    "plan": "predict per-GPU memory, OOM, step time; recommend a layout",
    "calibrate": "measure local all-reduce and fit the planner's latency/bandwidth",
    "demo": "run one model under every strategy and write an HTML report",
    "kernel": "install the workbench's Jupyter kernel (a local cluster's processes started ahead)",
    "nbval-config": "print the path of the nbval sanitizer the workbench ships",
    "export": "write the torchrun command and an sbatch script for a script or a run.json",
}


class UsageError(Exception):
    """A command-line mistake; ``main`` prints it as one line and exits 2."""


class _Parser(argparse.ArgumentParser):
    """argparse that raises instead of printing usage and exiting, so every mistake is
    reported as one line (subparsers inherit the class)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{self.prog}: error: {message}")


def _chosen(argv: list[str]) -> str | None:
    """The subcommand named in ``argv`` (the first word that is one), if any."""
    for word in argv:
        if word in SUBCOMMANDS:
            return word
        if not word.startswith("-"):
            return None
    return None


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The parser; with ``argv``, only the subcommand it names is fully built (imported)."""
    parser = _Parser(
        prog="workbench",
        description="A workbench for distributed PyTorch training: plan, calibrate, demo.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    chosen = _chosen(argv) if argv is not None else None
    for name, help_text in SUBCOMMANDS.items():
        if argv is not None and name != chosen:
            subparsers.add_parser(name, help=help_text)  # listed in --help, never run
            continue
        module_name = f"workbench.cli.{name.replace('-', '_')}"
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name == module_name:
                continue
            raise
        module.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit code (2 for usage and configuration errors)."""
    words = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(words)
    try:
        args = parser.parse_args(words)
    except UsageError as exc:
        print(exc, file=sys.stderr)
        return 2
    except SystemExit as exc:  # --help printed
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
