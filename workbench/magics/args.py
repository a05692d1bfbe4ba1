"""Argument parsing for the magics: argparse that raises ``UsageError`` instead of exiting."""

from __future__ import annotations

import argparse
import re
import shlex
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from IPython.core.error import UsageError

from workbench import validate
from workbench.errors import ConfigError

__all__ = [
    "HelpShown",
    "MagicParser",
    "UnknownOption",
    "add_cell_options",
    "parse_ranks",
    "seconds_option",
    "split_line",
    "whole_number",
]

_ASCII_INTEGER = re.compile(r"-?[0-9]+")


class HelpShown(Exception):
    """``--help`` was given: the help text has been printed, nothing else should run."""


class UnknownOption(UsageError, ConfigError):
    """A mistyped ``--flag``: IPython shows it as a usage error, and it is the workbench's
    ``ConfigError`` naming the nearest valid flag, as a mistyped keyword is in Python."""


class MagicParser(argparse.ArgumentParser):
    """An ArgumentParser for magics: errors are ``UsageError`` naming the valid choices."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("exit_on_error", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        usage = self.format_usage().strip()
        if message.startswith("unrecognized arguments:"):
            flags = sorted(self._option_string_actions)
            given = [w.split("=")[0] for w in message.split(":", 1)[1].split() if w[:1] == "-"]
            try:
                validate.option_names(self.prog, given, flags)
            except ConfigError as exc:
                raise UnknownOption(f"{exc}\n\n{usage}") from None
        raise UsageError(f"{self.prog}: {message}\n\n{usage}")

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        # argparse calls exit() after printing --help; never let it end the kernel.
        if message:
            print(message)
        raise HelpShown()

    def parse(self, argv: Sequence[str]) -> argparse.Namespace:
        try:
            return self.parse_args(list(argv))
        except argparse.ArgumentError as exc:
            self.error(str(exc))


def add_cell_options(p: argparse.ArgumentParser, via_controller_help: str) -> None:
    """The options of everything that runs as a cell on the ranks (``%%wb``, ``%wb run``)."""
    p.add_argument("--ranks", "-r", default=None, help="'all' (default), '0,2' or '0-3'")
    p.add_argument(
        "--timeout",
        "-t",
        type=seconds_option("--timeout"),
        default=None,
        help="seconds before giving up",
    )
    p.add_argument(
        "--show",
        default=None,
        help="the ranks whose output is shown: 'all' (default), '0' or '0-3'",
    )
    p.add_argument("--no-labels", action="store_true", help="do not prefix output with [rank N]")
    p.add_argument("--via-controller", action="store_true", help=via_controller_help)


def split_line(line: str) -> list[str]:
    """The words of a magic's line; ``#`` outside quotes starts a comment, as in a shell
    (``%wb start -n 2  # two local engines``, as the README writes it)."""
    try:
        return shlex.split(line, comments=True)
    except ValueError as exc:  # unbalanced quotes
        raise UsageError(f"could not parse arguments {line!r}: {exc}") from exc


def parse_ranks(text: str | None, world_size: int, option: str = "--ranks") -> list[int] | None:
    """``"0,2"``, ``"0-3"``, ``"all"`` or None -> rank list, validated against world_size.

    Both ends of a range are checked against the world size before it is expanded, so
    ``0-50000000`` is refused at once, with a message of one short line."""
    if text is None or text == "all":
        return None
    last = world_size - 1

    def bad(why: str, valid: str) -> UsageError:
        return UsageError(f"{option} {_cut(text)!r} is not valid: {why}; {valid}")

    usage = f"use 'all', a list like '0,1' or a range like '0-{max(last, 0)}'"
    ranks: set[int] = set()
    for part in text.split(","):
        bounds = [b.strip() for b in part.split("-", 1)]
        # ASCII digits only: int() also reads '١' (an Arabic-Indic one), '1_0' and '+1'
        try:
            if not all(b.isascii() and b.isdigit() for b in bounds):
                raise ValueError(part)
            lo, hi = int(bounds[0]), int(bounds[-1])
        except ValueError:  # (also a number too long for int())
            raise bad(f"{_cut(part.strip())!r} is not a rank or a range", usage) from None
        for rank in (lo, hi):
            if not 0 <= rank < world_size:
                raise bad(
                    f"rank {_cut(str(rank))} is outside this cluster",
                    f"valid ranks are 0..{last} (world size {world_size})",
                )
        if lo > hi:
            raise bad(f"{_cut(part.strip())!r} is an empty range", usage)
        ranks.update(range(lo, hi + 1))
    return sorted(ranks)


def _cut(text: str, limit: int = 40) -> str:
    """User text cut to ``limit`` characters: a message stays one short line."""
    return text if len(text) <= limit else text[:limit] + "..."


def _option(option: str, parse: Callable[[str], Any], check: Callable[[Any], Any]) -> Any:
    """An argparse ``type``: ``parse`` the text, ``check`` the value. A ``ConfigError``
    from either becomes a ``UsageError`` (argparse would turn a ValueError into its own
    vague "invalid value" message)."""

    def convert(text: str) -> Any:
        try:
            return check(parse(text))
        except ConfigError as exc:
            raise UsageError(str(exc)) from None

    return convert


def whole_number(
    option: str, minimum: int, what: str = "a whole number", maximum: int | None = None
) -> Callable[[str], int]:
    """An argparse ``type`` for integer options: bad text or a value out of range is a
    ``UsageError`` naming the option, the text and the valid range (``what`` names the
    quantity in the option's own words, e.g. "a number of engines")."""

    def parse(text: str) -> int | str:
        # ASCII digits only (a minus for the range message): int() also reads '١' (an
        # Arabic-Indic one), '1_0' and ' 2 '; check() refuses text as "not a whole number".
        return int(text) if _ASCII_INTEGER.fullmatch(text) else text

    def check(value: int | str) -> int | None:
        return validate.integer(option, value, minimum=minimum, maximum=maximum, what=what)

    return _option(option, parse, check)  # type: ignore[no-any-return]


def seconds_option(option: str, minimum: float = 0.0) -> Callable[[str], float]:
    """An argparse ``type`` for a timeout or an interval (see ``validate.seconds``):
    ``nan``, ``inf`` and ``-1`` are ``UsageError``s naming the option and the range."""

    def check(value: float) -> float | None:
        return validate.seconds(option, value, minimum=minimum)

    return _option(option, lambda text: validate.parse_number(option, text), check)  # type: ignore[no-any-return]
