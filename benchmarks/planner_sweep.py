"""How fast the planner evaluates configurations (target: 10,000 in under a second).

Sweeps every preset model over GPU counts 1..512, all valid dp×tp×pp layouts, ZeRO 0-3,
three recompute modes and two micro-batch sizes on H100 nodes, and prints the rate. Exits
non-zero only on an error; the rate is for reading, not a pass/fail gate.

    .venv/bin/python benchmarks/planner_sweep.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import time

from workbench.planner import MODELS, TrainingSpec, hardware_preset, sweep


def run_once() -> tuple[int, float]:
    hw = hardware_preset("h100-80gb")
    start = time.perf_counter()
    plans = sweep(
        list(MODELS.values()),
        hw,
        TrainingSpec(seq=4096),
        gpus=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512),
        recompute=("none", "selective", "full"),
        micro_batch=(1, 2),
    )
    return len(plans), time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    best = float("inf")
    count = 0
    for _ in range(args.repeats):
        count, seconds = run_once()
        best = min(best, seconds)
    rate = count / best
    print(f"planner sweep: {count} configurations in {best:.3f} s (best of {args.repeats})")
    print(f"rate: {rate:,.0f} configs/s; 10,000 configs take {10_000 / rate:.3f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
