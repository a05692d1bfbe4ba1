"""Collective bandwidth: all-reduce bus bandwidth through the workbench vs raw torchrun.

Three ways of timing the same fp32 all-reduce sweep (4 KB .. 64 MB) on 2 gloo ranks on
127.0.0.1, interleaved (workbench, raw, tracer, then rotated):

* workbench: ``cluster.run(allreduce_sweep, ...)`` on a workbench ``Cluster``'s engines;
* tracer: the same sweep under a ``CommTracer`` on the engines; bandwidth from its CommEvents;
* raw: ``benchmarks/raw_allreduce.py`` (plain torch.distributed) under ``torchrun``.

Plus the machine's memcpy bandwidth (torch ``copy_`` and numpy ``copyto`` of a large buffer,
one thread) as the physical ceiling: loopback gloo copies every byte several times.

    .venv/bin/python -m benchmarks.allreduce_bench [--quick]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

from benchmarks import engine_side
from benchmarks.common import ROOT, BenchResult, Row, Target, free_port, median, run_main

__all__ = ["NAME", "TITLE", "memcpy_bandwidth", "raw_sweep", "run"]

NAME = "allreduce"
TITLE = "All-reduce bus bandwidth: workbench cluster vs raw torchrun, memcpy ceiling"
TARGET = Target(">=", 0.9)
WORLD = 2


def _size_label(size: int) -> str:
    return f"{size >> 20} MB" if size >= 1 << 20 else f"{size >> 10} KB"


def raw_sweep(sizes: list[int], iters: int, warmup: int, timeout: float = 300.0) -> list:
    """Rank 0's (bytes, median seconds) from plain torch.distributed under torchrun."""
    torchrun = Path(sys.executable).with_name("torchrun")
    cmd = [
        str(torchrun),
        f"--nproc-per-node={WORLD}",
        "--master-addr=127.0.0.1",
        f"--master-port={free_port()}",
        str(ROOT / "benchmarks" / "raw_allreduce.py"),
        "--iters",
        str(iters),
        "--warmup",
        str(warmup),
        "--sizes",
        *map(str, sizes),
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"torchrun failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")][-1]
    return [tuple(s) for s in json.loads(line)["samples"]]


