"""argparse converters for numeric flags: finite, in range, one clear message.

A converter raises ``argparse.ArgumentTypeError``; argparse then reports
``argument --flag: <message>``, so the message names the value and the valid range and
the flag name comes from argparse (always the flag the user typed).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

__all__ = ["count", "real"]


def _fmt(x: float) -> str:
    return f"{x:g}" if isinstance(x, float) else str(x)


def count(minimum: int = 1, maximum: int = 10**9) -> Callable[[str], int]:
    """An integer in [minimum, maximum]."""

    def convert(text: str) -> int:
        try:
            value = int(text.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not valid; it must be a whole number from {minimum} to {maximum}"
            ) from None
        if not minimum <= value <= maximum:
            raise argparse.ArgumentTypeError(
                f"{value} is not valid; it must be a whole number from {minimum} to {maximum}"
            )
        return value

    return convert


def real(
    low: float, high: float, *, low_open: bool = False, high_open: bool = False
) -> Callable[[str], float]:
    """A finite number in the interval given by ``low``/``high`` (open ends optional)."""
    left = "(" if low_open else "["
    right = ")" if high_open else "]"
    span = f"a finite number in {left}{_fmt(low)}, {_fmt(high)}{right}"

    def convert(text: str) -> float:
        try:
            value = float(text.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not valid; it must be {span}") from None
        bad = (
            not math.isfinite(value)
            or (value <= low if low_open else value < low)
            or (value >= high if high_open else value > high)
        )
        if bad:
            raise argparse.ArgumentTypeError(f"{text.strip()} is not valid; it must be {span}")
        return value

    return convert
