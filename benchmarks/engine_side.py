"""Functions the benchmarks run on engines (shipped by module name, like the workbench's own).

Engines import ``benchmarks`` because ``prepare_environment`` puts the repository root on
``PYTHONPATH`` before any cluster starts.
"""

from __future__ import annotations

from typing import Any

__all__ = ["process_group_rank", "raw_rendezvous", "raw_teardown", "traced_allreduce_sweep"]


def traced_allreduce_sweep(sizes: list[int], iters: int, warmup: int) -> list[list[Any]]:
    """Run ``allreduce_sweep`` under a CommTracer; the recorded all-reduce CommEvents as
    ``[bytes, seconds, busbw]`` (barriers and warm-up calls included in the events)."""
    import torch.distributed as dist

    from workbench.parallel.planning.commbench import allreduce_sweep
    from workbench.trace import CommTracer, Recorder

    recorder = Recorder(dist.get_rank())
    with CommTracer(recorder):
        allreduce_sweep(sizes, iters=iters, warmup=warmup)
    return [
        [e.bytes, e.duration_s, e.busbw]
        for e in recorder.events
        if type(e).__name__ == "CommEvent" and "all_reduce" in e.op
    ]


def process_group_rank() -> int:
    """This engine's rank in the default process group (checks the group is ready)."""
    import torch.distributed as dist

    return dist.get_rank()


def raw_rendezvous(rank: int, world: int, port: int) -> int:
    """The hand-written rendezvous of the cold-start baseline: import torch, join gloo."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=120),
    )
    return dist.get_rank()


def raw_teardown() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
