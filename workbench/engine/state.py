"""Per-rank workbench state on an engine.

Each engine keeps its workbench state in its user namespace under ``STATE_KEY`` (one engine
process = one rank, so this is per-rank state, not a global).
"""

from __future__ import annotations

from typing import Any

__all__ = ["STATE_KEY", "engine_state", "user_namespace"]

STATE_KEY = "_wb_state"


def user_namespace() -> dict[str, Any]:
    """The engine's interactive namespace (where ``%%wb`` cells run)."""
    from IPython import get_ipython

    shell = get_ipython()
    if shell is None:  # plain process (tests, torchrun): fall back to this module's dict
        return globals().setdefault("_fallback_ns", {})  # type: ignore[no-any-return]
    return shell.user_ns  # type: ignore[no-any-return]


def engine_state() -> dict[str, Any]:
    """Per-rank workbench state kept in the engine's namespace."""
    return user_namespace().setdefault(STATE_KEY, {})  # type: ignore[no-any-return]
