"""A local engine's first and last instants: its entry point (ipyparallel's engine, with
torch imported meanwhile), its start-up facts for the profile, and its fast exit.

``Cluster`` launches local engines as ``python -P .../workbench/engine/boot.py
<ipengine args>`` (as a file: importing the ``workbench`` package and its parents would
come first). Every engine needs torch before it can take a rank, and
``import torch`` is the longest single step of a start (seconds). Here it runs on a
thread from the first instant, while the main thread imports ipyparallel, waits for the
controller's connection file and registers; those waits release the GIL, so the import
fills them. When the kernel then asks the engine for its facts (``engine_info`` imports
torch), the import is done or finishing: Python's import lock makes that call wait for
this thread, never import twice.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

__all__ = ["ENGINE_EXIT_DELAY_S", "STARTED_ENV", "exit_now", "main", "preload", "timed_engine_info"]

# This process's start (wall clock) for the start-up profile; psutil's process creation
# time is only as exact as the kernel's boot time in /proc/stat (whole seconds).
STARTED_ENV = "WORKBENCH_ENGINE_STARTED"
# Long enough for the request's reply to leave the engine (zmq sends from its own thread).
ENGINE_EXIT_DELAY_S = 0.02


def preload() -> None:
    """Import what every rank needs before it can join a process group."""
    try:
        import torch
        import torch.distributed
    except Exception:  # the engine's own call repeats the import and reports the error
        return
    del torch


def main() -> None:
    os.environ[STARTED_ENV] = repr(time.time())
    threading.Thread(target=preload, name="workbench-preload-torch", daemon=True).start()
    from ipyparallel.engine.app import main as engine_main

    engine_main()


def timed_engine_info() -> dict[str, Any]:
    """``engine.engine_info()`` plus this engine's own start-up facts (runs on the engine):
    when its process began (wall clock, seconds since the epoch) and the seconds spent
    importing torch here (0 when it was already imported)."""
    import sys

    from workbench.engine.process_group import engine_info

    had_torch = "torch" in sys.modules
    started = time.perf_counter()
    import torch  # noqa: F401  (engine_info needs it; timed here on its own)

    torch_s = 0.0 if had_torch else time.perf_counter() - started
    info = engine_info()
    created: float | None = None
    booted = os.environ.get(STARTED_ENV)  # set by engine_boot in this process
    if booted is not None:
        created = float(booted)
    else:
        try:
            import psutil

            created = psutil.Process(os.getpid()).create_time()
        except Exception:  # psutil missing or no /proc: the milestone is left out
            created = None
    info["startup"] = {"process_created_wall": created, "torch_import_s": torch_s}
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


if __name__ == "__main__":
    main()
