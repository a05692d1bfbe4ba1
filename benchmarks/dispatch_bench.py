"""Dispatch latency: a trivial ``%%wb`` cell vs ipyparallel's ``%%px``, and ``cluster.run``
vs ``view.apply_sync``, on the same 2 engines through a real IPython shell.

The workbench adds argument parsing, rank ordering, per-rank output collection and error
aggregation on top of ipyparallel; this measures what that costs per call.

    .venv/bin/python -m benchmarks.dispatch_bench [--quick]
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from benchmarks.common import BenchResult, Row, Target, interleaved, median, quiet_stdout, run_main

__all__ = ["NAME", "TITLE", "run"]

NAME = "dispatch"
TITLE = "Dispatch latency: %%wb vs %%px, cluster.run vs view.apply_sync"
TARGET = Target("<=", 1.2)
CELL = "x = 1"


def _timer(fn: Callable[[], Any]) -> Callable[[], float]:
    def call() -> float:
        with quiet_stdout():
            start = time.perf_counter()
            fn()
            return time.perf_counter() - start

    return call


def _shell() -> Any:
    from IPython.testing.globalipapp import start_ipython

    shell = start_ipython()
    if "WorkbenchMagics" not in shell.magics_manager.registry:
        shell.run_line_magic("load_ext", "workbench")
    return shell


def run(quick: bool = False) -> BenchResult:
    from workbench.cluster import Cluster

    repeats, warmup = (5, 2) if quick else (60, 5)
    shell = _shell()
    magics = shell.magics_manager.registry["WorkbenchMagics"]
    cluster = Cluster(n=2, backend="gloo")
    try:
        cluster.start_sync()  # the magics' current cluster from now on (Cluster.latest())
        if magics.cluster is not cluster:
            raise RuntimeError("the magics do not see the cluster just started")
        client = cluster.client
        view = client[[r.engine_id for r in cluster.ranks]]
        view.block = True
        view.activate(suffix="_bench")  # %%px_bench: ipyparallel's own cell magic, this view
        with quiet_stdout():
            shell.run_cell_magic("px_bench", "", "import os")
        samples = interleaved(
            {
                "%%wb": _timer(lambda: shell.run_cell_magic("wb", "", CELL)),
                "%%px": _timer(lambda: shell.run_cell_magic("px_bench", "", CELL)),
                "cluster.execute": _timer(lambda: cluster.execute(CELL)),
                "view.execute": _timer(lambda: view.execute(CELL, silent=False, block=True)),
                "cluster.run": _timer(lambda: cluster.run(os.getpid)),
                "view.apply_sync": _timer(lambda: view.apply_sync(os.getpid)),
            },
            repeats=repeats,
            warmup=warmup,
        )
        # Correctness of what was timed: both paths reached both engines.
        if sorted(cluster.run(os.getpid)) != sorted(view.apply_sync(os.getpid)):
            raise RuntimeError("cluster.run and view.apply_sync reached different engines")
    finally:
        cluster.stop_sync()
    med = {k: median(v) * 1e3 for k, v in samples.items()}
    result = BenchResult(
        NAME,
        TITLE,
        ran=f"IPython shell with the workbench extension and ipyparallel's %%px (view.activate) "
        f"on the same 2-engine gloo cluster; cell {CELL!r}, function os.getpid; 6 variants "
        f"interleaved, {repeats} calls each after {warmup} warm-up, median",
        details={"median_ms": med},
    )
    pairs = [
        ("trivial cell: %%wb vs %%px", "%%wb", "%%px"),
        ("trivial cell: cluster.execute vs view.execute", "cluster.execute", "view.execute"),
        ("function call: cluster.run vs view.apply_sync", "cluster.run", "view.apply_sync"),
    ]
    for metric, ours, theirs in pairs:
        result.rows.append(
            Row.compare(
                metric,
                "ms",
                med[ours],
                med[theirs],
                raw_label=theirs,
                target=TARGET,
                samples=repeats,
            )
        )
    return result


if __name__ == "__main__":
    raise SystemExit(run_main(run))
