"""Checks for user-supplied settings: one message style at every public entry point.

Each check returns the value (normalised: ``int`` stays ``int``, numbers become ``float``)
or raises ``ConfigError`` phrased as

    ``<name>=<value!r> is not valid: <why>; <valid range or choices>``

(``<flag> <text!r> is not valid: ...`` when ``name`` is a command-line flag such as
``--timeout``). Rules shared by every setting: ``bool`` is neither an integer nor a number,
NaN and infinity are never valid, and a timeout is a positive number of seconds no longer
than ``MAX_SECONDS`` (``None`` is how to wait without limit).
"""

from __future__ import annotations

import difflib
import math
import numbers
from collections.abc import Collection, Iterable, Mapping, Set
from typing import Any

from workbench.errors import ConfigError, choices_error

__all__ = [
    "MAX_SECONDS",
    "MIN_REFRESH_S",
    "boolean",
    "choice",
    "integer",
    "invalid",
    "number",
    "option_names",
    "parse_number",
    "rank_list",
    "seconds",
    "shown",
]

# Longer waits than this are not a timeout but a typo; ``None`` means "no limit". (Also
# far below what threading and asyncio accept, so no OverflowError deep inside a wait.)
MAX_SECONDS = 365 * 24 * 3600.0
# Auto-refresh (the dashboard) probes every engine; more often than this would keep them
# busy answering instead of running cells.
MIN_REFRESH_S = 0.5
# A rank list may repeat ranks, but not more than this many times the world size: beyond
# that it is an endless iterable, not a choice of ranks.
MAX_RANK_REPEATS = 64


def invalid(name: str, value: object, why: str, valid: str) -> ConfigError:
    """The standard "bad value, why, what is valid" error."""
    text = f"{name} {shown(value)}" if name.startswith("-") else f"{name}={shown(value)}"
    return ConfigError(f"{text} is not valid: {why}; {valid}")


def shown(value: object, limit: int = 60) -> str:
    """``repr`` of the value, cut short: a message stays one line whatever was passed (a
    list of a million hosts, an int too long for ``repr``)."""
    try:
        text = repr(value)
    except ValueError:  # ints beyond Python's digit limit for str()
        text = f"<{type(value).__name__} too long to show>"
    return text if len(text) <= limit else text[:limit] + "..."


def _range_text(
    kind: str,
    minimum: float | None,
    maximum: float | None,
    open_minimum: bool,
    none_means: str | None,
) -> str:
    bounds = []
    if minimum is not None:
        bounds.append(f"{'>' if open_minimum else '>='} {_num(minimum)}")
    if maximum is not None:
        bounds.append(f"<= {_num(maximum)}")
    text = f"use {kind}" + (f" {' and '.join(bounds)}" if bounds else "")
    return text + (f", or None ({none_means})" if none_means else "")


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(x)


def integer(
    name: str,
    value: object,
    *,
    minimum: int | None = None,
    maximum: int | None = None,
    none_means: str | None = None,
    what: str = "an integer",
) -> int | None:
    """An ``int`` (not ``bool``, not ``1.0``) within ``[minimum, maximum]``; ``None`` only
    when ``none_means`` says what None stands for."""
    valid = _range_text(what, minimum, maximum, False, none_means)
    if value is None and none_means is not None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise invalid(name, value, "not a whole number", valid)
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        raise invalid(name, value, "out of range", valid)
    return int(value)


def number(
    name: str,
    value: object,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    open_minimum: bool = False,
    none_means: str | None = None,
    what: str = "a number",
) -> float | None:
    """A finite real number (not ``bool``) within the bounds; ``open_minimum`` excludes
    ``minimum`` itself (``> 0`` rather than ``>= 0``)."""
    valid = _range_text(what, minimum, maximum, open_minimum, none_means)
    if value is None and none_means is not None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise invalid(name, value, "not a number", valid)
    x = float(value)
    if not math.isfinite(x):
        raise invalid(name, value, "not a finite number", valid)
    too_low = minimum is not None and (x <= minimum if open_minimum else x < minimum)
    if too_low or (maximum is not None and x > maximum):
        raise invalid(name, value, "out of range", valid)
    return x


