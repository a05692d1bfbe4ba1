"""Tracing overhead on a 2-rank tensor-parallel step (the TP companion of trace_overhead.py).

Each rank builds three copies of the workbench's own DTensor TP ``TrainStep`` (same model,
same seed) and runs them interleaved in rotating order, like ``trace_overhead.py`` does for
DDP:

* untraced: ``RunSpec(trace=False)``;
* traced: ``RunSpec(trace=True)`` - MemoryTracer + CommTracer (dispatch-level, sees every
  DTensor collective), phase spans and a memory sample at every phase boundary; the
  tracers run only around this variant's step so they never see the other variants;
* profiler / profiler+mem: the untraced step inside ``torch.profiler.profile``.

    .venv/bin/python -m benchmarks.trace_tp [--model gpt-small] [--batch 16] [--repeats N]
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

from benchmarks.trace_overhead import PROFILER_ARGS, VARIANTS

__all__ = ["rank_main", "summarise"]


def rank_main(
    rank: int, world: int, model: str, batch: int, repeats: int, warmup: int
) -> dict[str, Any]:
    """Per-variant (wall, cpu) seconds of one TP training step on this rank."""
    import torch
    import torch.distributed as dist

    from workbench.parallel import RunSpec, build_train_step

    torch.set_num_threads(1)
    steps = {}
    for name in VARIANTS:
        spec = RunSpec(model=model, strategy="tp", batch_size=batch, trace=name == "traced", seed=0)
        steps[name] = build_train_step(spec)
    traced = steps["traced"]
    tracers = [t for t in (traced.memory_tracer, traced.comm_tracer) if t is not None]
    for tracer in tracers:  # started by the builder; run them only around traced steps
        tracer.stop()

    def run(name: str) -> tuple[float, float]:
        dist.barrier()
        step = steps[name]
        if name == "traced":
            for tracer in tracers:
                tracer.start()
            try:
                t0, c0 = time.perf_counter(), time.process_time()
                step.run_step()
                return time.perf_counter() - t0, time.process_time() - c0
            finally:
                for tracer in reversed(tracers):
                    tracer.stop()
        if name == "untraced":
            t0, c0 = time.perf_counter(), time.process_time()
            step.run_step()
            return time.perf_counter() - t0, time.process_time() - c0
        activities = [torch.profiler.ProfilerActivity.CPU]
        with torch.profiler.profile(activities=activities, **PROFILER_ARGS[name]):
            t0, c0 = time.perf_counter(), time.process_time()
            step.run_step()
            return time.perf_counter() - t0, time.process_time() - c0

    order = list(VARIANTS)
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in order}
    for i in range(warmup + repeats):
        shift = i % len(order)
        for name in order[shift:] + order[:shift]:
            elapsed = run(name)
            if i >= warmup:
                times[name].append(elapsed)
    events = traced.recorder.events
    n_comm = sum(1 for e in events if type(e).__name__ == "CommEvent")
    errors = getattr(traced.comm_tracer, "errors", [])
    for step in steps.values():
        step.close()
    return {"times": times, "comm_events": n_comm, "errors": list(errors)}


def summarise(per_rank: list[dict[str, Any]]) -> dict[str, Any]:
    """Median wall/cpu seconds per variant and rank, and each variant's ratio to untraced."""
    import statistics

    out: dict[str, Any] = {"ranks": []}
    for result in per_rank:
        times = result["times"]
        rank: dict[str, Any] = {
            "comm_events": result["comm_events"],
            "errors": result["errors"],
            "samples": len(times["untraced"]),
        }
        for clock, index in (("wall", 0), ("cpu", 1)):
            med = {n: statistics.median(t[index] for t in v) for n, v in times.items()}
            rank[clock] = {"median_s": med, "ratio": {n: med[n] / med["untraced"] for n in med}}
        out["ranks"].append(rank)
    return out


def main(argv: list[str] | None = None) -> int:
    from benchmarks.common import prepare_environment, spawn_ranks

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gpt-small")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=3)
    opts = parser.parse_args(argv)
    prepare_environment()
    os.environ.setdefault("KINETO_LOG_LEVEL", "5")
    per_rank = spawn_ranks(rank_main, (opts.model, opts.batch, opts.repeats, opts.warmup))
    summary = summarise(per_rank)
    print(f"trace overhead: 2-rank DTensor TP step, model={opts.model}, batch={opts.batch}")
    for r, rank in enumerate(summary["ranks"]):
        for clock in ("wall", "cpu"):
            med, ratio = rank[clock]["median_s"], rank[clock]["ratio"]
            cells = " | ".join(f"{n} {med[n] * 1e3:.1f} ms x{ratio[n]:.3f}" for n in VARIANTS)
            print(f"  rank {r} {clock:4}: {cells}")
        print(f"  rank {r}: {rank['comm_events']} comm events, errors {rank['errors']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
