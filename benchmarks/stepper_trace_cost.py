"""What tracing costs a small stepper step, part by part, and against another checkout.

The stepper's step time with tracing on and off (``RunSpec.trace``), for a ``gpt-tiny`` DP
run on 2 gloo ranks (about 20 ms a step here, a round trip each: the case where tracing
weighs most), and where the difference goes: the same traced run with its memory samples
left out, with its saved-tensor hooks removed, and with no memory tracer at all (what is
left is the run's own collective and phase events). Modes are interleaved, medians kept;
wall seconds, the kernel's CPU and each engine's CPU per step.

    .venv/bin/python benchmarks/stepper_trace_cost.py --steps 300 --repeats 3
    .venv/bin/python benchmarks/stepper_trace_cost.py --against /path/to/old-checkout \\
        --rounds 2 --out benchmarks/results/issue42/trace-cost.json

``--against DIR`` runs the measurement in child processes, alternating this checkout and
``DIR`` (``PYTHONPATH`` at each; the engines inherit it), so both see the machine alike.
The file imports nothing but ``workbench`` and the standard library: it measures any
checkout that has ``Stepper``. A part a checkout cannot take apart is left out of its
result.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

__all__ = ["main", "measure"]

ROOT = Path(__file__).resolve().parent.parent
MODES = ("untraced", "traced", "no_samples", "no_hooks", "no_memory_tracer")


def _engine_cpu() -> float:
    import time

    return time.process_time()


def _where() -> str:
    import os

    import workbench

    return os.path.dirname(workbench.__file__)


def _take_apart(mode: str) -> bool:
    """On an engine: leave one part of the traced run out (self-contained: shipped by
    value). False when this checkout's run has no such part."""
    from workbench.engine.state import engine_state

    state = engine_state()  # a dict in older checkouts
    run = state.get("run") if isinstance(state, dict) else state.run
    tracer = getattr(run, "memory_tracer", None)
    if mode in ("untraced", "traced"):
        return True
    if tracer is None:
        return False
    if mode == "no_samples":
        tracer.sample = lambda label="": None
    elif mode == "no_hooks":
        tracer.stop()
    elif mode == "no_memory_tracer":
        tracer.stop()
        run.memory_tracer = None
    return True


def _prepare_environment() -> None:
    """Private IPython / Jupyter state and one thread per process (as the benchmarks'
    ``common.prepare_environment``, without putting this checkout on the path)."""
    if "IPYTHONDIR" not in os.environ:
        state = Path(tempfile.mkdtemp(prefix="wb-bench-state-"))
        for key, sub in (
            ("IPYTHONDIR", "ipython"),
            ("JUPYTER_CONFIG_DIR", "jupyter/config"),
            ("JUPYTER_DATA_DIR", "jupyter/data"),
            ("JUPYTER_RUNTIME_DIR", "jupyter/runtime"),
        ):
            os.environ[key] = str(state / sub)
            (state / sub).mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)