def memcpy_bandwidth(nbytes: int = 256 << 20, repeats: int = 5) -> dict[str, float]:
    """Median bytes/s copied by one thread: torch ``copy_`` and numpy ``copyto``."""
    import numpy as np
    import torch

    src_t, dst_t = torch.ones(nbytes // 4), torch.empty(nbytes // 4)
    src_n, dst_n = np.ones(nbytes // 4, dtype=np.float32), np.empty(nbytes // 4, np.float32)
    out: dict[str, list[float]] = {"torch": [], "numpy": []}
    for _ in range(repeats + 1):  # the first pass faults the pages in
        start = time.perf_counter()
        dst_t.copy_(src_t)
        out["torch"].append(nbytes / (time.perf_counter() - start))
        start = time.perf_counter()
        np.copyto(dst_n, src_n)
        out["numpy"].append(nbytes / (time.perf_counter() - start))
    return {k: median(v[1:]) for k, v in out.items()}


def run(quick: bool = False) -> BenchResult:
    from workbench.cluster import Cluster
    from workbench.parallel.planning.commbench import allreduce_sweep

    top = 1 << 20 if quick else 64 << 20
    sizes = [4096 * 4**k for k in range(12) if 4096 * 4**k <= top]
    iters, warmup, repeats = (3, 1, 1) if quick else (7, 2, 3)
    per_variant: dict[str, dict[int, list[float]]] = {
        v: defaultdict(list) for v in ("workbench", "tracer", "raw")
    }
    cluster = Cluster(n=WORLD, backend="gloo")
    try:
        cluster.start_sync()
        for i in range(repeats):
            order = ["workbench", "tracer", "raw"]
            order = order[i % 3 :] + order[: i % 3]
            for variant in order:
                if variant == "workbench":
                    samples = cluster.run(allreduce_sweep, sizes, iters, warmup, timeout=600)[0]
                elif variant == "raw":
                    samples = raw_sweep(sizes, iters, warmup)
                else:
                    events = cluster.run(
                        engine_side.traced_allreduce_sweep, sizes, iters, warmup, timeout=600
                    )[0]
                    by_size: dict[int, list[float]] = defaultdict(list)
                    for nbytes, seconds, _ in events:
                        by_size[int(nbytes)].append(seconds)
                    samples = [(s, median(t)) for s, t in sorted(by_size.items())]
                for nbytes, seconds in samples:
                    per_variant[variant][int(nbytes)].append(seconds)
    finally:
        cluster.stop_sync()
    memcpy = memcpy_bandwidth(64 << 20 if quick else 256 << 20)

    # busbw = algbw * 2(n-1)/n (nccl-tests); for n=2 the factor is 1.
    factor = 2 * (WORLD - 1) / WORLD
    busbw = {
        v: {s: factor * s / median(ts) / 1e9 for s, ts in d.items()} for v, d in per_variant.items()
    }
    ratios = {s: busbw["workbench"][s] / busbw["raw"][s] for s in sizes}
    big = sizes[-1]
    result = BenchResult(
        NAME,
        TITLE,
        ran=f"fp32 all-reduce on {WORLD} gloo ranks (127.0.0.1, 1 thread each), sizes "
        f"{_size_label(sizes[0])}..{_size_label(big)} x4 steps, {iters} timed calls per size "
        f"(barrier before each) after {warmup} warm-up, median; {repeats} interleaved rounds "
        "of workbench cluster.run(allreduce_sweep) / CommTracer events / raw torchrun script",
    )
    result.rows.append(
        Row.compare(
            f"bus bandwidth at {_size_label(big)}, cluster.run",
            "GB/s",
            busbw["workbench"][big],
            busbw["raw"][big],
            raw_label="torchrun",
            target=TARGET,
            samples=repeats,
        )
    )
    result.rows.append(
        Row.compare(
            f"bus bandwidth at {_size_label(big)}, CommTracer events",
            "GB/s",
            busbw["tracer"][big],
            busbw["raw"][big],
            raw_label="torchrun",
            target=TARGET,
            samples=repeats,
        )
    )
    spread = sorted(ratios.values())
    mid = median(spread)
    result.rows.append(
        Row(
            metric=f"busbw ratio over all {len(sizes)} sizes (median; min..max)",
            unit="x",
            workbench=None,
            ratio=mid,
            target=TARGET.describe(),
            met=TARGET.check(mid),
            samples=repeats,
            note=f"min {spread[0]:.3f} max {spread[-1]:.3f}",
        )
    )
    result.rows.append(
        Row.compare(
            f"bus bandwidth at {_size_label(big)} vs memcpy ceiling",
            "GB/s",
            busbw["workbench"][big],
            memcpy["torch"] / 1e9,
            raw_label="memcpy",
            target=None,
            note=f"torch copy_ {memcpy['torch'] / 1e9:.2f} GB/s, numpy copyto "
            f"{memcpy['numpy'] / 1e9:.2f} GB/s (one thread)",
        )
    )
    result.notes.append(
        "busbw GB/s per size (workbench / tracer / raw): "
        + "; ".join(
            f"{_size_label(s)} {busbw['workbench'][s]:.3f}/{busbw['tracer'][s]:.3f}/"
            f"{busbw['raw'][s]:.3f}"
            for s in sizes
        )
    )
    result.details = {
        "sizes": sizes,
        "busbw_GBps": {v: {str(s): b for s, b in d.items()} for v, d in busbw.items()},
        "memcpy_Bps": memcpy,
    }
    return result


if __name__ == "__main__":
    raise SystemExit(run_main(run))
