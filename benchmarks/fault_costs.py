"""Costs of the fault machinery, measured side by side on 2 gloo ranks (ratios, not targets).

- out-of-band status thread (``workbench.engine.hang``): all-reduce latency of a small
  tensor with the thread off / on (it rewrites the status file whenever the in-flight record
  changed, at most every 50 ms);
- the engine-level cell tracer (a ``CommTracer`` kept active for ``%%wb`` cells): the same
  all-reduce, and a compute loop of small ops (every op passes the dispatch mode).

Run: .venv/bin/python -m benchmarks.fault_costs
"""

from __future__ import annotations

import statistics
import tempfile
import time
from typing import Any

import torch
import torch.distributed as dist

from workbench.parallel.local import run_local_ranks

REPEATS = 5
ALLREDUCES = 400
OPS = 2000


def _allreduce_us(recorder: Any | None) -> float:
    t = torch.ones(256)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(ALLREDUCES):
        dist.all_reduce(t)
    return (time.perf_counter() - start) / ALLREDUCES * 1e6


def _compute_us() -> float:
    a, b = torch.randn(32, 32), torch.randn(32, 32)
    start = time.perf_counter()
    for _ in range(OPS):
        a = torch.tanh(a @ b) + 0.1
    return (time.perf_counter() - start) / OPS * 1e6


def _measure(rank: int, world: int) -> dict[str, float]:
    from workbench.engine import hang

    results: dict[str, list[float]] = {k: [] for k in ("plain", "monitor", "tracer")}
    compute: dict[str, list[float]] = {"plain": [], "tracer": []}
    run_dir = tempfile.mkdtemp(prefix="wb-bench-")
    for _ in range(REPEATS):
        results["plain"].append(_allreduce_us(None))
        compute["plain"].append(_compute_us())
        hang.start_monitor(run_dir, rank)  # thread + cell tracer
        results["tracer"].append(_allreduce_us(None))
        compute["tracer"].append(_compute_us())
        hang.pause_cell_tracer()  # thread only
        results["monitor"].append(_allreduce_us(None))
        hang.stop_monitor()
    med = {f"allreduce_{k}_us": statistics.median(v) for k, v in results.items()}
    med.update({f"op_{k}_us": statistics.median(v) for k, v in compute.items()})
    return med


def main() -> None:
    torch.set_num_threads(1)
    r0 = run_local_ranks(_measure, timeout=600, start_method="fork")[0]
    for key, value in r0.items():
        print(f"{key:>22}: {value:8.1f}")
    print(
        f"status thread: all-reduce x{r0['allreduce_monitor_us'] / r0['allreduce_plain_us']:.3f}"
        f"; cell tracer: all-reduce x{r0['allreduce_tracer_us'] / r0['allreduce_plain_us']:.3f}"
        f", small op x{r0['op_tracer_us'] / r0['op_plain_us']:.3f}"
    )


if __name__ == "__main__":
    main()
