"""How fast the planner evaluates configurations (target: 10,000 in under a second).

Sweeps every preset model over GPU counts 1..512, all valid dp×tp×pp layouts, ZeRO 0-3,
three recompute modes and two micro-batch sizes on H100 nodes, and prints the rate. Exits
non-zero only on an error; the rate is for reading, not a pass/fail gate.

    .venv/bin/python -m benchmarks.planner_sweep [--quick]
"""

from __future__ import annotations

import time

from benchmarks.common import BenchResult, Row, Target, median, run_main
from workbench.planner import MODELS, TrainingSpec, hardware_preset, sweep

__all__ = ["NAME", "TITLE", "run", "run_once"]

NAME = "planner_sweep"
TITLE = "Planner sweep: configurations evaluated per second"
GPUS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


def run_once(gpus: tuple[int, ...] = GPUS) -> tuple[int, float]:
    """(configurations evaluated, seconds) for one sweep."""
    hw = hardware_preset("h100-80gb")
    start = time.perf_counter()
    plans = sweep(
        list(MODELS.values()),
        hw,
        TrainingSpec(seq=4096),
        gpus=gpus,
        recompute=("none", "selective", "full"),
        micro_batch=(1, 2),
    )
    return len(plans), time.perf_counter() - start


def run(quick: bool = False) -> BenchResult:
    repeats = 1 if quick else 5
    gpus = GPUS[:6] if quick else GPUS
    runs = [run_once(gpus) for _ in range(repeats)]
    count = runs[0][0]
    seconds = median([s for _, s in runs])
    rate = count / seconds
    result = BenchResult(
        NAME,
        TITLE,
        ran=f"sweep(): {len(MODELS)} preset models x GPUs {gpus[0]}..{gpus[-1]} x every "
        f"dp/tp/pp layout x ZeRO 0-3 x 3 recompute x 2 micro-batch on h100-80gb; "
        f"{count:,} configurations, median of {repeats}",
    )
    result.rows.append(
        Row(
            metric="configurations per second",
            unit="configs/s",
            workbench=rate,
            samples=repeats,
            note=f"{count:,} configs in {seconds:.3f} s",
        )
    )
    per_10k = 10_000 / rate
    target = Target("<", 1.0, "10k configs < 1 s")
    result.rows.append(
        Row(
            metric="seconds for 10,000 configurations",
            unit="s",
            workbench=per_10k,
            target=target.describe(),
            met=target.check(per_10k),
            samples=repeats,
            note="no raw tool to compare with: an absolute rate",
        )
    )
    result.details = {"configurations": count, "median_s": seconds, "rate": rate}
    return result


if __name__ == "__main__":
    raise SystemExit(run_main(run))
