"""One clock for every rank: wall time in nanoseconds plus a measured per-rank offset.

Ranks on one host share ``time.time_ns()``; across hosts the cluster measures each rank's
offset to rank 0 at start-up and stores it in the ``Clock`` so timelines line up.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

__all__ = ["Clock"]


@dataclass(slots=True)
class Clock:
    """``now()`` returns wall-clock ns corrected by ``offset_ns`` (rank 0's clock minus ours)."""

    offset_ns: int = 0

    def now(self) -> int:
        return time.time_ns() + self.offset_ns
