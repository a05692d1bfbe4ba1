"""Functions the benchmarks run on engines (shipped by module name, like the workbench's own).

Engines import ``benchmarks`` because ``prepare_environment`` puts the repository root on
``PYTHONPATH`` before any cluster starts.
"""

from __future__ import annotations

from typing import Any

__all__ = ["traced_allreduce_sweep"]


def traced_allreduce_sweep(sizes: list[int], iters: int, warmup: int) -> list[list[Any]]:
    """Run ``allreduce_sweep`` under a CommTracer; the recorded all-reduce CommEvents as
    ``[bytes, seconds, busbw]`` (barriers and warm-up calls included in the events)."""
    import torch.distributed as dist

    from workbench.parallel.commbench import allreduce_sweep
    from workbench.trace import CommTracer, Recorder

    recorder = Recorder(dist.get_rank())
    with CommTracer(recorder):
        allreduce_sweep(sizes, iters=iters, warmup=warmup)
    return [
        [e.bytes, e.duration_s, e.busbw]
        for e in recorder.events
        if type(e).__name__ == "CommEvent" and "all_reduce" in e.op
    ]
