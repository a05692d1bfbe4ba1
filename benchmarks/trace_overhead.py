"""Overhead of the workbench tracers on a 2-rank DDP step, next to torch.profiler's.

Each rank runs three copies of one DDP step side by side, interleaved in rotating order
(so drift and neighbours' load hit all three alike):

* untraced: plain DDP, nothing installed;
* traced:   MemoryTracer + CommTracer started (DDP attached), phase spans and a
            memory sample at every phase boundary (what the workbench stepper does);
* profiler: plain DDP inside an active ``torch.profiler.profile`` (CPU activities);
* profiler+mem: the same with ``record_shapes`` and ``profile_memory``, the settings that
            give the profiler comparable information (sizes and memory).

Only the step itself is timed: tracers and profiler are already running. Prints the
median step times (wall clock, and process CPU time, which is less sensitive to
other load on the machine) and the ratios against the targets (traced <= 1.05 x
untraced and below the profiler's ratio, compared with profiler+mem). Exits non-zero
only on error, never on a missed target.

    .venv/bin/python benchmarks/trace_overhead.py [--model mlp|transformer] [--repeats N]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import socket
import statistics
import sys
import time
import traceback
from typing import Any

TARGET_RATIO = 1.05
VARIANTS = ("untraced", "traced", "profiler", "profiler+mem")
PROFILER_ARGS: dict[str, dict[str, bool]] = {
    "profiler": {},
    "profiler+mem": {"record_shapes": True, "profile_memory": True},
}


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _build(kind: str) -> tuple[Any, Any]:
    """A model and a batch factory; both configurations take >= 50 ms per step here."""
    import torch
    from torch import nn

    if kind == "mlp":  # few large ops: compute- and bandwidth-bound
        width, depth, batch = 1024, 6, 256
        layers: list[nn.Module] = []
        for _ in range(depth):
            layers += [nn.Linear(width, width), nn.GELU()]
        model = nn.Sequential(*layers, nn.Linear(width, 16))

        def batch_fn(gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
            return torch.randn(batch, width, generator=gen), torch.randn(batch, 16, generator=gen)

        return model, batch_fn
    if kind == "transformer":  # many small ops: the worst case for a dispatch-level hook
        dim, heads, depth, seq, batch = 128, 4, 4, 64, 12
        enc = nn.TransformerEncoder(
            nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout=0.0, batch_first=True),
            depth,
            enable_nested_tensor=False,
        )
        model = nn.Sequential(enc, nn.Linear(dim, 16))

        def batch_fn(gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
            x = torch.randn(batch, seq, dim, generator=gen)
            return x, torch.randn(batch, seq, 16, generator=gen)

        return model, batch_fn
    raise ValueError(f"unknown model {kind!r}; valid choices: ['mlp', 'transformer']")


def _rank_main(rank: int, world: int, kind: str, repeats: int, warmup: int) -> dict[str, Any]:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from workbench.trace import CommTracer, MemoryTracer, Recorder

    torch.set_num_threads(1)
    models = {}
    for name in VARIANTS:
        torch.manual_seed(0)
        model, batch_fn = _build(kind)
        ddp = DDP(model)
        opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
        models[name] = (model, ddp, opt)

    rec = Recorder(rank)
    comm = CommTracer(rec)
    comm.attach_ddp(models["traced"][1])
    mem = MemoryTracer(models["traced"][0], models["traced"][2], rec)
    gen = torch.Generator().manual_seed(rank)
    loss_fn = torch.nn.functional.mse_loss

    def plain_step(name: str) -> tuple[float, float]:
        _, ddp, opt = models[name]
        x, y = batch_fn(gen)
        t0, c0 = time.perf_counter(), time.process_time()
        loss = loss_fn(ddp(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return time.perf_counter() - t0, time.process_time() - c0

    def traced_step(step: int) -> tuple[float, float]:
        _, ddp, opt = models["traced"]
        x, y = batch_fn(gen)
        t0, c0 = time.perf_counter(), time.process_time()
        with rec.phase_span("forward", step=step):
            loss = loss_fn(ddp(x), y)
        mem.sample()
        with rec.phase_span("backward"):
            loss.backward()
        mem.sample()
        with rec.phase_span("optimizer"):
            opt.step()
            opt.zero_grad(set_to_none=True)
        mem.sample()
        return time.perf_counter() - t0, time.process_time() - c0

    def run(name: str, step: int) -> tuple[float, float]:
        dist.barrier()
        if name == "untraced":
            return plain_step(name)
        if name == "traced":
            mem.start()
            comm.start()
            try:
                return traced_step(step)
            finally:
                comm.stop()
                mem.stop()
        activities = [torch.profiler.ProfilerActivity.CPU]
        with torch.profiler.profile(activities=activities, **PROFILER_ARGS[name]):
            return plain_step(name)

    order = list(VARIANTS)
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in order}
    for i in range(warmup + repeats):
        shift = i % len(order)
        rotated = order[shift:] + order[:shift]
        for name in rotated:
            elapsed = run(name, i)
            if i >= warmup:
                times[name].append(elapsed)
    n_comm = sum(1 for e in rec.events if type(e).__name__ == "CommEvent")
    return {"times": times, "comm_events": n_comm, "errors": comm.errors}


def _worker(rank: int, world: int, port: int, queue: Any, args: tuple[Any, ...]) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world)
    )
    import torch.distributed as dist

    try:
        dist.init_process_group("gloo", rank=rank, world_size=world)
        queue.put((rank, True, _rank_main(rank, world, *args)))
    except BaseException:
        queue.put((rank, False, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["mlp", "transformer"], default="mlp")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=3)
    opts = parser.parse_args(argv)

    world = 2
    os.environ.setdefault("KINETO_LOG_LEVEL", "5")  # keep the profiler's start/stop lines quiet
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    job = (opts.model, opts.repeats, opts.warmup)
    procs = [ctx.Process(target=_worker, args=(r, world, port, queue, job)) for r in range(world)]
    for p in procs:
        p.start()
    results: dict[int, Any] = {}
    failed = False
    for _ in range(world):
        rank, ok, value = queue.get(timeout=1800)
        if not ok:
            print(f"rank {rank} failed:\n{value}", file=sys.stderr)
            failed = True
        results[rank] = value
    for p in procs:
        p.join()
    if failed:
        return 1

    print(f"trace overhead: 2-rank gloo DDP step, model={opts.model}, repeats={opts.repeats}")
    print("  xR = median(variant) / median(untraced); paired = median of per-repeat ratios")
    for rank in sorted(results):
        times = results[rank]["times"]
        for clock, index in (("wall", 0), ("cpu", 1)):
            med = {name: statistics.median(t[index] for t in v) for name, v in times.items()}
            ratio = {name: med[name] / med["untraced"] for name in med}
            paired = {
                name: statistics.median(
                    t[index] / u[index] for t, u in zip(v, times["untraced"], strict=True)
                )
                for name, v in times.items()
            }
            cells = " | ".join(
                f"{name} {med[name] * 1e3:.1f} ms x{ratio[name]:.3f} (paired x{paired[name]:.3f})"
                for name in VARIANTS[1:]
            )
            print(f"  rank {rank} {clock:4}: untraced {med['untraced'] * 1e3:.1f} ms | {cells}")
            if clock == "wall":
                met = ratio["traced"] <= TARGET_RATIO and ratio["traced"] < ratio["profiler+mem"]
                errors = results[rank]["errors"]
                print(
                    f"  rank {rank} wall: target traced <= x{TARGET_RATIO} and below "
                    f"profiler+mem: {'met' if met else 'MISSED'}; "
                    f"{results[rank]['comm_events']} comm events recorded"
                    + (f"; tracer errors: {errors}" if errors else "")
                )
                if med["untraced"] < 0.05:
                    print("  note: the untraced step took under 50 ms on this machine")
    return 0


if __name__ == "__main__":
    # Runnable as a script from the repository root without installing.
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    raise SystemExit(main())
