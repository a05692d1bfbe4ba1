"""The notebook side of the cluster doctor's bed tests: run as the bed's user on the login
node (``bed.drive(cfg, script=DOCTOR_DRIVER)``), like ``driver.py``.

Scenarios (``cfg["scenario"]``), each on ``wb.Cluster(n=4, launcher="ssh", hosts=...)``:

- ``net``: ``cluster.doctor("net")``, ``cluster.measured_hardware()``, the planner's time
  for an all-reduce of ``cfg["size"]`` bytes over the world with that hardware, and the
  same all-reduce measured on the cluster;
- ``slow``: rank ``cfg["victim"]`` joins the CPU cgroup ``cfg["cgroup"]``, then a traced
  training loop runs and the straggler report is read;
- ``start``: only the start (``check_packages`` and ``options`` from ``cfg``): a start
  the environment check refuses reports its error.
"""

from __future__ import annotations

import json
import sys
import textwrap
import time
import traceback
from dataclasses import asdict
from pathlib import Path
from typing import Any

from driver import _mine  # this script's own directory is on sys.path


# ----------------------------------------------------------------- run on the engines
def _timed_all_reduce(size: int, iters: int) -> float:
    """Median seconds of one all-reduce of ``size`` bytes over the world (the ranks lined
    up by a barrier before each, as the doctor's sweep does)."""
    import statistics
    import time

    import torch
    import torch.distributed as dist

    buf = torch.ones(size // 4)
    dist.all_reduce(buf)  # warm-up
    times = []
    for _ in range(iters):
        dist.barrier()
        started = time.perf_counter()
        dist.all_reduce(buf)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def _join_cgroup(group: str) -> int:
    """Move this engine (every thread of it) into the CPU cgroup ``group``."""
    import os
    from pathlib import Path

    Path(group, "cgroup.procs").write_text("0")  # 0: the writing process itself
    return os.getpid()


TRAINING_LOOP = textwrap.dedent(
    """
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(512, 256), torch.randn(512, 1)
    with wb.traced(model, optimizer, seed=0) as t:
        for _ in range(STEPS):
            with t.phase("forward"):
                loss = torch.nn.functional.mse_loss(model(x), y)
            with t.phase("backward"):
                loss.backward()
            optimizer.step(); optimizer.zero_grad(); t.step(loss=loss)
    """
)


# ----------------------------------------------------------------- kernel side
def _net(cluster: Any, cfg: dict[str, Any], out: dict[str, Any]) -> None:
    from workbench.planner.comm import all_reduce_time, group_link

    report = cluster.doctor("net", **cfg.get("net_options", {}))
    out["hosts"] = report.hosts
    out["pairs"] = [asdict(p) for p in report.pairs]
    out["slowest"] = asdict(report.slowest)
    out["slow"] = [[p.a, p.b] for p in report.slow]
    out["summary"] = report.summary()
    out["sweeps"] = report.sweeps
    out["fits"] = {
        k: {"bandwidth": f.bandwidth, "latency": f.latency} for k, f in report.fits.items()
    }
    hw = cluster.measured_hardware()
    size, n = int(cfg["size"]), cluster.world_size
    link = group_link(hw, n)
    out["plan_link"] = {"name": link.name, "bandwidth": link.bandwidth, "latency": link.latency}
    out["predicted_s"] = all_reduce_time(size, n, link)
    # each rank's median, averaged over the ranks (as the doctor's sweep reports a size)
    out["measured_ranks_s"] = cluster.run(_timed_all_reduce, size, int(cfg.get("iters", 10)))
    out["measured_s"] = sum(out["measured_ranks_s"]) / n


def _slow(cluster: Any, cfg: dict[str, Any], out: dict[str, Any]) -> None:
    from workbench.session.traced_log import TraceLog
    from workbench.trace import straggler_summary

    victim = int(cfg["victim"])
    out["victim_host"] = cluster.ranks[victim].host
    out["joined"] = cluster.run(_join_cgroup, cfg["cgroup"], ranks=[victim])
    log = TraceLog(cluster, timeout=300)
    code = f"STEPS = {int(cfg.get('steps', 6))}\n" + TRAINING_LOOP
    results = cluster.execute(code, timeout=300)
    out["errors"] = [f"{r.rank}: {r.ename}: {r.evalue}" for r in results if r.ename is not None]
    report = straggler_summary(log.pull())
    out["straggler"] = {
        "slowest": report.slowest,
        "phase": report.phase,
        "excess_s": report.excess_s,
        "step_s": {str(k): v for k, v in report.step_s.items()},
        "wait_s": {str(k): v for k, v in report.wait_s.items()},
        "summary": report.summary(),
    }


def main(cfg: dict[str, Any], out_path: str) -> None:
    from workbench.cluster import Cluster

    out: dict[str, Any] = {"scenario": cfg["scenario"]}
    cluster = Cluster(
        n=cfg.get("n", 4),
        launcher="ssh",
        hosts=cfg["hosts"],
        backend="gloo",
        launcher_options=cfg.get("options"),
        check_packages=cfg.get("check_packages", ()),
        start_timeout=cfg.get("start_timeout", 180),
        init_timeout=90,
    )
    started = time.perf_counter()
    try:
        cluster.start_sync()
        out["start_s"] = time.perf_counter() - started
        if cfg["scenario"] == "net":
            _net(cluster, cfg, out)
        if cfg["scenario"] == "slow":
            _slow(cluster, cfg, out)
    except Exception as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"
        out["traceback"] = traceback.format_exc()
    finally:
        out["stages"] = list(cluster.startup.stages)
        stopping = time.perf_counter()
        cluster.stop_sync()
        while (left := _mine()) and time.perf_counter() - stopping < 20:
            time.sleep(0.25)
        out["left"] = left
        Path(out_path).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main(json.loads(sys.argv[1]), sys.argv[2])
