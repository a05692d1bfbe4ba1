"""Run every benchmark and write the results table (``make bench``).

    .venv/bin/python -m benchmarks.run_all [--quick] [--only a,b] [--out DIR]

Writes ``DIR/latest.md`` and ``DIR/latest.json`` (default ``benchmarks/results``). Each
benchmark prints what it ran, the medians, the ratio and the target. Exits 1 only when a
benchmark fails with an error (a missed target is reported, not an error), and 2 on bad
arguments.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import sys
import time
import traceback
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks.common import ROOT, BenchResult, prepare_environment, print_result

__all__ = ["BENCHMARKS", "main", "render_markdown", "run_benchmarks"]

# Run order: cheap, cluster-free ones first; the cold-start one (many clusters) last.
BENCHMARKS: dict[str, str] = {
    "planner_sweep": "benchmarks.planner_sweep",
    "plot_update": "benchmarks.plot_update",
    "trace_overhead": "benchmarks.trace_bench",
    "traced_loop": "benchmarks.traced_loop_bench",
    "allreduce": "benchmarks.allreduce_bench",
    "dispatch": "benchmarks.dispatch_bench",
    "debug": "benchmarks.debug_bench",  # a cell ready for breakpoint(); a pdb round trip
    "live_plot": "benchmarks.live_plot_bench",
    "scaling": "benchmarks.scaling_bench",
    "fault_timing": "benchmarks.fault_timing_bench",
    "fault_paths": "benchmarks.fault_paths_bench",
    "recovery_profile": "benchmarks.recovery_profile",
    # the hang autopsy (issue 43): stacks on demand, its time in the error, per-op costs
    "autopsy": "benchmarks.autopsy_bench",
    # torchrun'd gloo jobs' exit: torch's abort at finalization, and process_exit against it
    "gloo_exit_race": "benchmarks.gloo_exit_race",
    # fresh kernels through nbclient: the peers' workbench fault samples, step by step
    "first_fault_profile": "benchmarks.first_fault_profile",
    # fresh workbench kernels: the 2-rank cold start, cell by cell
    "coldstart_profile": "benchmarks.coldstart_profile",
    "doctor": "benchmarks.doctor_bench",
    "cold_start": "benchmarks.cold_start_bench",
    # the 2-node namespace bed (root); skipped with the reason where it cannot be built
    "multinode": "benchmarks.multinode_bench",
    # fresh kernels through nbclient, beside jupyter-distributed / nbdistributed / ipyparallel
    "peers": "benchmarks.peers_bench",
    # fresh kernels: %wb start after an idle spell, the workbench kernel vs the plain one
    "kernel_start": "benchmarks.kernel_start_bench",
    # a kept cluster: %wb attach after a kernel restart; the lease after a SIGKILL (issue 44)
    "keep_attach": "benchmarks.keep_attach_bench",
}


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def _load() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def _machine() -> dict[str, Any]:
    import torch

    try:
        load = list(os.getloadavg())
    except OSError:
        load = []
    return {
        "host": platform.node(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpus": _cpus(),
        "load_avg_1_5_15": [round(x, 2) for x in load],
    }


def run_benchmarks(names: list[str], quick: bool) -> list[BenchResult]:
    results: list[BenchResult] = []
    for name in names:
        load = _load()
        started = time.perf_counter()
        try:
            module = importlib.import_module(BENCHMARKS[name])
            result = module.run(quick)
        except Exception:
            result = BenchResult(name, name, error=traceback.format_exc())
        result.seconds = time.perf_counter() - started
        # Other work on the machine skews every ratio; say how busy it was.
        result.details["load_avg_1min_before_after"] = [load, _load()]
        if load is not None and load > _cpus() * 0.5:
            result.notes.append(
                f"machine busy: 1-min load average {load:.1f} on {_cpus()} cores at the start"
            )
        print_result(result)
        results.append(result)
    return results


def _cell(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        if value == 0:
            return "0"
        if abs(value) >= 1000:
            return f"{value:,.0f}"
        if abs(value) >= 10:
            return f"{value:.1f}"
        return f"{value:.3g}"
    return str(value).replace("|", "\\|")


def render_markdown(report: dict[str, Any]) -> str:
    m = report["machine"]
    lines = [
        "# Benchmark results",
        "",
        f"- date: {report['date']}",
        f"- command: `{report['command']}`" + (" (quick smoke run)" if report["quick"] else ""),
        f"- machine: {m['cpus']} cores, {m['platform']}, Python {m['python']}, torch {m['torch']}",
        f"- load average before / after: {m['load_avg_1_5_15']} / {report['load_after']}",
        f"- total: {report['seconds']:.0f} s",
        "",
        "Medians of repeated, interleaved runs; ratio = workbench / raw tool unless the row "
        "says otherwise. A missed target is reported, not an error.",
        "",
        "| benchmark | metric | workbench | raw | unit | ratio | target | met | n |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for b in report["benchmarks"]:
        if b["error"]:
            first = b["error"].strip().splitlines()[-1]
            lines.append(f"| {b['name']} | ERROR | {_cell(first)} | | | | | | |")
            continue
        for r in b["rows"]:
            raw = f"{_cell(r['raw'])} ({r['raw_label']})" if r["raw"] is not None else "–"
            ratio = f"{r['ratio']:.3f}" if r["ratio"] is not None else "–"
            met = {True: "yes", False: "**no**", None: "–"}[r["met"]]
            lines.append(
                f"| {b['name']} | {_cell(r['metric'])} | {_cell(r['workbench'])} | {raw} | "
                f"{r['unit']} | {ratio} | {_cell(r['target']) or '–'} | {met} | {r['samples']} |"
            )
    for b in report["benchmarks"]:
        table = b.get("details", {}).get("markdown") if not b["error"] else None
        if table:  # a benchmark with its own side-by-side table (e.g. peers)
            load = b.get("details", {}).get("load_avg_1min_before_after")
            lines += ["", f"## {b['name']}: {b['title']}", ""]
            lines += [f"1-minute load average before / after: {load}", "", table]
    lines += ["", "## What each benchmark ran", ""]
    for b in report["benchmarks"]:
        lines.append(f"- **{b['name']}** ({b['title']}, {b['seconds']:.0f} s): {b['ran']}")
        lines += [f"  - {note}" for note in b["notes"]]
        for r in b["rows"]:
            if r["note"]:
                lines.append(f"  - {r['metric']}: {r['note']}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few repeats: a smoke run")
    parser.add_argument("--only", default="", help=f"comma list among {', '.join(BENCHMARKS)}")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    opts = parser.parse_args(argv)
    names = [n.strip() for n in opts.only.split(",") if n.strip()] or list(BENCHMARKS)
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        print(f"unknown benchmark(s) {unknown}; valid: {', '.join(BENCHMARKS)}", file=sys.stderr)
        return 2

    prepare_environment()
    machine = _machine()
    started = time.perf_counter()
    results = run_benchmarks(names, opts.quick)
    leftovers = _reap_children()
    try:
        load_after = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        load_after = []
    report = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": "python -m benchmarks.run_all" + (" " + " ".join(argv or sys.argv[1:])),
        "quick": opts.quick,
        "machine": machine,
        "load_after": load_after,
        "seconds": time.perf_counter() - started,
        "leftover_processes": leftovers,
        "benchmarks": [r.to_dict() for r in results],
    }
    report["command"] = report["command"].strip()
    opts.out.mkdir(parents=True, exist_ok=True)
    (opts.out / "latest.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    (opts.out / "latest.md").write_text(render_markdown(report))
    print(f"wrote {opts.out / 'latest.md'} and {opts.out / 'latest.json'}")
    if leftovers:
        print(f"warning: killed processes left behind by a benchmark: {leftovers}")
    return 1 if any(r.error for r in results) else 0


def _reap_children() -> list[str]:
    """Kill (by pid) any process a benchmark left behind, and say which."""
    import psutil

    me = psutil.Process()
    left = []
    for child in me.children(recursive=True):
        try:
            cmd = " ".join(child.cmdline())
            if "resource_tracker" in cmd:  # multiprocessing's helper; exits with us
                continue
            left.append(f"{child.pid} {cmd[:80]}")
            child.kill()
        except psutil.Error:
            continue
    return left


if __name__ == "__main__":
    raise SystemExit(main())
