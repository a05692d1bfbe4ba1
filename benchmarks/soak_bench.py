"""Soak: many local cluster starts and stops, then many cells on one cluster; the kernel's
file descriptors, threads and memory must stay flat and nothing may be left on disk.

    .venv/bin/python -m benchmarks.soak_bench [--cycles 30] [--cells 200] [--out FILE]

The kernel is this process. After each cycle (start, one cell, stop) and after every 50
cells it records the open fds (``/proc/self/fd``), the thread count and the resident
memory; at the end it lists what appeared on disk in the places a cluster writes (the
IPython profile, the workbench state folder, the temporary folder). The first cycle
warms imports and zmq's context, so growth is measured from the end of the first cycle.
Issue 47's done-when: flat fds/threads/memory, nothing on disk.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

__all__ = ["main", "sample", "soak"]


def sample() -> dict[str, float]:
    import psutil

    me = psutil.Process()
    return {
        "fds": len(os.listdir("/proc/self/fd")),
        "threads": threading.active_count(),
        "os_threads": me.num_threads(),
        "rss_mib": me.memory_info().rss / 2**20,
    }


def _places() -> list[Path]:
    from IPython.paths import get_ipython_dir

    places = [Path(get_ipython_dir()), Path(tempfile.gettempdir())]
    state = os.environ.get("WORKBENCH_STATE_DIR")
    if state:
        places.append(Path(state))
    return places


def _files() -> set[str]:
    found: set[str] = set()
    for place in _places():
        if place == Path(tempfile.gettempdir()):  # only the top level: others work there too
            found |= {str(p) for p in place.glob("*") if _ours(p.name)}
        else:
            found |= {str(p) for p in place.rglob("*")}
    return found


def _ours(name: str) -> bool:
    return name.startswith(("wb-", "workbench", "ipengine", "ipcontroller", "tmp"))


def soak(cycles: int, cells: int) -> dict[str, Any]:
    from workbench.cluster import Cluster

    files_before = _files()
    samples: list[dict[str, Any]] = []
    started = time.monotonic()
    for cycle in range(cycles):
        with Cluster(n=2, backend="gloo") as cluster:
            cluster.execute("x = 1")
        samples.append({"phase": "cycle", "i": cycle + 1, **sample()})
        print(json.dumps(samples[-1]), flush=True)
    cycles_s = time.monotonic() - started
    with Cluster(n=2, backend="gloo") as cluster:
        for i in range(cells):
            live = (lambda chunks: None) if i % 2 else None  # both paths, with and without
            cluster.execute(f"print({i})", on_output=live, direct=i % 4 != 3)
            if (i + 1) % 50 == 0:
                samples.append({"phase": "cells", "i": i + 1, **sample()})
                print(json.dumps(samples[-1]), flush=True)
    samples.append({"phase": "after", "i": 0, **sample()})
    left = sorted(_files() - files_before)
    base = samples[0]
    last = samples[-1]
    growth = {k: round(last[k] - base[k], 1) for k in ("fds", "threads", "os_threads", "rss_mib")}
    return {
        "cycles": cycles,
        "cells": cells,
        "cycles_s": round(cycles_s, 1),
        "samples": samples,
        "growth_since_first_cycle": growth,
        "left_on_disk": left,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=30)
    parser.add_argument("--cells", type=int, default=200)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    report = soak(args.cycles, args.cells)
    text = json.dumps(report, indent=1)
    if args.out is not None:
        args.out.write_text(text + "\n")
    print("growth since the first cycle:", report["growth_since_first_cycle"])
    print("left on disk:", report["left_on_disk"] or "nothing")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
