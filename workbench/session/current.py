"""Which training session the notebook drives now: the registry the magics ask.

The newest ``Stepper`` makes its session current here. ``%wb restart`` and ``%wb grow``
roll that run back (or resize it) with the cluster. The registry holds a weak reference
and imports nothing heavy: asking it costs nothing in a kernel that never made a stepper
(importing the stepper's module, torch with it, took seconds: issue 31).
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from workbench.session.training import TrainingSession

__all__ = ["current_session", "make_current"]

_current: list[weakref.ref[TrainingSession]] = []


def make_current(session: TrainingSession) -> None:
    """``session`` is the one the notebook drives now (the newest stepper's)."""
    _current[:] = [weakref.ref(session)]


def current_session() -> TrainingSession | None:
    """The current session, or None when none was made current or it is gone."""
    return _current[0]() if _current else None
