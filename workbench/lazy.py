"""Package attributes that load their module on first use (PEP 562 ``__getattr__``), and
objects found by import path (``package.module:attr``)."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["import_attr", "lazy_getattr"]


def lazy_getattr(
    package: str, names: Mapping[str, str], namespace: dict[str, Any]
) -> Callable[[str], Any]:
    """A module ``__getattr__`` resolving ``names`` (attribute -> defining module) on first
    access and caching the value in the package's ``namespace``."""

    def __getattr__(name: str) -> Any:
        module = names.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    return __getattr__


def import_attr(module_name: str, attr: str) -> Any:
    """``module_name`` imported, then the dotted ``attr`` followed inside it; ImportError or
    AttributeError say which part is missing."""
    obj: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj
