"""What the hang autopsy (issue 43) costs: stacks on demand, the autopsy in a timeout's
error, and what every collective pays for it.

On one 2-rank gloo cluster:

- *stacks*: ``cluster.stacks()`` while both ranks run a busy loop (target ≤ 0.5 s);
- *timeout*: a cell whose rank 0 waits in an all-reduce that rank 1 never reaches, with
  ``timeout=T``: the seconds from the timeout to ``CollectiveTimeout``, with the autopsy
  and with it replaced by an empty one (interleaved); the difference is what the autopsy
  adds (target ≤ 0.5 s); also the autopsy's own ``seconds``;
- *ledger*: 1-element all-reduces in a cell, with the cell recorder's ledger (one
  ``pwrite`` per collective) and without it, interleaved: the per-collective cost;

and, on spawned gloo ranks without the workbench (``spawn_ranks``), 1-element all-reduces
with torch's flight recorder on (``TORCH_FR_BUFFER_SIZE``, as the engines run) and off.

    .venv/bin/python -m benchmarks.autopsy_bench [--quick]
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from benchmarks.common import BenchResult, Row, Target, interleaved, median, run_main, spawn_ranks

__all__ = ["NAME", "TITLE", "run"]

NAME = "autopsy"
TITLE = "Hang autopsy: stacks on demand, the autopsy's time, per-collective costs"
TIMEOUT_S = 1.0
BUDGET = Target("<=", 0.5, "≤ 0.5 s")
SMALL = Target("<=", 1.05, "≤ 1.05")

HANG = """
t = torch.ones(4)
if rank == 0:
    dist.all_reduce(t)
"""
BUSY = """import time
started = time.time()
while time.time() - started < {seconds}:
    spin = 1
"""


def _allreduces(n: int, ledger: bool) -> str:
    """A cell timing ``n`` 1-element all-reduces; ``ledger=False`` takes the cell
    recorder's ledger away for the loop (and gives it back)."""
    return f"""
import time
from workbench.engine.state import engine_state as _engine_state
_rec = _engine_state().cell_recorder
_kept = _rec.ledger
_rec.ledger = _kept if {ledger} else None
_t = torch.ones(1)
dist.barrier()
_start = time.perf_counter()
for _ in range({n}):
    dist.all_reduce(_t)
_rec.ledger = _kept
(time.perf_counter() - _start) / {n}
"""


def _per_op(cluster: Any, n: int, ledger: bool) -> float:
    out = cluster.execute(_allreduces(n, ledger), timeout=120)
    return max(float(r.execute_result["data"]["text/plain"]) for r in out)


def _stacks_seconds(cluster: Any) -> float:
    cell = threading.Thread(target=cluster.execute, args=(BUSY.format(seconds=3),))
    cell.start()
    try:
        time.sleep(1.0)  # the cell is running on both ranks
        start = time.perf_counter()
        stacks = cluster.stacks()
        seconds = time.perf_counter() - start
        if not all("cell line" in s for s in stacks.values()):
            raise RuntimeError(f"stacks did not show the cell: {stacks}")
        return seconds
    finally:
        cell.join(60)


def _timeout_seconds(cluster: Any, autopsy: bool) -> tuple[float, float]:
    """(timeout -> CollectiveTimeout, the autopsy's own seconds); recovers after."""
    from workbench.cluster.dispatch import autopsy as module
    from workbench.errors import CollectiveTimeout

    real = module.take

    def empty(client: Any, targets: Any, pending: Any, run_dir: Any, **_: Any) -> Any:
        return module.Autopsy(verdict="", culprits=[], ranks={})

    module.take = real if autopsy else empty  # type: ignore[assignment]
    try:
        start = time.perf_counter()
        try:
            cluster.execute(HANG, timeout=TIMEOUT_S)
        except CollectiveTimeout as error:
            seconds = time.perf_counter() - start - TIMEOUT_S
            own = getattr(error.autopsy, "seconds", 0.0)
        else:
            raise RuntimeError("the hang did not time out")
    finally:
        module.take = real  # type: ignore[assignment]
    cluster.recover_sync()
    return seconds, own