def seconds(
    name: str, value: object, *, minimum: float = 0.0, none_means: str | None = None
) -> float | None:
    """A timeout or interval: a finite number of seconds > 0 (>= ``minimum`` when that is
    above 0) and <= ``MAX_SECONDS``."""
    return number(
        name,
        value,
        minimum=minimum,
        maximum=MAX_SECONDS,
        open_minimum=minimum == 0,
        none_means=none_means,
        what="a number of seconds",
    )


def boolean(name: str, value: object) -> bool:
    """``True`` or ``False`` exactly: ``"no"``, ``0`` and ``None`` are not switches."""
    if not isinstance(value, bool):
        raise invalid(name, value, "not a bool", "use True or False")
    return value


def choice(name: str, value: object, choices: Collection[str]) -> str:
    """One of ``choices`` (names); anything else, unhashable values included, is the
    standard choices error."""
    if not isinstance(value, str) or value not in choices:
        raise choices_error(
            name, value, sorted(choices) if isinstance(choices, Set | Mapping) else choices
        )
    return value


def option_names(where: str, given: Iterable[str], valid: Iterable[str]) -> None:
    """Every name in ``given`` is one of ``valid``: a mistyped keyword (``micro_batches=4``)
    is a ``ConfigError`` naming the nearest valid name and listing them all, not Python's
    ``TypeError`` from deep inside a constructor."""
    names = sorted(set(valid))
    unknown = [g for g in given if g not in names]
    if not unknown:
        return
    bad = unknown[0]
    near = difflib.get_close_matches(bad, names, n=1, cutoff=0.5)
    hint = f"did you mean {near[0]!r}? " if near else ""
    raise ConfigError(f"{where}: unknown option {bad!r}; {hint}valid options: {', '.join(names)}")


def parse_number(flag: str, text: str) -> float:
    """Command-line text -> float (``nan`` and ``inf`` included: the range checks refuse
    them with the right reason), or the standard error naming the flag and its text."""
    try:
        return float(text)
    except ValueError:
        raise invalid(flag, text, "not a number", "use a number, e.g. 10 or 2.5") from None


def rank_list(ranks: int | Iterable[int], world_size: int) -> list[int]:
    """``ranks`` (one rank or an iterable of them) as a list of ints in
    ``0..world_size-1``, checked while it is read: ``range(10**12)``, or any long or
    endless iterable, fails at its first bad element instead of being built first."""
    valid = range(world_size)

    def refused(why: str) -> ConfigError:
        return invalid("ranks", ranks, why, f"choose from 0..{world_size - 1}")

    items: Iterable[object] = [ranks] if isinstance(ranks, numbers.Integral) else ranks
    try:
        iterator = iter(items)
    except TypeError:
        raise refused("not a rank or a list of ranks") from None
    wanted: list[int] = []
    for r in iterator:
        if isinstance(r, bool) or not isinstance(r, int):
            raise refused(f"{shown(r, 20)} is not a rank number")
        if r not in valid:
            raise refused(f"rank {shown(r, 20)} is outside this cluster")
        wanted.append(r)
        if len(wanted) > MAX_RANK_REPEATS * world_size:
            raise refused(f"it lists more than {len(wanted) - 1} ranks, with repeats")
    if not wanted:
        raise refused("no rank chosen")
    return wanted


def args_by_rank(value: object, world_size: int) -> dict[int, tuple[Any, ...]]:
    """Per-rank arguments (``Cluster.run_each``): a dict of rank -> a tuple (or list) of
    arguments, every rank in ``0..world_size-1``."""
    valid = f"a dict of rank (0..{world_size - 1}) -> a tuple of arguments, e.g. {{0: (1,)}}"
    if not isinstance(value, Mapping) or not value:
        raise invalid("args_by_rank", value, "not a dict of ranks", valid)
    rank_list(list(value), world_size)
    bad = [r for r, a in value.items() if not isinstance(a, tuple | list)]
    if bad:
        raise invalid("args_by_rank", value, f"rank {bad[0]}'s arguments are not a tuple", valid)
    return {int(r): tuple(a) for r, a in value.items()}
