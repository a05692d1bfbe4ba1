"""Argument parsing for the magics: argparse that raises ``UsageError`` instead of exiting."""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from IPython.core.error import UsageError

__all__ = ["HelpShown", "MagicParser", "parse_ranks", "split_line", "whole_number"]


class HelpShown(Exception):
    """``--help`` was given: the help text has been printed, nothing else should run."""


class MagicParser(argparse.ArgumentParser):
    """An ArgumentParser for magics: errors are ``UsageError`` naming the valid choices."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("exit_on_error", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message}\n\n{self.format_usage().strip()}")

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


def split_line(line: str) -> list[str]:
    try:
        return shlex.split(line)
    except ValueError as exc:  # unbalanced quotes
        raise UsageError(f"could not parse arguments {line!r}: {exc}") from exc


def parse_ranks(text: str | None, world_size: int) -> list[int] | None:
    """``"0,2"``, ``"0-3"``, ``"all"`` or None -> rank list, validated against world_size."""
    if text is None or text == "all":
        return None
    ranks: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        try:
            if "-" in part:
                lo, hi = (int(x) for x in part.split("-", 1))
                ranks.update(range(lo, hi + 1))
            else:
                ranks.add(int(part))
        except ValueError:
            raise UsageError(
                f"--ranks {text!r} is not valid; use 'all', a list like '0,1' or a range "
                f"like '0-{max(world_size - 1, 0)}'"
            ) from None
    bad = sorted(r for r in ranks if not 0 <= r < world_size)
    if bad or not ranks:
        raise UsageError(
            f"--ranks {text!r} names rank(s) {bad} outside this cluster; valid ranks are "
            f"0..{world_size - 1} (world size {world_size})"
        )
    return sorted(ranks)


def whole_number(
    option: str, minimum: int, example: int, meaning: str = ""
) -> Callable[[str], int]:
    """An argparse ``type`` for integer options: bad text or a value below ``minimum`` is a
    ``UsageError`` naming the option, the value and the valid range (``meaning`` says it
    in the option's own words)."""

    def convert(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise UsageError(
                f"{option} {text!r} is not a whole number; use e.g. {option} {example}"
            ) from None
        if value < minimum:
            why = meaning or f"it must be >= {minimum}"
            raise UsageError(f"{option} {value} is not valid; {why}")
        return value

    return convert
