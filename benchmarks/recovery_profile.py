"""Where the seconds of a recovery go (issue 31 item 4), after a dead rank and after a hang.

On one 2-rank gloo cluster (``Cluster(2)``, local, the warm forker), a few rounds each:

- *dead rank*: rank 1 SIGKILLs itself 0.3 s into a cell while rank 0 waits in a barrier
  (what the peers benchmark does), the cell raises ``EngineDied``;
- *hang*: rank 0 waits in a barrier that rank 1 never joins, ``timeout=2``;

then ``recover_sync()`` and an all-reduce, with marks from wrapping recovery's own steps in
this process: unresponsive engines killed, stuck ranks freed, the replacement started and
registered (``new_engines``: the launcher's start, the registration, the facts asked), the
store opened and the group set up on every rank (``regroup``), then the all-reduce.

    .venv/bin/python -m benchmarks.recovery_profile [--quick]
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from benchmarks.common import BenchResult, Row, median, run_main
from benchmarks.fault_paths_bench import Marks

__all__ = ["NAME", "TITLE", "run"]

NAME = "recovery_profile"
TITLE = "Recovery: %wb restart after a dead rank and after a hang, step by step"
DEAD = (
    "import os, signal, time\nif rank == 1:\n    time.sleep(0.3)\n"
    "    os.kill(os.getpid(), signal.SIGKILL)\ndist.barrier()"
)
HANG = "if rank == 0:\n    dist.barrier()"
CHECK = "t = torch.ones(1)\ndist.all_reduce(t)\nassert t.item() == world_size"


def _async_wrap(owner: Any, name: str, marks: Marks, label: str) -> Any:
    """Marks for an async function: its awaited body, first call kept (``Marks``)."""
    original = getattr(owner, name)

    async def timed(*args: Any, **kwargs: Any) -> Any:
        marks.mark(f"{label}: start")
        try:
            return await original(*args, **kwargs)
        finally:
            marks.mark(f"{label}: end")

    setattr(owner, name, timed)
    return lambda: setattr(owner, name, original)


def _instrument_async(marks: Marks) -> list[Any]:
    from workbench.cluster.lifecycle import recovery

    names = {
        "_kill_local": "kill unresponsive",
        "_free_stuck": "free stuck",
        "_start_replacements": "launcher start",
        "new_engines": "replacement registered + facts",
        "open_store": "store opened",
        "regroup": "regroup (store + setup_rank)",
    }
    undo = [_async_wrap(recovery, n, marks, label) for n, label in names.items()]
    undo.append(_async_wrap(recovery, "_interrupt", marks, "interrupt stuck"))
    undo.append(_async_wrap(recovery, "_gather", marks, "gather (first: leaving the group)"))
    return undo


def _recover(cluster: Any, fault: str) -> dict[str, float]:
    from workbench.errors import CollectiveTimeout, EngineDied

    try:
        if fault == "dead":
            cluster.execute(DEAD, timeout=60)
        else:
            cluster.execute(HANG, timeout=2)
        raise RuntimeError(f"the {fault} cell returned without an error")
    except (EngineDied, CollectiveTimeout):
        pass
    marks = Marks()
    undo = _instrument_async(marks)
    stop = threading.Event()
    watch = threading.Thread(target=_watch_ids, args=(cluster, marks, stop), daemon=True)
    try:
        marks.mark("recover_sync")
        watch.start()
        report = cluster.recover_sync()
        marks.mark("recovered")
        stop.set()
        cluster.execute(CHECK, timeout=60)
        marks.mark("all-reduce done")
    finally:
        for u in undo:
            u()
    out = marks.after("recover_sync")
    out["replaced"] = float(len(report.replaced))
    return out


def _watch_ids(cluster: Any, marks: Marks, stop: threading.Event) -> None:
    """Mark when a new engine id shows in the client (the replacement registered)."""
    client = cluster.engines.client_unchecked()
    before = set(client.ids)
    while not stop.is_set():
        if set(client.ids) - before:
            marks.mark("client: new engine id")
            return
        time.sleep(0.002)


def _profile(name: str, samples: list[dict[str, float]]) -> list[str]:
    names = [k for k in samples[0] if all(k in s for s in samples)]
    lines = [f"{name} (median of {len(samples)}, seconds after recover_sync() was called):"]
    lines += [f"  {median([s[k] for s in samples]):+8.3f}  {k}" for k in names]
    return lines


def run(quick: bool = False) -> BenchResult:
    from workbench.cluster import Cluster

    rounds = 2 if quick else 4
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    result = BenchResult(NAME, TITLE, ran=f"2 gloo ranks, {rounds} rounds, load avg {load}")
    samples: dict[str, list[dict[str, float]]] = {"dead": [], "hang": []}
    started = time.monotonic()
    with Cluster(2, backend="gloo") as cluster:
        cluster.execute(CHECK, timeout=60)
        for _ in range(rounds):
            for fault in ("dead", "hang"):
                samples[fault].append(_recover(cluster, fault))
    for fault, marks in samples.items():
        value = median([m["all-reduce done"] for m in marks])
        result.rows.append(
            Row(f"recover_sync() + all-reduce after the {fault} cell", "s", value, samples=rounds)
        )
        result.notes += _profile(fault, marks)
    result.notes.append(f"total {time.monotonic() - started:.0f} s")
    result.details = samples
    return result


if __name__ == "__main__":
    raise SystemExit(run_main(run))
