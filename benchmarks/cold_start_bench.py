"""Cold start to a ready process group: workbench ``Cluster`` vs raw ipyparallel + a
hand-written rendezvous, for 2 and 4 engines, interleaved.

"Ready" means every engine has imported torch and joined a gloo process group. The raw
baseline is what a user writes by hand: ``ipp.Cluster(n)``: start, connect a client,
``wait_for_engines``, a free port, then ``init_process_group`` applied on every engine. It
runs twice: with ipyparallel's defaults, and with the controller heartbeat the workbench
uses for a local cluster (``--HeartMonitor.period=100``, 50 allowed misses), so the table
shows both what a user would get and what the workbench's own code costs on top of the
same settings.

    .venv/bin/python -m benchmarks.cold_start_bench [--quick]
"""

from __future__ import annotations

import logging
import time

from benchmarks import engine_side
from benchmarks.common import BenchResult, Row, Target, free_port, interleaved, median, run_main
from workbench.cluster.lifecycle.start_sequence import LOCAL_HEARTBEAT

__all__ = ["NAME", "TITLE", "raw_start", "run", "workbench_start"]

NAME = "cold_start"
TITLE = "Cold start to a ready process group: workbench Cluster vs raw ipyparallel"
TARGET = Target("<=", 1.0)
HEARTBEAT = LOCAL_HEARTBEAT


def workbench_start(n: int) -> float:
    """Seconds from nothing to a ready n-rank gloo group through ``workbench.Cluster``."""
    from workbench.cluster import Cluster

    cluster = Cluster(n=n, backend="gloo")
    try:
        start = time.perf_counter()
        cluster.start_sync()
        elapsed = time.perf_counter() - start
        ranks = sorted(cluster.run(engine_side.process_group_rank))
        if ranks != list(range(n)):
            raise RuntimeError(f"workbench cluster ranks {ranks}, expected 0..{n - 1}")
        return elapsed
    finally:
        cluster.stop_sync()


def raw_start(n: int, *, tuned: bool) -> float:
    """The same with ipyparallel and a hand-written rendezvous (no workbench code)."""
    import ipyparallel as ipp

    kwargs: dict = {"n": n, "log_level": logging.ERROR}
    if tuned:
        kwargs["controller_args"] = list(HEARTBEAT)
    start = time.perf_counter()
    cluster = ipp.Cluster(**kwargs)
    try:
        # start_and_connect_sync() without its progress bar: the same three steps
        cluster.start_cluster_sync()
        client = cluster.connect_client_sync()
        client.wait_for_engines(n, timeout=120, interactive=False)
        port = free_port()
        futures = [
            client[eid].apply_async(engine_side.raw_rendezvous, rank, n, port)
            for rank, eid in enumerate(sorted(client.ids)[:n])
        ]
        ranks = [f.get(timeout=120) for f in futures]
        elapsed = time.perf_counter() - start
        if ranks != list(range(n)):
            raise RuntimeError(f"raw rendezvous ranks {ranks}, expected 0..{n - 1}")
        client[:].apply_sync(engine_side.raw_teardown)
        client.close()
        return elapsed
    finally:
        cluster.stop_cluster_sync()


def run(quick: bool = False) -> BenchResult:
    sizes, repeats = ((2,), 1) if quick else ((2, 4), 3)
    result = BenchResult(
        NAME,
        TITLE,
        ran=f"local engines on 127.0.0.1, gloo; for n in {list(sizes)}: workbench Cluster(n)"
        f".start_sync() vs ipp.Cluster(n) + wait_for_engines + init_process_group applied "
        f"on every engine (defaults, and with the workbench's heartbeat), interleaved in "
        f"rotating order, {repeats} starts each; every cluster stopped after its start",
    )
    for n in sizes:
        samples = interleaved(
            {
                "workbench": lambda n=n: workbench_start(n),
                "raw": lambda n=n: raw_start(n, tuned=False),
                "raw-heartbeat": lambda n=n: raw_start(n, tuned=True),
            },
            repeats=repeats,
        )
        med = {k: median(v) for k, v in samples.items()}
        result.details[f"n={n}"] = samples
        result.rows.append(
            Row.compare(
                f"{n} engines: workbench vs raw ipyparallel (defaults)",
                "s",
                med["workbench"],
                med["raw"],
                raw_label="raw",
                target=TARGET,
                samples=repeats,
            )
        )
        result.rows.append(
            Row.compare(
                f"{n} engines: workbench vs raw with the same heartbeat",
                "s",
                med["workbench"],
                med["raw-heartbeat"],
                raw_label="raw+hb",
                target=TARGET,
                samples=repeats,
            )
        )
    return result


if __name__ == "__main__":
    raise SystemExit(run_main(run))