def _median(xs: list[float]) -> float:
    return sorted(xs)[len(xs) // 2]


def measure(steps: int, repeats: int, modes: tuple[str, ...] = MODES) -> dict[str, Any]:
    """Per mode: median wall, kernel CPU and mean engine CPU seconds per step over
    ``repeats`` interleaved runs of ``steps`` steps, each on a freshly built run."""
    _prepare_environment()
    from workbench.cluster import Cluster
    from workbench.ui.stepper import Stepper

    cluster = Cluster(n=2, backend="gloo")
    runs: dict[str, list[tuple[float, float, float]]] = {m: [] for m in modes}
    skipped: set[str] = set()
    try:
        cluster.start_sync()
        where = {"kernel": _where(), "engines": cluster.run(_where, timeout=60)}
        stepper = Stepper(model="gpt-tiny", strategy="dp", cluster=cluster, batch_size=8)
        stepper.run(20)  # DDP rebuilds its buckets, allocators settle
        for _ in range(repeats):
            for mode in modes:
                if mode in skipped:
                    continue
                stepper.rebuild(trace=mode != "untraced")
                if not all(cluster.run(_take_apart, mode, timeout=60)):
                    skipped.add(mode)
                    continue
                stepper.run(10)  # the rebuilt run's first steps
                engines = cluster.run(_engine_cpu, timeout=60)
                wall, cpu = time.perf_counter(), time.process_time()
                stepper.run(steps)
                wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
                used = [b - a for a, b in zip(engines, cluster.run(_engine_cpu), strict=True)]
                runs[mode].append((wall / steps, cpu / steps, sum(used) / len(used) / steps))
        stepper.close()
    finally:
        cluster.stop_sync()
    result: dict[str, Any] = {"steps": steps, "repeats": repeats, "where": where, "modes": {}}
    base = _median([r[0] for r in runs[modes[0]]])
    for mode in modes:
        if mode in skipped or not runs[mode]:
            continue
        wall = _median([r[0] for r in runs[mode]])
        result["modes"][mode] = {
            "step_s": wall,
            "ratio": wall / base,
            "kernel_cpu_s": _median([r[1] for r in runs[mode]]),
            "engine_cpu_s": _median([r[2] for r in runs[mode]]),
            "runs_step_s": [r[0] for r in runs[mode]],
        }
    result["load_1min"] = os.getloadavg()[0]
    return result


def _child(checkout: Path, steps: int, repeats: int, modes: tuple[str, ...]) -> dict[str, Any]:
    """``measure`` in a new process that imports ``workbench`` from ``checkout``."""
    env = dict(os.environ, PYTHONPATH=str(checkout))
    done = subprocess.run(
        [
            sys.executable,
            str(Path(__file__).resolve()),
            "--steps",
            str(steps),
            "--repeats",
            str(repeats),
            "--modes",
            ",".join(modes),
            "--json",
        ],
        env=env,
        cwd=tempfile.gettempdir(),  # not a checkout: its workbench would come first
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode:
        raise RuntimeError(f"measuring {checkout} failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _summary(label: str, result: dict[str, Any]) -> str:
    where, load = result["where"]["kernel"], result["load_1min"]
    lines = [f"{label} (workbench from {where}, load {load:.1f})"]
    for mode, m in result["modes"].items():
        lines.append(
            f"  {mode:<17} {m['step_s'] * 1e3:6.2f} ms/step  x{m['ratio']:.3f}  kernel CPU "
            f"{m['kernel_cpu_s'] * 1e3:.2f} ms  engine CPU {m['engine_cpu_s'] * 1e3:.2f} ms"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=300, help="steps per timed run")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved runs per mode")
    parser.add_argument("--against", type=Path, help="another checkout, measured alternately")
    parser.add_argument("--rounds", type=int, default=2, help="alternations with --against")
    parser.add_argument(
        "--modes", default=",".join(MODES), help=f"comma-separated, of {', '.join(MODES)}"
    )
    parser.add_argument("--out", type=Path)
    parser.add_argument("--json", action="store_true", help="print the result as JSON only")
    args = parser.parse_args(argv)
    for name in ("steps", "repeats", "rounds"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} {getattr(args, name)}: at least 1")
    modes = tuple(args.modes.split(","))
    unknown = [m for m in modes if m not in MODES]
    if unknown or modes[0] != "untraced":
        parser.error(
            f"--modes {args.modes!r}: untraced first (the ratios divide by it), then any of "
            + ", ".join(MODES)
        )
    if args.against is not None and not (args.against / "workbench" / "__init__.py").is_file():
        parser.error(f"--against {args.against}: no workbench package there")
    if args.against is None:
        result: dict[str, Any] = measure(args.steps, args.repeats, modes)
        if args.json:
            print(json.dumps(result))
        else:
            print(_summary("this checkout", result))
    else:
        result = {"this": [], "against": [], "against_dir": str(args.against)}
        for _ in range(args.rounds):
            for key, checkout in (("this", ROOT), ("against", args.against)):
                result[key].append(_child(checkout, args.steps, args.repeats, modes))
                print(_summary(key, result[key][-1]), flush=True)
        for key in ("this", "against") if "traced" in modes else ():
            ratios = [r["modes"]["traced"]["ratio"] for r in result[key]]
            print(f"{key}: traced over untraced {', '.join(f'{x:.3f}' for x in ratios)}")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        tmp = args.out.with_suffix(".tmp")
        tmp.write_text(json.dumps(result, indent=1) + "\n")
        tmp.replace(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
