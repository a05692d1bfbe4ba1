"""The cluster doctor's cost: ``cluster.doctor()`` (environment + network) on 2 local
ranks, against its 10 s goal, and what gathering the environment adds to a start.

The environment is gathered in the start's first round trip to each engine, so its cost is
the engine-side call itself (``environment_facts``, timed here in this process with torch
imported, as on an engine) next to the start it is part of.

    .venv/bin/python -m benchmarks.doctor_bench [--quick]
"""

from __future__ import annotations

import time
from typing import Any

from benchmarks.common import BenchResult, Row, Target, median

__all__ = ["NAME", "TITLE", "run"]

NAME = "doctor"
TITLE = "Cluster doctor: %wb doctor on 2 ranks, and the environment check's share of a start"
DOCTOR_TARGET = Target("<", 10.0, "< 10 s")
SHARE_TARGET = Target("<", 0.02, "< 2% of the start")
# the planner on the measured links vs an all-reduce measured afterwards, at a size the
# doctor's sweep did not use: the larger of predicted/measured and its inverse
FIT_TARGET = Target("<=", 1.3, "within 30%")
CHECK_BYTES = 4 * 2**20


def _facts_seconds(repeats: int) -> list[float]:
    import torch  # noqa: F401  (on an engine torch is imported before the facts are asked)

    from workbench.engine.doctor_env import environment_facts

    out = []
    for _ in range(repeats):
        started = time.perf_counter()
        environment_facts(["pytest"])
        out.append(time.perf_counter() - started)
    return out


def _prediction_and_measurement(cluster: Any) -> tuple[float, float]:
    """The planner's 4 MiB all-reduce time on ``measured_hardware()``'s intra-host link,
    and the slowest rank's median of the same all-reduce measured now."""
    from workbench.parallel.planning.commbench import allreduce_sweep
    from workbench.planner.comm import all_reduce_time

    link = cluster.measured_hardware().intra
    per_rank = cluster.run(allreduce_sweep, [CHECK_BYTES], iters=5, warmup=1)
    measured = max(rows[0][1] for rows in per_rank)
    return all_reduce_time(CHECK_BYTES, cluster.world_size, link), measured


def run(quick: bool = False) -> BenchResult:
    from workbench.cluster import Cluster

    repeats = 1 if quick else 3
    result = BenchResult(
        NAME,
        TITLE,
        ran=f"Cluster(n=2, backend='gloo') on 127.0.0.1; cluster.doctor() with its defaults, "
        f"{repeats} time(s); environment_facts() {10 * repeats} times in this process",
    )
    cluster = Cluster(n=2, backend="gloo")
    cluster.start_sync()
    try:
        start_s = cluster.timings["total_s"]
        doctor = []
        for _ in range(repeats):
            started = time.perf_counter()
            cluster.doctor()
            doctor.append(time.perf_counter() - started)
        predicted, measured = _prediction_and_measurement(cluster)
    finally:
        cluster.stop_sync()
    facts = median(_facts_seconds(10 * repeats))
    seconds = median(doctor)
    result.rows.append(
        Row(
            metric="cluster.doctor() (env + net), 2 local ranks",
            unit="s",
            workbench=seconds,
            target=DOCTOR_TARGET.describe(),
            met=DOCTOR_TARGET.check(seconds),
            samples=repeats,
            note="no raw tool to compare with: an absolute budget",
        )
    )
    share = facts / start_s
    result.rows.append(
        Row(
            metric="environment facts per engine, as a share of the start",
            unit="s",
            workbench=facts,
            ratio=share,
            target=SHARE_TARGET.describe(),
            met=SHARE_TARGET.check(share),
            samples=10 * repeats,
            note=f"{facts * 1e3:.1f} ms of a {start_s:.2f} s start",
        )
    )
    off = max(predicted / measured, measured / predicted)
    result.rows.append(
        Row.compare(
            "planner all-reduce on the measured link vs measured, 4 MiB",
            "s",
            predicted,
            measured,
            raw_label="measured",
            target=FIT_TARGET,
            ratio=off,
            note="ratio: the larger of predicted/measured and measured/predicted",
        )
    )
    result.details = {
        "doctor_s": doctor,
        "facts_s": facts,
        "start_s": start_s,
        "allreduce_predicted_s": predicted,
        "allreduce_measured_s": measured,
    }
    return result


if __name__ == "__main__":
    from benchmarks.common import run_main

    raise SystemExit(run_main(run))
