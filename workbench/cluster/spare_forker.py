"""A local cluster's spare forker: a replacement engine forked warm (issue 31 item 4).

After a dead rank, most of a recovery was the replacement engine's start:
``start_engines(1)`` launched a new forking process (``workbench.engine.zygote``), which
imported torch again (~1.8 s of the ~2.2 s on a 2-core machine) before it forked the one
engine. So once a local cluster this kernel owns has started (and again once a recovery
took the spare), a forker is started ahead in the warm-start way (``warm_start.spawn``:
it imports torch, then waits on a pipe for its command line); the replacement's launcher
(launch/fork.py, through launch/warm.py) takes it instead of starting a process, and its
engine is forked at once. Its import runs while the user works, on the cores the cluster's
cells use; it holds ~0.3 GB of memory while it waits.

The spare belongs to its cluster: the cluster's stop ends it by its pid (a forker taken by
a launcher meanwhile is that launcher's process, and ends with the engines). A kernel that
dies closes the pipe, which ends it too.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from workbench.cluster import warm_start

if TYPE_CHECKING:
    from workbench.cluster.engines import EngineSet

__all__ = ["ROLE", "end", "keep_ready"]

log = logging.getLogger("workbench.cluster")

ROLE = "engines"  # the forker's role among the processes started ahead (warm_start.ROLES)


def keep_ready(engines: EngineSet) -> None:
    """Start the spare of ``engines`` where its replacements would be forked locally and
    none waits (the kernel's own, started ahead, serves as well)."""
    if engines.config.launcher != "local" or not engines.owns:
        return
    waiting = warm_start.warm(ROLE)
    if waiting is not None and waiting.alive():
        return
    try:
        engines.spare = warm_start.spawn(ROLE)
    except OSError as exc:  # only a speed-up: a replacement then starts its own forker
        log.warning("no spare forker for replacement engines: %s", exc)


def end(engines: EngineSet) -> None:
    """Stop the spare of ``engines`` if it still waits (not taken by a launcher)."""
    spare, engines.spare = engines.spare, None
    if spare is not None:
        warm_start.discard(spare)
