"""A local engine's first and last instants: its start-up facts for the profile, and its
fast exit.

A local cluster's engines are forked from one process that imported torch for all of them
(``workbench.engine.zygote``); it tells each engine when that process began and when the
engine was forked (``STARTED_ENV``, ``FORKED_ENV``), which ``timed_engine_info`` reports
with the seconds the engine itself still spent importing torch (0 when it was imported
before the fork). ``exit_now`` is how a local engine ends at a stop.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any

__all__ = [
    "ENGINE_EXIT_DELAY_S",
    "FORKED_ENV",
    "STARTED_ENV",
    "exit_now",
    "timed_engine_info",
]

# This process's start (wall clock) for the start-up profile; psutil's process creation
# time is only as exact as the kernel's boot time in /proc/stat (whole seconds).
STARTED_ENV = "WORKBENCH_ENGINE_STARTED"
# When an engine forked from the process that imported torch for it (engine/zygote.py).
FORKED_ENV = "WORKBENCH_ENGINE_FORKED"
# Long enough for the request's reply to leave the engine (zmq sends from its own thread).
ENGINE_EXIT_DELAY_S = 0.02


def timed_engine_info(
    check_packages: Sequence[str] = (), fence_after_s: float = 0.0
) -> dict[str, Any]:
    """``engine.engine_info()`` plus this engine's own start-up facts (runs on the engine):
    when its process began (wall clock, seconds since the epoch) and the seconds spent
    importing torch here (0 when it was already imported); and, in the same round trip,
    the environment the cluster doctor compares across hosts (``doctor_env.py``). With
    ``fence_after_s`` > 0 (an engine on another host) its fence starts (``fencing.py``)."""
    import sys

    from workbench.engine.doctor_env import environment_facts
    from workbench.engine.process_group import engine_info

    had_torch = "torch" in sys.modules
    started = time.perf_counter()
    import torch  # noqa: F401  (engine_info needs it; timed here on its own)

    torch_s = 0.0 if had_torch else time.perf_counter() - started
    info = engine_info()
    created: float | None = None
    booted = os.environ.get(STARTED_ENV)  # set by engine/zygote.py in this process
    if booted is not None:
        created = float(booted)
    else:
        try:
            import psutil

            created = psutil.Process(os.getpid()).create_time()
        except Exception:  # psutil missing or no /proc: the milestone is left out
            created = None
    forked = os.environ.get(FORKED_ENV)
    info["startup"] = {
        "process_created_wall": created,
        "forked_wall": None if forked is None else float(forked),
        "torch_import_s": torch_s,
    }
    info["environment"] = environment_facts(check_packages)
    from workbench.engine import rank_debug

    rank_debug.install()  # breakpoint() stops through the kernel; failed frames are kept
    if fence_after_s > 0:
        from workbench.engine import fencing

        info["fencing"] = fencing.start(fence_after_s)
    return info


def exit_now(delay: float = ENGINE_EXIT_DELAY_S) -> int:
    """Runs on an engine: end this process in ``delay`` seconds, skipping finalisation.

    Returns the pid at once; the caller waits for the process, not for a reply."""
    import os
    import sys
    import threading

    def _exit() -> None:
        for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
            try:
                if stream is not None:
                    stream.flush()
            except Exception:  # a closed or broken stream must not keep the process alive
                continue
        os._exit(0)

    threading.Timer(delay, _exit).start()
    return os.getpid()
