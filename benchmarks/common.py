"""What every benchmark shares: result rows with ratios and targets, medians, rank spawning.

A benchmark module exposes ``NAME``, ``TITLE`` and ``run(quick: bool) -> BenchResult``;
``run_all`` collects the results into one table. Timings are only ever reported as medians
of repeated, interleaved runs and as ratios against the raw tool measured in the same run:
the machines are noisy, so a single absolute time means little.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "ROOT",
    "BenchResult",
    "Row",
    "Target",
    "format_row",
    "free_port",
    "interleaved",
    "median",
    "prepare_environment",
    "print_result",
    "quiet_stdout",
    "run_main",
    "spawn_ranks",
    "timed",
]

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True, slots=True)
class Target:
    """``ratio <op> threshold``, e.g. ``Target("<=", 1.2)``; ``text`` is shown in the table."""

    op: str
    threshold: float
    text: str = ""

    def check(self, value: float | None) -> bool | None:
        if value is None:
            return None
        if self.op == "<=":
            return value <= self.threshold
        if self.op == "<":
            return value < self.threshold
        if self.op == ">=":
            return value >= self.threshold
        if self.op == ">":
            return value > self.threshold
        raise ValueError(f"unknown target operator {self.op!r}; valid: <=, <, >=, >")

    def describe(self) -> str:
        return self.text or f"{self.op} {self.threshold:g}"


@dataclass(slots=True)
class Row:
    """One line of the results table: the workbench's median next to the raw tool's."""

    metric: str
    unit: str
    workbench: float | None
    raw: float | None = None
    raw_label: str = ""
    ratio: float | None = None  # workbench / raw unless the metric says otherwise
    target: str = ""
    met: bool | None = None
    samples: int = 0
    note: str = ""

    @classmethod
    def compare(
        cls,
        metric: str,
        unit: str,
        workbench: float,
        raw: float,
        *,
        target: Target | None,
        raw_label: str = "raw",
        samples: int = 0,
        note: str = "",
        ratio: float | None = None,
    ) -> Row:
        value = ratio if ratio is not None else (workbench / raw if raw else None)
        return cls(
            metric=metric,
            unit=unit,
            workbench=workbench,
            raw=raw,
            raw_label=raw_label,
            ratio=value,
            target=target.describe() if target else "",
            met=target.check(value) if target else None,
            samples=samples,
            note=note,
        )


@dataclass(slots=True)
class BenchResult:
    name: str
    title: str
    ran: str = ""
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "title": self.title,
            "ran": self.ran,
            "rows": [asdict(r) for r in self.rows],
            "notes": list(self.notes),
            "details": self.details,
            "error": self.error,
            "seconds": self.seconds,
        }


def median(values: Sequence[float]) -> float:
    if not values:
        raise ValueError("median of no samples")
    return float(statistics.median(values))


def median_interval(
    values: Sequence[float], confidence: float = 0.9, resamples: int = 1000
) -> tuple[float, float]:
    """A bootstrap interval of the median of ``values`` (percentile method, a fixed seed so
    a report is reproducible from its samples): the median of ``confidence`` of the
    resamples lies inside it."""
    import random

    if not values:
        raise ValueError("median interval of no samples")
    if not 0 < confidence < 1:  # NaN fails too
        raise ValueError(f"confidence {confidence!r} must lie strictly between 0 and 1")
    rng = random.Random(0)
    n = len(values)
    medians = sorted(statistics.median(rng.choices(values, k=n)) for _ in range(resamples))
    tail = (1 - confidence) / 2
    low = medians[round(tail * (resamples - 1))]
    high = medians[round((1 - tail) * (resamples - 1))]
    return float(low), float(high)


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def interleaved(
    variants: dict[str, Callable[[], float]], repeats: int, warmup: int = 0
) -> dict[str, list[float]]:
    """Run each variant ``warmup + repeats`` times as A,B,C,B,C,A,... (rotating order) so
    drift and other load on the machine hit every variant alike; each call returns the
    seconds it measured. Returns the kept samples per variant."""
    names = list(variants)
    samples: dict[str, list[float]] = {n: [] for n in names}
    for i in range(warmup + repeats):
        shift = i % len(names)
        for name in names[shift:] + names[:shift]:
            seconds = variants[name]()
            if i >= warmup:
                samples[name].append(seconds)
    return samples


def free_port() -> int:
    # Imported here: workbench.parallel loads torch, which must wait for
    # prepare_environment() to set the environment it reads at import.
    from workbench.parallel.local import free_port as _free_port

    return _free_port()


def prepare_environment() -> None:
    """Private IPython/Jupyter state (never the user's ~/.ipython), one thread per process,
    and the repository importable by engines and spawned ranks (they unpickle functions
    from ``benchmarks.*`` by module name)."""
    if "IPYTHONDIR" not in os.environ:
        state = Path(tempfile.mkdtemp(prefix="wb-bench-state-"))
        os.environ["IPYTHONDIR"] = str(state / "ipython")
        os.environ["JUPYTER_CONFIG_DIR"] = str(state / "jupyter" / "config")
        os.environ["JUPYTER_DATA_DIR"] = str(state / "jupyter" / "data")
        os.environ["JUPYTER_RUNTIME_DIR"] = str(state / "jupyter" / "runtime")
    for key in ("IPYTHONDIR", "JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR"):
        if os.environ.get(key):  # IPython falls back to a temp dir (and warns) if missing
            Path(os.environ[key]).mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("KINETO_LOG_LEVEL", "5")
    path = os.environ.get("PYTHONPATH", "")
    if str(ROOT) not in path.split(os.pathsep):
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), path) if p)
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    import torch

    torch.set_num_threads(1)


def spawn_ranks(
    fn: Callable[..., Any],
    args: tuple = (),
    world: int = 2,
    timeout: float = 900.0,
    quiet: bool = True,
) -> list[Any]:
    """Run ``fn(rank, world, *args)`` on ``world`` spawned gloo ranks; results in rank order.

    ``fn`` must be importable by module name. Raises ``ParallelError`` with every failing
    rank's traceback; always joins (or kills) the processes it started.
    """
    from workbench.parallel.local import run_local_ranks

    return run_local_ranks(fn, *args, world_size=world, timeout=timeout, quiet=quiet)


@contextmanager
def quiet_stdout() -> Iterator[None]:
    """Swallow output printed by the code under test (e.g. a magic's result lines)."""
    import io
    from contextlib import redirect_stdout

    with redirect_stdout(io.StringIO()):
        yield


def _fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if unit in ("configs/s", "B"):
        return f"{value:,.0f}"
    if abs(value) >= 100:
        return f"{value:.1f}"
    if abs(value) >= 1:
        return f"{value:.3g}" if abs(value) < 10 else f"{value:.2f}"
    return f"{value:.3g}"


def format_row(row: Row) -> str:
    met = {True: "met", False: "MISSED", None: "-"}[row.met]
    raw = f"{row.raw_label} {_fmt(row.raw, row.unit)}" if row.raw is not None else ""
    ratio = f"x{row.ratio:.3f}" if row.ratio is not None else "-"
    line = (
        f"  {row.metric}: workbench {_fmt(row.workbench, row.unit)} {row.unit}"
        f"{' | ' + raw + ' ' + row.unit if raw else ''} | ratio {ratio}"
        f" | target {row.target or '-'}: {met}"
    )
    return line + (f"  ({row.note})" if row.note else "")


def print_result(result: BenchResult) -> None:
    print(f"== {result.name}: {result.title} ({result.seconds:.1f} s)")
    if result.ran:
        print(f"  ran: {result.ran}")
    for row in result.rows:
        print(format_row(row))
    for note in result.notes:
        print(f"  note: {note}")
    if result.error:
        print(f"  ERROR: {result.error}")
    sys.stdout.flush()


def run_main(run: Callable[[bool], BenchResult], argv: list[str] | None = None) -> int:
    """Command line of a single benchmark: ``python -m benchmarks.X [--quick]``."""
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="few repeats: a smoke run")
    opts = parser.parse_args(argv)
    prepare_environment()
    started = time.perf_counter()
    try:
        result = run(opts.quick)
    except Exception:
        print(traceback.format_exc(), file=sys.stderr)
        return 1
    result.seconds = time.perf_counter() - started
    print_result(result)
    return 1 if result.error else 0
