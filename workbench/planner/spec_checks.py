"""Field checks shared by the planner's specs: each raises ``ConfigError`` naming the field,
the bad value and the valid range (never ``assert``), and ``replace_spec`` re-validates a
changed copy."""

from __future__ import annotations

import math
from dataclasses import fields
from typing import Any

from workbench.errors import ConfigError

__all__ = ["check_float", "check_int", "check_opt_int", "replace_spec"]


def check_int(name: str, value: object, *, minimum: int = 1, maximum: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{name}={value!r} is not valid; it must be an integer >= {minimum}")
    if value < minimum or (maximum is not None and value > maximum):
        upper = f" and <= {maximum}" if maximum is not None else ""
        raise ConfigError(f"{name}={value!r} is not valid; it must be >= {minimum}{upper}")


def check_opt_int(name: str, value: object, *, minimum: int = 1) -> None:
    if value is not None:
        check_int(name, value, minimum=minimum)


def check_float(
    name: str, value: object, *, low: float, high: float | None = None, low_open: bool = True
) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ConfigError(f"{name}={value!r} is not valid; it must be a finite number")
    bad_low = value <= low if low_open else value < low
    if bad_low or (high is not None and value > high):
        lo = f"> {low}" if low_open else f">= {low}"
        hi = f" and <= {high}" if high is not None else ""
        raise ConfigError(f"{name}={value!r} is not valid; it must be {lo}{hi}")


def replace_spec(spec: Any, **changes: Any) -> Any:
    """``dataclasses.replace`` that skips init=False fields and re-validates."""
    values = {f.name: getattr(spec, f.name) for f in fields(spec) if f.init}
    unknown = set(changes) - set(values)
    if unknown:
        raise ConfigError(f"unknown fields {sorted(unknown)}; valid: {sorted(values)}")
    values.update(changes)
    return type(spec)(**values)
