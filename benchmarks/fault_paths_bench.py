"""Where the seconds go on each fault path, from the event to the user seeing it.

A profile in the style of ``%wb start --profile-startup``, on one 2-rank gloo cluster driven
through ``cluster.execute`` (what a ``%%wb`` cell calls), a few rounds each:

- *dead rank*: rank 0 waits in a barrier while rank 1 sleeps; rank 1's process is SIGKILLed
  from here. Marks: the kill, the kernel's engine watch reporting the exit to the
  controller, the client seeing the engine leave, the cell returning ``EngineDied``; then
  ``recover_sync()`` to a working all-reduce (recovery, for reference);
- *hang*: the same cell with ``timeout=T`` and nobody killed. Marks: the timeout, the hang
  report built (status files read), the interrupt sent, the interrupt's grace over, the
  cell raising ``CollectiveTimeout``; then ``recover_sync()``;
- *first fault*: a new cluster each round whose first cell's rank 1 kills itself 0.3 s in
  while rank 0 waits in a barrier (what each of the peers benchmark's samples is): from
  the kill (its wall-clock time, written by rank 1 just before) to ``EngineDied``.

The marks come from wrapping the dispatch's own functions in this process (nothing is
changed on the engines). Rows: the seconds from the event to the error, against the
issue's targets (dead rank 0.1 s, hang timeout + 0.5 s). ``PYTHONPATH=DIR`` with another
version's ``workbench`` (``git archive main workbench | tar -x -C DIR``) profiles that one.

    .venv/bin/python -m benchmarks.fault_paths_bench [--quick]
"""

from __future__ import annotations

import functools
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from benchmarks.common import BenchResult, Row, Target, median, run_main

__all__ = ["NAME", "TITLE", "run"]

NAME = "fault_paths"
TITLE = "Fault paths: a dead rank and a hung collective, event to error, step by step"
TIMEOUT_S = 2.0
KILL_AFTER_S = 0.5
DEAD_TARGET = Target("<=", 0.1)  # issue 31: as fast as jupyter-distributed (0.08 s)
HANG_TARGET = Target("<=", 0.5)  # issue 31: the report within 0.5 s after the timeout
CELL = "import time\nif rank == 1:\n    time.sleep(60)\ndist.barrier()"
CHECK = "t = torch.ones(1)\ndist.all_reduce(t)\nassert t.item() == world_size"


class Marks:
    """Named monotonic time stamps, the first of each name kept."""

    def __init__(self) -> None:
        self.at: dict[str, float] = {}

    def mark(self, name: str) -> None:
        self.at.setdefault(name, time.monotonic())

    def after(self, start: str) -> dict[str, float]:
        """Every mark, in seconds after ``start``, in time order."""
        t0 = self.at[start]
        return {k: round(v - t0, 4) for k, v in sorted(self.at.items(), key=lambda kv: kv[1])}


def _wrap(owner: Any, name: str, marks: Marks, before: str, after: str) -> Callable[[], None]:
    """Wrap ``owner.name`` to mark its call and its return; returns the undo."""
    original = getattr(owner, name)

    @functools.wraps(original)
    def timed(*args: Any, **kwargs: Any) -> Any:
        marks.mark(before)
        try:
            return original(*args, **kwargs)
        finally:
            marks.mark(after)

    setattr(owner, name, timed)
    return lambda: setattr(owner, name, original)


def _instrument(marks: Marks) -> list[Callable[[], None]]:
    from workbench.cluster.dispatch import hang
    from workbench.cluster.dispatch import rank_dispatch as dispatch
    from workbench.cluster.lifecycle import engine_watch

    return [
        _wrap(hang, "hang_report", marks, "hang report: reading status", "hang report: built"),
        _wrap(dispatch.RankDispatch, "_give_up", marks, "interrupt: sent", "interrupt: grace over"),
        _wrap(engine_watch.EngineWatch, "_report", marks, "watch: exit seen", "watch: told ctrl"),
        _wrap(dispatch.RankDispatch, "_wait_all", marks, "wait: cell sent", "wait: over"),
        _wrap(dispatch.RankDispatch, "_lost_error", marks, "error: building", "error: built"),
    ]


def _watch_ids(client: Any, engine_id: int, marks: Marks, stop: threading.Event) -> None:
    while not stop.is_set():
        if engine_id not in client.ids:
            marks.mark("client: engine gone")
            return
        time.sleep(0.001)


def _recovered(cluster: Any) -> float:
    """Seconds of ``recover_sync()`` up to a working all-reduce."""
    start = time.monotonic()
    cluster.recover_sync()
    cluster.execute(CHECK, timeout=60)
    return time.monotonic() - start


def _dead_rank(cluster: Any) -> tuple[dict[str, float], float]:
    marks = _killed(cluster)
    return marks, _recovered(cluster)


# The first cell of a fresh cluster, as the peers benchmark runs it: rank 1 kills itself
# 0.3 s in (noting the time first) while rank 0 waits in a barrier.
SELF_KILL = (
    "import os, signal, time\nif rank == 1:\n    time.sleep(0.3)\n"
    "    open({path!r}, 'w').write(repr(time.time()))\n"
    "    os.kill(os.getpid(), signal.SIGKILL)\ndist.barrier()"
)


