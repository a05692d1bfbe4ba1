"""Long runs at a flat cost (issue 42): kernel and engine RSS, per-step time and
``figures()`` time against steps, for a ``gpt-tiny`` DP stepper on 2 gloo ranks.

    .venv/bin/python -m benchmarks.long_run --steps 100000 --chunk 1000 --fresh 500 \\
        --overhead 200 --out benchmarks/results/issue42/after-100k.json   # the issue's length
    .venv/bin/python -m benchmarks.long_run --plot benchmarks/results/issue42 \\
        before.json after.json                                    # the curves, as a PNG

Every ``--chunk`` steps it records the steps so far, this process's RSS (the kernel's
place), each engine's RSS, the mean seconds per step of the chunk and the seconds one
``stepper.figures()`` takes. It uses only ``Stepper.run`` and ``Stepper.figures``, so the
same file measures main's code (``PYTHONPATH`` at a checkout of main) for the "before"
curve. ``--fresh N`` then times chunks of N steps of the long run against a fresh run on a
second cluster, alternating, so the machine's load weighs on both alike (per-step time flat
with the run's length, read on a shared machine); ``--untraced`` runs it with
``trace=False`` (engines and kernel stay flat there too); ``--overhead N`` times N steps with
tracing on and off, interleaved (``RunSpec.trace``), for the tracing overhead. ``--plot``
needs matplotlib (not a workbench dependency: any Python that has it will do).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["main", "measure", "plot", "write_json"]

TARGETS = {
    "kernel_rss_growth_mib": 50.0,
    "engine_rss_growth_mib": 25.0,
    "last_over_first_step_time": 1.1,
    "figures_s": 0.5,
    "tracing_overhead": 1.02,
}
MIB = 1 << 20


def _engine_rss(cluster: Any) -> list[float]:
    from workbench.trace.storage import process_rss

    return [r / MIB for r in cluster.run(process_rss, timeout=60)]


def _kernel_rss() -> float:
    from workbench.trace.storage import process_rss

    gc.collect()
    return process_rss() / MIB


def _where() -> str:
    """Which workbench a process imports (also on the engines: self-contained, since a
    function of ``__main__`` is shipped by value)."""
    import os

    import workbench

    return os.path.dirname(workbench.__file__)


def _engine_digests() -> int:
    """Signed messages this engine's session remembers (jupyter_client's replay check:
    one per request received, up to ``digest_history_size``, 65,536)."""
    from IPython import get_ipython

    return len(get_ipython().kernel.session.digest_history)


def _where_memory_goes(cluster: Any, stepper: Any) -> dict[str, Any]:
    """What the known per-step growth is made of: the summaries' bytes and the messages
    the kernel's client and each engine's session remember (bounded, see _engine_digests);
    absent on a checkout without them."""
    summaries = getattr(stepper, "summaries", None)
    return {
        "summaries_mib": summaries.nbytes() / MIB if summaries is not None else None,
        "kernel_digests": len(cluster.client.session.digest_history),
        "engine_digests": cluster.run(_engine_digests, timeout=60),
        "client_history": len(cluster.client.history),
    }


def measure(
    steps: int,
    chunk: int,
    overhead: int,
    label: str,
    out: Path | None = None,
    fresh: int = 0,
    trace: bool = True,
) -> dict[str, Any]:
    """The rows, one per ``chunk`` steps; written to ``out`` after each chunk too (a run
    of hours that is stopped keeps what it measured)."""
    from benchmarks.common import prepare_environment

    prepare_environment()
    from workbench.cluster import Cluster
    from workbench.ui.stepper import Stepper

    cluster = Cluster(n=2, backend="gloo")
    rows: list[dict[str, Any]] = []
    try:
        cluster.start_sync()
        where = {"kernel": _where(), "engines": cluster.run(_where, timeout=60)}
        print(f"{label}: workbench from {where}", flush=True)
        stepper = Stepper(
            model="gpt-tiny", strategy="dp", cluster=cluster, batch_size=8, trace=trace
        )
        stepper.run(20)  # warm-up: DDP rebuilds its buckets, allocators settle
        stepper.figures()
        base_kernel, base_engines = _kernel_rss(), _engine_rss(cluster)
        done = 20
        result: dict[str, Any] = {
            "label": label,
            "chunk": chunk,
            "trace": trace,
            "where": where,
            "rows": rows,  # grows below
        }
        print(f"{label}: warm-up done, kernel {base_kernel:.0f} MiB", flush=True)
        while done < steps + 20:
            n = min(chunk, steps + 20 - done)
            start, cpu = time.perf_counter(), time.process_time()
            stepper.run(n)
            per_step = (time.perf_counter() - start) / n
            # The kernel's own CPU per step: what this process's code costs, much less
            # moved by other work on a shared machine than the wall time is.
            kernel_cpu = (time.process_time() - cpu) / n
            done += n
            start = time.perf_counter()
            stepper.figures()
            figures_s = time.perf_counter() - start
            kernel, engines = _kernel_rss(), _engine_rss(cluster)
            rows.append(
                {
                    "steps": done,
                    "step_s": per_step,
                    # the machine's load: a shared machine's wall times are read with it
                    "load_1min": os.getloadavg()[0],
                    "kernel_cpu_s": kernel_cpu,
                    "figures_s": figures_s,
                    "kernel_rss_mib": kernel,
                    "kernel_growth_mib": kernel - base_kernel,
                    "engine_rss_mib": engines,
                    "engine_growth_mib": [
                        e - b for e, b in zip(engines, base_engines, strict=True)
                    ],
                    **_where_memory_goes(cluster, stepper),
                }
            )
            print(
                f"{label}: {done} steps  {per_step * 1e3:.1f} ms/step  kernel CPU "
                f"{kernel_cpu * 1e3:.2f} ms/step  figures "
                f"{figures_s:.2f} s  kernel +{kernel - base_kernel:.1f} MiB  engines "
                + " ".join(f"+{g:.1f}" for g in rows[-1]["engine_growth_mib"])
                + " MiB",
                flush=True,
            )
            write_json(out, result)  # its rows so far
        if fresh:
            result["against_fresh"] = _against_fresh(stepper, fresh)
        if overhead:  # last: it rebuilds the run
            result["overhead"] = _overhead(stepper, overhead)
        return result
    finally:
        cluster.stop_sync()


def _against_fresh(stepper: Any, steps: int, repeats: int = 3) -> dict[str, Any]:
    """Seconds and kernel CPU per step of the long run against a fresh run's (medians of
    ``repeats`` chunks of ``steps``, alternating): a second 2-rank cluster and stepper."""
    from workbench.cluster import Cluster
    from workbench.ui.stepper import Stepper

    other = Cluster(n=2, backend="gloo")
    wall: dict[str, list[float]] = {"long": [], "fresh": []}
    cpu: dict[str, list[float]] = {"long": [], "fresh": []}
    try:
        other.start_sync()
        fresh = Stepper(model="gpt-tiny", strategy="dp", cluster=other, batch_size=8)
        fresh.run(20)  # the same warm-up as the long run's
        for _ in range(repeats):
            for name, run in (("long", stepper), ("fresh", fresh)):
                start, used = time.perf_counter(), time.process_time()
                run.run(steps)
                wall[name].append((time.perf_counter() - start) / steps)
                cpu[name].append((time.process_time() - used) / steps)
        fresh.close()
    finally:
        other.stop_sync()

    def median(xs: list[float]) -> float:
        return sorted(xs)[len(xs) // 2]

    return {
        "steps": steps,
        "long_step_s": median(wall["long"]),
        "fresh_step_s": median(wall["fresh"]),
        "step_ratio": median(wall["long"]) / median(wall["fresh"]),
        "long_kernel_cpu_s": median(cpu["long"]),
        "fresh_kernel_cpu_s": median(cpu["fresh"]),
        "kernel_cpu_ratio": median(cpu["long"]) / median(cpu["fresh"]),
        "load_1min": os.getloadavg()[0],
    }


def _overhead(stepper: Any, steps: int, repeats: int = 3) -> dict[str, Any]:
    """Seconds per step with tracing on and off, interleaved (medians)."""
    times: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(repeats):
        for trace in (True, False):
            stepper.rebuild(trace=trace)
            stepper.run(10)  # warm-up of the fresh run
            start = time.perf_counter()
            stepper.run(steps)
            times[trace].append((time.perf_counter() - start) / steps)
    on, off = sorted(times[True])[repeats // 2], sorted(times[False])[repeats // 2]
    return {"traced_step_s": on, "untraced_step_s": off, "ratio": on / off, "steps": steps}


def summary(result: dict[str, Any]) -> dict[str, Any]:
    """The targets' quantities from one run's rows."""
    rows = result["rows"]
    last = rows[-1]
    out = {
        "steps": last["steps"],
        "kernel_rss_growth_mib": last["kernel_growth_mib"],
        "engine_rss_growth_mib": max(last["engine_growth_mib"]),
        "last_over_first_step_time": last["step_s"] / rows[0]["step_s"],
        "last_over_first_kernel_cpu": last["kernel_cpu_s"] / rows[0]["kernel_cpu_s"],
        "figures_s": max(r["figures_s"] for r in rows),
    }
    if "against_fresh" in result:
        out["long_over_fresh_step_time"] = result["against_fresh"]["step_ratio"]
        out["long_over_fresh_kernel_cpu"] = result["against_fresh"]["kernel_cpu_ratio"]
    if "overhead" in result:
        out["tracing_overhead"] = result["overhead"]["ratio"]
    return out


def plot(directory: Path, files: list[str]) -> Path:
    """Draw every result file's curves into ``directory/long_run.png``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(16, 8))
    panels = [
        ("kernel_growth_mib", "kernel RSS growth (MiB)", TARGETS["kernel_rss_growth_mib"]),
        ("engine_growth_mib", "engine RSS growth, worst rank (MiB)", 25.0),
        ("step_s", "seconds per step (wall, chunk mean)", None),
        ("kernel_cpu_s", "kernel CPU seconds per step (chunk mean)", None),
        ("figures_s", "stepper.figures() (s)", TARGETS["figures_s"]),
        ("load_1min", "machine load, 1-min average (wall times read with it)", None),
    ]
    for index, name in enumerate(files):
        result = json.loads((directory / name).read_text())
        rows = result["rows"]
        x = [r["steps"] for r in rows]
        for ax, (key, title, target) in zip(axes.flat, panels, strict=False):
            if key not in rows[0]:
                continue
            y = [max(r[key]) if isinstance(r[key], list) else r[key] for r in rows]
            ax.plot(x, y, marker="o", markersize=3, label=result["label"], color=f"C{index}")
            ax.set_title(title)
            ax.set_xlabel("steps")
            if target is not None:
                ax.axhline(target, color="red", linestyle="--", linewidth=1)
    for ax in axes.flat[: len(panels)]:
        ax.grid(alpha=0.3)
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=1)  # one legend for every panel
    for ax in axes.flat[len(panels) :]:
        ax.axis("off")
    fig.suptitle("gpt-tiny DP, 2 gloo ranks: cost against run length (red: issue 42 target)")
    fig.tight_layout(rect=(0, 0.04 * (len(files) + 1), 1, 1))
    out = directory / "long_run.png"
    fig.savefig(out, dpi=100)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--chunk", type=int, default=1000)
    parser.add_argument("--overhead", type=int, default=0, help="steps per tracing on/off run")
    parser.add_argument("--fresh", type=int, default=0, help="steps per long/fresh chunk")
    parser.add_argument(
        "--untraced", action="store_true", help="the long run with trace=False (RunSpec.trace)"
    )
    parser.add_argument("--label", default="this checkout")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--plot", type=Path, help="draw the result FILES in this directory")
    parser.add_argument("files", nargs="*")
    args = parser.parse_args(argv)
    if args.plot is not None:
        print(plot(args.plot, args.files))
        return 0
    result = measure(
        args.steps,
        args.chunk,
        args.overhead,
        args.label,
        args.out,
        args.fresh,
        trace=not args.untraced,
    )
    result["summary"] = summary(result)
    result["targets"] = TARGETS
    print(json.dumps(result["summary"], indent=1))
    write_json(args.out, result)
    return 0


def write_json(out: Path | None, result: dict[str, Any]) -> None:
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        partial = out.with_name(out.name + ".part")
        partial.write_text(json.dumps(result, indent=1) + "\n")
        partial.replace(out)  # whole or not at all, also when stopped mid-write


if __name__ == "__main__":
    sys.exit(main())
