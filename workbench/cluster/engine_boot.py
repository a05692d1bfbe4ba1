"""Entry point of a local engine process: ipyparallel's engine, with torch imported meanwhile.

``Cluster`` launches local engines as ``python -P .../workbench/cluster/engine_boot.py
<ipengine args>`` (as a file: importing the ``workbench.cluster`` package would come
first and cost a second). Every engine needs torch before it can take a rank, and
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

__all__ = ["STARTED_ENV", "main", "preload"]

# This process's start (wall clock) for the start-up profile; psutil's process creation
# time is only as exact as the kernel's boot time in /proc/stat (whole seconds).
STARTED_ENV = "WORKBENCH_ENGINE_STARTED"


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


if __name__ == "__main__":
    main()