def _first_faults(rounds: int) -> list[dict[str, float]]:
    """Each round a freshly started cluster whose first cell's rank 1 kills itself:
    seconds from its kill to ``EngineDied`` (wall clock, one host)."""
    from workbench.cluster import Cluster
    from workbench.errors import EngineDied

    samples = []
    for _ in range(rounds):
        with Cluster(2, backend="gloo") as cluster:
            path = os.path.join(str(cluster.engines.run_dir), "killed-at")
            try:
                cluster.execute(SELF_KILL.format(path=path), timeout=60)
                raise RuntimeError("the cell returned without EngineDied")
            except EngineDied:
                died = time.time()
            with open(path) as f:
                killed = float(f.read())
            samples.append({"kill": 0.0, "cell: EngineDied": round(died - killed, 4)})
    return samples


def _killed(cluster: Any) -> dict[str, float]:
    from workbench.errors import EngineDied

    marks = Marks()
    undo = _instrument(marks)
    victim = cluster.ranks[1]
    stop = threading.Event()
    ids = threading.Thread(
        target=_watch_ids, args=(cluster.client, victim.engine_id, marks, stop), daemon=True
    )

    def kill() -> None:
        time.sleep(KILL_AFTER_S)
        marks.mark("kill")
        os.kill(victim.pid, signal.SIGKILL)

    killer = threading.Thread(target=kill, daemon=True)
    try:
        ids.start()
        killer.start()
        try:
            cluster.execute(CELL, timeout=60)
            raise RuntimeError("the cell returned without EngineDied")
        except EngineDied:
            marks.mark("cell: EngineDied")
    finally:
        stop.set()
        for u in undo:
            u()
    return marks.after("kill")


def _hang(cluster: Any) -> tuple[dict[str, float], float]:
    from workbench.errors import CollectiveTimeout

    marks = Marks()
    undo = _instrument(marks)
    try:
        begin = time.monotonic()
        try:
            cluster.execute(CELL, timeout=TIMEOUT_S)
            raise RuntimeError("the cell returned without CollectiveTimeout")
        except CollectiveTimeout:
            marks.mark("cell: CollectiveTimeout")
        marks.at["timeout"] = begin + TIMEOUT_S
    finally:
        for u in undo:
            u()
    return marks.after("timeout"), _recovered(cluster)


def _profile(name: str, samples: list[dict[str, float]]) -> list[str]:
    """One line per mark: its median seconds after the event, over the rounds."""
    names = [k for k in samples[0] if all(k in s for s in samples)]
    lines = [f"{name} (median of {len(samples)}, seconds after the event):"]
    lines += [f"  {median([s[k] for s in samples]):+8.3f}  {k}" for k in names]
    return lines


def _row(metric: str, seconds: float, target: Target, rounds: int) -> Row:
    return Row(
        metric,
        "s",
        seconds,
        target=target.describe(),
        met=target.check(seconds),
        samples=rounds,
    )


def run(quick: bool = False) -> BenchResult:
    from workbench.cluster import Cluster

    rounds = 2 if quick else 5
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    import workbench

    where = os.path.dirname(os.path.dirname(workbench.__file__))
    result = BenchResult(
        NAME, TITLE, ran=f"2 gloo ranks, {rounds} rounds, load avg {load}, workbench from {where}"
    )
    dead: list[dict[str, float]] = []
    hang: list[dict[str, float]] = []
    recovery: dict[str, list[float]] = {"dead": [], "hang": []}
    with Cluster(2, backend="gloo") as cluster:
        cluster.execute(CHECK, timeout=60)
        for _ in range(rounds):
            marks, seconds = _dead_rank(cluster)
            dead.append(marks)
            recovery["dead"].append(seconds)
            marks, seconds = _hang(cluster)
            hang.append(marks)
            recovery["hang"].append(seconds)
    first = _first_faults(rounds)
    died = median([m["cell: EngineDied"] for m in dead])
    died_first = median([m["cell: EngineDied"] for m in first])
    late = median([m["cell: CollectiveTimeout"] for m in hang])
    result.rows += [
        _row("a rank's process killed mid-cell: kill to EngineDied", died, DEAD_TARGET, rounds),
        _row(f"a hang past timeout={TIMEOUT_S}s: timeout to its report", late, HANG_TARGET, rounds),
        _row(
            "a rank killing itself in the first cell after a start: kill to EngineDied",
            died_first,
            DEAD_TARGET,
            rounds,
        ),
    ]
    ends = (
        ("dead rank", dead, "cell: EngineDied"),
        ("hang", hang, "cell: CollectiveTimeout"),
        ("dead rank, first cell after a start", first, "cell: EngineDied"),
    )
    for label, samples, key in ends:
        result.notes.append(f"{label}, each round: {[s[key] for s in samples]} s")
    for kind, values in recovery.items():
        spread = [round(v, 2) for v in values]
        result.notes.append(
            f"recover_sync() to a working all-reduce after the {kind}: "
            f"median {median(values):.2f} s of {spread}"
        )
    result.notes += _profile("dead rank", dead) + _profile("hang", hang)
    result.details = {"dead": dead, "hang": hang, "first": first, "recovery": recovery}
    return result


if __name__ == "__main__":
    raise SystemExit(run_main(run))
