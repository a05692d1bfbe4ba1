"""What a fault costs: detection, recovery and orphan clean-up, next to an uninterrupted run.

On one 2-engine gloo cluster, a DDP run of ``gpt-tiny`` with a checkpoint every 3 steps:

- *uninterrupted*: 6 steps in a row (the baseline; the first, which builds the run, untimed);
- *interrupted*: the same first 3 steps, then rank 1's engine SIGKILLs itself as its next
  forward starts; the step raises ``EngineDied`` (detection), ``session.recover()`` replaces
  the engine and rolls back to the checkpoint (recovery), and the last 3 steps run again.

Ratios: the interrupted run's wall time over the uninterrupted one (what a fault costs the
run as a whole), detection over one uninterrupted step. Orphans: a script that started a
cluster is SIGKILLed (the kernel dying); the seconds until every process it started is gone,
next to a normal ``stop``.

    .venv/bin/python -m benchmarks.fault_timing_bench [--quick]
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from typing import Any

from benchmarks.common import BenchResult, Row, median, run_main

__all__ = ["NAME", "TITLE", "run"]

NAME = "fault_timing"
TITLE = "Faults: detection, recovery and orphan clean-up vs an uninterrupted run"
STEPS = 6
CHECKPOINT_EVERY = 3


def _die_in_forward() -> None:
    """On an engine: SIGKILL this engine as the next forward phase starts."""
    import os
    import signal

    from workbench.engine.state import engine_state

    def forward(index: int) -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    engine_state().run._forward = forward


def _uninterrupted(cluster: Any, spec: Any) -> tuple[float, float]:
    from workbench.session.training import TrainingSession

    session = TrainingSession(cluster, spec, timeout=120)
    session.step()  # build + warm-up, not timed
    start = time.perf_counter()
    session.run(STEPS - 1)
    elapsed = time.perf_counter() - start
    session.close()
    return elapsed, elapsed / (STEPS - 1)


def _interrupted(cluster: Any, spec: Any) -> dict[str, float]:
    from workbench.errors import EngineDied
    from workbench.session.training import TrainingSession

    with tempfile.TemporaryDirectory(prefix="wb-bench-ckpt-") as root:
        session = TrainingSession(
            cluster, spec, timeout=120, checkpoint_dir=root, checkpoint_every=CHECKPOINT_EVERY
        )
        session.step()  # build + warm-up, not timed
        start = time.perf_counter()
        session.run(CHECKPOINT_EVERY - 1)  # the warm-up step counts: checkpoint at step 3
        cluster.run(_die_in_forward, ranks=[1])
        before = time.perf_counter()
        try:
            session.step()
        except EngineDied:
            pass
        else:
            raise RuntimeError("the killed engine was not reported")
        detected = time.perf_counter() - before
        before = time.perf_counter()
        session.recover()
        recovered = time.perf_counter() - before
        session.run(STEPS - session.step_index)
        elapsed = time.perf_counter() - start
        session.close()
    return {"total": elapsed, "detect": detected, "recover": recovered}


_ORPHAN_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import psutil
    from workbench.cluster import Cluster
    cluster = Cluster(n=2, backend="gloo")
    cluster.start_sync()
    me = psutil.Process()
    pids = [p.pid for p in me.children(recursive=True)]
    print(json.dumps(pids), flush=True)
    sys.stdin.read()  # wait to be killed
    """
)


def _orphans_cleared_s(timeout: float = 60.0) -> float:
    """SIGKILL a process that runs a cluster; seconds until all its processes are gone."""
    import json

    import psutil

    proc = subprocess.Popen(
        [sys.executable, "-c", _ORPHAN_SCRIPT],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        pids = json.loads(proc.stdout.readline())
        procs = []
        for pid in pids:
            try:
                procs.append(psutil.Process(pid))
            except psutil.NoSuchProcess:
                continue
        start = time.perf_counter()
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        deadline = start + timeout
        while time.perf_counter() < deadline:
            running = [p for p in procs if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
            if not running:
                return time.perf_counter() - start
            time.sleep(0.05)
        for p in procs:  # the benchmark never leaves what it started
            try:
                p.kill()
            except psutil.Error:
                continue
        raise RuntimeError(f"processes left {timeout:.0f} s after the kernel was killed")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)


def _stop_s() -> float:
    from workbench.cluster import Cluster

    cluster = Cluster(n=2, backend="gloo")
    cluster.start_sync()
    start = time.perf_counter()
    cluster.stop_sync()
    return time.perf_counter() - start


def run(quick: bool = False) -> BenchResult:
    from workbench.cluster import Cluster
    from workbench.parallel import RunSpec

    repeats = 1 if quick else 3
    spec = RunSpec(model="gpt-tiny", strategy="dp", batch_size=8, trace=False)
    result = BenchResult(
        NAME,
        TITLE,
        ran=f"2 local gloo engines, {spec.model} {spec.strategy} batch {spec.batch_size}, "
        f"checkpoint every {CHECKPOINT_EVERY} steps; {repeats} x (uninterrupted {STEPS} steps, "
        f"then the same {STEPS} steps with rank 1 SIGKILLed in step {CHECKPOINT_EVERY + 1}'s "
        f"forward, recover(), resume), interleaved; then {repeats} x (kernel SIGKILL with a "
        "running cluster; normal stop)",
    )
    plain: list[float] = []
    per_step: list[float] = []
    faults: list[dict[str, float]] = []
    with Cluster(n=2, backend="gloo") as cluster:
        for _ in range(repeats):
            total, step = _uninterrupted(cluster, spec)
            plain.append(total)
            per_step.append(step)
            faults.append(_interrupted(cluster, spec))
    orphans = [_orphans_cleared_s() for _ in range(repeats)]
    stops = [_stop_s() for _ in range(repeats)]
    med_plain, med_step = median(plain), median(per_step)
    med = {k: median([f[k] for f in faults]) for k in ("total", "detect", "recover")}
    result.rows += [
        Row.compare(
            f"{STEPS} steps with one engine killed + recovery vs uninterrupted",
            "s",
            med["total"],
            med_plain,
            raw_label="uninterrupted",
            target=None,
            samples=repeats,
        ),
        Row.compare(
            "death detected (EngineDied raised) vs one uninterrupted step",
            "s",
            med["detect"],
            med_step,
            raw_label="one step",
            target=None,
            samples=repeats,
        ),
        Row.compare(
            "recovery (replace engine, new group, roll back) vs uninterrupted run",
            "s",
            med["recover"],
            med_plain,
            raw_label="uninterrupted",
            target=None,
            samples=repeats,
        ),
        Row.compare(
            "processes gone after the kernel's SIGKILL vs a normal stop",
            "s",
            median(orphans),
            median(stops),
            raw_label="stop",
            target=None,
            samples=repeats,
        ),
    ]
    result.details = {
        "uninterrupted_s": plain,
        "interrupted": faults,
        "orphans_cleared_s": orphans,
        "stop_s": stops,
    }
    return result


if __name__ == "__main__":
    raise SystemExit(run_main(run))
