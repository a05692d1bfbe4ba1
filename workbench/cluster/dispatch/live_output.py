"""Each rank's output while a cell runs, handed to a callback as it arrives.

Both cell paths grow a per-rank text as the engines print: a direct reply the progress
messages of its engine (``DirectReply.partial``), an ipyparallel ``AsyncResult`` its
metadata's ``stdout``/``stderr`` as IOPub arrives. ``LiveWatch.poll`` (called from the
dispatcher's wait loop) passes what is new since the last call to ``on_output`` as one
list of ``(rank, "stdout" | "stderr", text)``, at most every ``interval`` seconds, so a
chatty loop costs the caller at most ten calls a second. Only used when a caller asks
(``on_output``): ``Cluster.execute`` from a script is unchanged.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from workbench.cluster.dispatch.results import reply_metadata
from workbench.cluster.ranks import RankAssignment

__all__ = ["LiveWatch", "OnOutput"]

OnOutput = Callable[[list[tuple[int, str, str]]], None]  # [(rank, stream name, new text)]

_INTERVAL_S = 0.1


def partial_output(future: Any) -> tuple[str, str]:
    """(stdout, stderr) a pending cell has printed so far, on either path."""
    partial = getattr(future, "partial", None)
    if partial is not None:
        return partial()  # type: ignore[no-any-return]
    md = reply_metadata(future)
    return md.get("stdout", "") or "", md.get("stderr", "") or ""


class LiveWatch:
    """Tracks how much of each rank's output was already handed on."""

    def __init__(
        self,
        targets: list[RankAssignment],
        futures: list[Any],
        on_output: OnOutput,
        drain: Callable[[], None] | None = None,
        interval: float = _INTERVAL_S,
    ) -> None:
        self.targets = targets
        self.futures = futures
        self.on_output = on_output
        self.drain = drain  # reads the direct path's progress messages
        self.interval = interval
        self._seen: dict[tuple[int, str], int] = {}
        self._next = time.monotonic() + interval

    def poll(self, *, force: bool = False) -> None:
        """Hand on what is new (at most every ``interval`` seconds unless ``force``)."""
        now = time.monotonic()
        if not force and now < self._next:
            return
        self._next = now + self.interval
        if self.drain is not None:
            self.drain()
        chunks = []
        for r, future in zip(self.targets, self.futures, strict=True):
            for name, text in zip(("stdout", "stderr"), partial_output(future), strict=True):
                seen = self._seen.get((r.rank, name), 0)
                if len(text) > seen:
                    self._seen[(r.rank, name)] = len(text)
                    chunks.append((r.rank, name, text[seen:]))
        if chunks:
            self.on_output(chunks)