def _fr_loop(rank: int, world: int, n: int) -> float:
    """On a spawned rank: seconds per 1-element all-reduce."""
    import torch
    import torch.distributed as dist

    t = torch.ones(1)
    for _ in range(50):
        dist.all_reduce(t)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(n):
        dist.all_reduce(t)
    return (time.perf_counter() - start) / n


def _fr_seconds(n: int, on: bool) -> float:
    saved = os.environ.get("TORCH_FR_BUFFER_SIZE")
    os.environ["TORCH_FR_BUFFER_SIZE"] = "512" if on else "0"
    try:
        return max(spawn_ranks(_fr_loop, (n,), world=2, timeout=300))
    finally:
        if saved is None:
            os.environ.pop("TORCH_FR_BUFFER_SIZE", None)
        else:
            os.environ["TORCH_FR_BUFFER_SIZE"] = saved


def _budget(metric: str, seconds: float, samples: int, note: str = "") -> Row:
    """An absolute budget (seconds against ``BUDGET``), shown in the ratio column."""
    return Row.compare(
        metric,
        "s",
        seconds,
        BUDGET.threshold,
        target=BUDGET,
        raw_label="budget",
        samples=samples,
        ratio=seconds,
        note=note,
    )


def _ratio(metric: str, on: list[float], off: list[float], label: str, note: str = "") -> Row:
    return Row.compare(
        metric,
        "s",
        median(on),
        median(off),
        target=SMALL,
        raw_label=label,
        samples=len(on),
        note=note,
    )


def run(quick: bool = False) -> BenchResult:
    from workbench.cluster import Cluster
    from workbench.engine.hang import Ledger

    repeats = 2 if quick else 5
    n = 500 if quick else 2000
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    result = BenchResult(NAME, TITLE, ran=f"2 gloo ranks, {repeats} rounds, load avg {load}")
    with Cluster(2, backend="gloo") as cluster:
        cluster.execute("1", timeout=60)
        stacks = [_stacks_seconds(cluster) for _ in range(repeats)]
        times = interleaved(
            {
                "with": lambda: _timeout_seconds(cluster, True)[0],
                "without": lambda: _timeout_seconds(cluster, False)[0],
            },
            repeats,
        )
        own = [_timeout_seconds(cluster, True)[1] for _ in range(max(1, repeats // 2))]
        per_op = interleaved(
            {
                "ledger": lambda: _per_op(cluster, n, True),
                "none": lambda: _per_op(cluster, n, False),
            },
            repeats,
            warmup=1,
        )
    fr = interleaved({"on": lambda: _fr_seconds(n, True), "off": lambda: _fr_seconds(n, False)}, 2)
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        ledger = Ledger(folder, 0)
        start = time.perf_counter()
        for _ in range(10_000):
            ledger.begin("all_reduce", 4, 2)
            ledger.end()
        ledger_us = (time.perf_counter() - start) / 10_000 * 1e6
        ledger.close()
    added = median(times["with"]) - median(times["without"])
    result.rows += [
        _budget("cluster.stacks() on 2 busy ranks", median(stacks), repeats),
        _budget(
            f"timeout={TIMEOUT_S:g}s -> CollectiveTimeout: added by the autopsy",
            added,
            repeats,
            f"with {median(times['with']):.3f} s, without {median(times['without']):.3f} s"
            f", the autopsy's own {median(own):.3f} s",
        ),
        _ratio(
            "1-element all_reduce in a cell: with the ledger / without",
            per_op["ledger"],
            per_op["none"],
            "no ledger",
            f"Ledger.begin+end alone: {ledger_us:.1f} µs per collective",
        ),
        _ratio(
            "1-element all_reduce, spawned ranks: flight recorder on / off",
            fr["on"],
            fr["off"],
            "TORCH_FR_BUFFER_SIZE=0",
        ),
    ]
    result.details = {
        "stacks_s": stacks,
        "timeout_s": times,
        "autopsy_own_s": own,
        "per_op_s": per_op,
        "fr_s": fr,
        "ledger_us": ledger_us,
    }
    return result


if __name__ == "__main__":
    raise SystemExit(run_main(run))
