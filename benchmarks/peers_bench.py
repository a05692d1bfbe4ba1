"""The workbench side by side with its peers, from a fresh kernel through nbclient.

Measured for each tool in one interleaved run (rotating order, a new kernel every time):

- **cold start**: seconds from the kernel-start request to the first all-reduce result
  printed in the notebook, for 2 and 4 ranks: the kernel's own start, the tool's imports,
  its processes, their torch import and the rendezvous — what a user waits for;
- **per-cell round trip**: a 1-element all-reduce cell that prints its result, request to
  reply (median of several cells in each started kernel);
- **stop**: the tool's own stop cell, and which of its processes are still alive after it;
- **faults** (2 ranks, ``peers_faults.py``): a rank exiting mid-cell, recovery to a working
  all-reduce, a hung collective with a 5 s timeout, recovery after it.

The tools and what a user types (see each ``*_cells`` function):

- workbench: ``%load_ext workbench``, ``%wb start -n N``, a ``%%wb`` cell, in the plain
  Python kernel and in the workbench's own kernel ("workbench kernel": ``workbench kernel
  install``'s spec, which starts the engines' torch-importing process with the kernel);
- jupyter-distributed 0.1.1: its proxy kernel (``python -m jupyter_distributed.kernel``,
  what its server extension restarts a notebook's kernel into when the user sets
  Processes = N) and one plain cell that initialises the process group;
- nbdistributed 0.1.0: ``%load_ext nbdistributed``, ``%dist_init -n N``, a plain cell;
- raw ipyparallel: ``ipp.Cluster(n=N)`` with its defaults, a hand-written rendezvous
  (rank and port pushed to the engines) and a ``%%px`` cell.

With ``WB_BENCH_BASELINE=DIR`` (a directory holding another version's ``workbench`` package,
e.g. ``git archive main workbench | tar -x -C DIR``) that version runs too, as
"workbench (baseline)", in the same interleaved run: before/after numbers for a change.
``WB_BENCH_BASELINE_KERNEL=workbench`` runs that version in the workbench kernel (its own
``workbench.kernel_launcher``) instead of the plain Python kernel. ``WB_BENCH_REPEATS=N``
takes N cold starts per tool and size instead of 3 (a busy machine's spread needs more).

nbdistributed is stopped with ``%unload_ext nbdistributed`` (its graceful path):
``%dist_shutdown`` runs ``pkill -f`` on patterns that match other people's processes.

    .venv/bin/python -m benchmarks.peers_bench [--quick]
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from benchmarks.common import BenchResult, Row, Target, interleaved, median, run_main
from benchmarks.notebook_driver import KernelSpec, NotebookRun, RunTimes, spec_dir
from benchmarks.peers_faults import FAULT_KEYS, fault_rows, fault_sampler

__all__ = ["NAME", "TITLE", "TOOLS", "Tool", "render_table", "run"]

NAME = "peers"
TITLE = "Fresh kernel to first all-reduce, per-cell round trip, stop and faults, beside the peers"
BODY = 't = torch.ones(1) * (rank + 1)\ndist.all_reduce(t)\nprint(f"allreduce={t.item()}")'
MARKER = "allreduce="
ROUND_TRIP = 't = torch.ones(1)\ndist.all_reduce(t)\nprint(f"rt={t.item()}")'
# A peer's own start can fail now and then (one jupyter-distributed start hung in its
# init_process_group until the cell timeout): such a sample is recorded and taken again, up
# to this many times, instead of ending the whole run. The workbench gets no second try.
PEER_RETRIES = 2
COLD_TARGET = Target("<=", 1.0, "<= 1 (vs jupyter-distributed)")
CELL_TARGET_RAW = Target("<=", 1.1, "<= 1.1 (vs raw ipyparallel)")
CELL_TARGET_JD = Target("<=", 1.0, "<= 1 (vs jupyter-distributed)")
STOP_TARGET = Target("<=", 1.0, "<= 1 s, nothing left")


@dataclass(frozen=True, slots=True)
class Tool:
    name: str
    module: str | None  # a module that must be importable for the tool to be measured
    kernel: str
    setup: Callable[[int], list[str]]
    cell: Callable[[str], str]  # round-trip cell source from BODY-like source
    stop: str | None
    env: dict[str, str] | None = None  # extra kernel environment


def workbench_cells(n: int) -> list[str]:
    return ["%load_ext workbench", f"%wb start -n {n}", "%%wb\n" + BODY]


def jd_cells(n: int) -> list[str]:
    return [
        "import torch, torch.distributed as dist\n"
        'dist.init_process_group("gloo")\n'
        "rank = dist.get_rank()\n" + BODY
    ]


def nbd_cells(n: int) -> list[str]:
    # torch, dist and rank are predefined on nbdistributed's workers; the readiness wait is
    # explained in benchmarks/nbd_ready.py
    return [
        "%load_ext nbdistributed",
        f"%dist_init -n {n}",
        "%run -m benchmarks.nbd_ready",
        BODY,
    ]


def raw_cells(n: int) -> list[str]:
    return [
        "import socket, ipyparallel as ipp\n"
        f"cluster = ipp.Cluster(n={n}, log_level=40)\n"
        "rc = cluster.start_and_connect_sync()\n"
        "view = rc[:]\n"
        "view.block = True\n"
        "view.activate()\n"
        "with socket.socket() as s:\n"
        '    s.bind(("127.0.0.1", 0))\n'
        "    port = s.getsockname()[1]\n"
        f"view.scatter('rank', list(range({n})), flatten=True, block=True)\n"
        f"view.push(dict(port=port, world={n}), block=True)",
        "%%px\nimport torch, torch.distributed as dist\n"
        'dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", '
        "rank=rank, world_size=world)\n" + BODY,
    ]


TOOLS: dict[str, Tool] = {
    "workbench": Tool(
        "workbench", "workbench", "wb-python", workbench_cells, lambda s: "%%wb\n" + s, "%wb stop"
    ),
    "workbench kernel": Tool(
        "workbench kernel",
        "workbench.kernel_launcher",
        "wb-workbench",
        workbench_cells,
        lambda s: "%%wb\n" + s,
        "%wb stop",
    ),
    "jupyter-distributed": Tool(
        "jupyter-distributed", "jupyter_distributed", "wb-jd-{n}", jd_cells, lambda s: s, None
    ),
    "nbdistributed": Tool(
        "nbdistributed",
        "nbdistributed",
        "wb-python",
        nbd_cells,
        lambda s: s,
        "%unload_ext nbdistributed",
    ),
    "raw ipyparallel": Tool(
        "raw ipyparallel",
        "ipyparallel",
        "wb-python",
        raw_cells,
        lambda s: "%%px\n" + s,
        "cluster.stop_cluster_sync()",
    ),
}


def _tools() -> dict[str, Tool]:
    tools = dict(TOOLS)
    base = os.environ.get("WB_BENCH_BASELINE")
    if base:
        if not (Path(base) / "workbench" / "__init__.py").is_file():
            raise ValueError(f"WB_BENCH_BASELINE={base!r} holds no workbench package")
        # Ahead of the editable install (the kernels run in an empty directory).
        path = os.pathsep.join([base, os.environ.get("PYTHONPATH", "")])
        kernel = os.environ.get("WB_BENCH_BASELINE_KERNEL", "python")
        if kernel not in ("python", "workbench"):
            raise ValueError(f"WB_BENCH_BASELINE_KERNEL={kernel!r} must be 'python' or 'workbench'")
        wb = TOOLS["workbench" if kernel == "python" else "workbench kernel"]
        tools = {
            "workbench (baseline)": Tool(
                "workbench (baseline)",
                wb.module,
                wb.kernel,
                wb.setup,
                wb.cell,
                wb.stop,
                env={"PYTHONPATH": path},
            ),
            **tools,
        }
    return tools


def _specs(sizes: tuple[int, ...]) -> list[KernelSpec]:
    py = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    workbench = [sys.executable, "-m", "workbench.kernel_launcher", "-f", "{connection_file}"]
    specs = [KernelSpec("wb-python", py), KernelSpec("wb-workbench", workbench)]
    for n in sizes:
        specs.append(
            KernelSpec(
                f"wb-jd-{n}",
                [sys.executable, "-m", "jupyter_distributed.kernel", "-f", "{connection_file}"],
                env={
                    "JUPYTER_DISTRIBUTED_WORLD_SIZE": str(n),
                    "JUPYTER_DISTRIBUTED_BASE_KERNEL": "python3",
                },
                interrupt_mode="message",
            )
        )
    return specs


async def _one(tool: Tool, n: int, kernels: str, cells: int) -> RunTimes:
    env = {"OMP_NUM_THREADS": "1", **(tool.env or {})}
    run = NotebookRun(KernelSpec(tool.kernel.format(n=n), []), Path(kernels), env=env)
    try:
        times = await run.start(tool.setup(n), MARKER)
        expected = f"{MARKER}{n * (n + 1) / 2}"
        if times.marker_s is None or times.marker_cell_text.count(expected) < n:
            raise RuntimeError(
                f"{tool.name}: the all-reduce cell did not print {expected!r} on {n} ranks: "
                f"{times.marker_cell_text[:400]}"
            )
        for _ in range(cells):
            await run.round_trip(tool.cell(ROUND_TRIP))
        if cells and times.last_round_trip_text.count(f"rt={float(n)}") < n:
            raise RuntimeError(f"{tool.name}: round-trip cell output wrong: {times}")
        if tool.stop is not None:
            await run.stop(tool.stop)
        return times
    finally:
        await run.close()


def available(tools: dict[str, Tool]) -> tuple[dict[str, Tool], list[str]]:
    """The tools installed here (the peers come with ``make bench``: the ``bench`` extra)."""
    have, missing = {}, []
    for name, tool in tools.items():
        if tool.module is None or importlib.util.find_spec(tool.module) is not None:
            have[name] = tool
        else:
            missing.append(name)
    return have, missing


def _spread(values: list[float]) -> str:
    return f"{min(values):.2f}–{max(values):.2f}" if values else "–"


def render_table(details: dict, tools: list[str]) -> str:
    """The side-by-side table: medians with min–max spread, per metric and tool."""
    header = "| | " + " | ".join(tools) + " |"
    lines = [header, "|---" * (len(tools) + 1) + "|"]
    for key, label, scale, unit in (
        ("cold", "cold start to first all-reduce, {n} ranks", 1.0, "s"),
        ("cell", "1-element all-reduce cell, round trip, {n} ranks", 1e3, "ms"),
        ("stop", "stop cell, {n} ranks", 1.0, "s"),
        *((key, label, 1.0, "s") for key, label in FAULT_KEYS.items()),
    ):
        for n in details.get("sizes", []):
            if key in FAULT_KEYS and f"{key}:{n}" not in details:
                continue  # the fault rows are measured at one size
            row = [label.format(n=n)]
            for tool in tools:
                values = details.get(f"{key}:{n}", {}).get(tool, [])
                if not values:
                    row.append("–")
                    continue
                vals = [v * scale for v in values]
                fmt = "{:.1f}" if unit == "ms" else "{:.2f}"
                row.append(
                    f"{fmt.format(median(vals))} {unit} ({fmt.format(min(vals))}–"
                    f"{fmt.format(max(vals))})"
                )
            lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def _repeats(default: int) -> int:
    text = os.environ.get("WB_BENCH_REPEATS", "")
    if not text:
        return default
    if not text.isdigit() or not 1 <= int(text) <= 100:
        raise ValueError(f"WB_BENCH_REPEATS={text!r} must be a whole number from 1 to 100")
    return int(text)


def retrying(
    name: str, sample: Callable[[], float], failures: dict[str, list[str]]
) -> Callable[[], float]:
    """``sample`` for a peer, taken again (up to PEER_RETRIES times) when it fails; each
    failure is recorded under ``failures[name]`` for the report. The workbench's own
    samples are never retried: its failure ends the run."""
    if name.startswith("workbench"):
        return sample

    def again() -> float:
        for attempt in range(PEER_RETRIES + 1):
            try:
                return sample()
            except Exception as exc:
                failures.setdefault(name, []).append(f"{type(exc).__name__}: {exc}"[:300])
                if attempt == PEER_RETRIES:
                    raise
        raise AssertionError("unreachable")

    return again


def run(quick: bool = False) -> BenchResult:
    sizes, repeats, cells = ((2,), 1, 5) if quick else ((2, 4), _repeats(3), 20)
    tools, missing = available(_tools())
    kernels = str(spec_dir(_specs(sizes)))
    try:
        load_before = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        load_before = []
    result = BenchResult(
        NAME,
        TITLE,
        ran=f"a fresh kernel through nbclient for every sample; tools {list(tools)}; ranks "
        f"{list(sizes)}; {repeats} cold starts per tool and size, interleaved in rotating "
        f"order; {cells} round-trip cells after each start (median per start); clock from the "
        f"kernel-start request to the first output containing the all-reduce result",
    )
    if missing:
        result.notes.append(f"not installed, skipped: {missing} (`make bench` installs them)")
    leftovers: dict[str, list[str]] = {}
    failures: dict[str, list[str]] = {}
    details: dict = {
        "sizes": list(sizes),
        "tools": list(tools),
        "load_before": load_before,
        "leftovers": leftovers,
        "failed_samples": failures,
    }

    def sampler(tool: Tool, n: int) -> Callable[[], float]:
        def sample() -> float:
            times = asyncio.run(_one(tool, n, kernels, cells))
            details.setdefault(f"cell:{n}", {}).setdefault(tool.name, []).append(
                median(times.round_trips_s) if times.round_trips_s else float("nan")
            )
            if times.stop_s is not None:
                details.setdefault(f"stop:{n}", {}).setdefault(tool.name, []).append(times.stop_s)
            details.setdefault(f"phases:{n}", {}).setdefault(tool.name, []).append(
                {"kernel_ready_s": times.kernel_ready_s, "cells_s": times.cells_s}
            )
            left = times.left_after_stop + times.left_after_shutdown
            if left:
                leftovers.setdefault(tool.name, []).extend(left)
            assert times.marker_s is not None
            return times.marker_s

        return sample

    for n in sizes:
        samples = interleaved(
            {t.name: retrying(t.name, sampler(t, n), failures) for t in tools.values()},
            repeats=repeats,
        )
        details[f"cold:{n}"] = samples
        _rows(result, details, n, repeats)
    # The fault rows (peers_faults.py), one size; the workbench kernel's fault paths are
    # the plain kernel's code, so it is not run twice.
    faulty = [t for t in tools.values() if t.name != "workbench kernel"]
    interleaved(
        {
            t.name: retrying(
                t.name, fault_sampler(t, sizes[0], kernels, details, BODY, MARKER), failures
            )
            for t in faulty
        },
        repeats=repeats,
    )
    fault_rows(result, details, sizes[0])
    try:
        details["load_after"] = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        details["load_after"] = []
    details["markdown"] = render_table(details, list(tools))
    if failures:
        result.notes.append(f"failed samples, taken again: {failures}")
    if leftovers:
        result.notes.append(f"processes alive after stop / kernel shutdown: {leftovers}")
    result.details.update(details)
    return result


def _rows(result: BenchResult, details: dict, n: int, repeats: int) -> None:
    cold = {k: median(v) for k, v in details[f"cold:{n}"].items()}
    cell = {k: median(v) * 1e3 for k, v in details.get(f"cell:{n}", {}).items()}
    wb = "workbench"
    if wb not in cold:
        return
    if "workbench (baseline)" in cold:
        result.rows.append(
            Row.compare(
                f"{n} ranks: fresh kernel to first all-reduce, vs the baseline version",
                "s",
                cold[wb],
                cold["workbench (baseline)"],
                raw_label="baseline",
                target=None,
                samples=repeats,
            )
        )
    # Each tool in its own kernel: jupyter-distributed's proxy kernel against the
    # workbench's (the target); the plain Python kernel is shown beside them.
    kernel = "workbench kernel"
    cold_pairs = [
        (kernel, "jupyter-distributed", COLD_TARGET),
        (wb, "jupyter-distributed", None),
        (wb, "nbdistributed", None),
    ]
    for tool, peer, target in cold_pairs:
        if tool in cold and peer in cold:
            in_kernel = " (workbench kernel)" if tool == kernel else ""
            result.rows.append(
                Row.compare(
                    f"{n} ranks: fresh kernel to first all-reduce{in_kernel}, vs {peer}",
                    "s",
                    cold[tool],
                    cold[peer],
                    raw_label=peer,
                    target=target,
                    samples=repeats,
                )
            )
    if "raw ipyparallel" in cold:
        result.rows.append(
            Row.compare(
                f"{n} ranks: fresh kernel to first all-reduce, vs raw ipyparallel",
                "s",
                cold[wb],
                cold["raw ipyparallel"],
                raw_label="ipp",
                target=None,
                samples=repeats,
            )
        )
    cell_peers = (("raw ipyparallel", CELL_TARGET_RAW), ("jupyter-distributed", CELL_TARGET_JD))
    for peer, target in cell_peers:
        if peer in cell and wb in cell:
            result.rows.append(
                Row.compare(
                    f"{n} ranks: all-reduce cell round trip, vs {peer}",
                    "ms",
                    cell[wb],
                    cell[peer],
                    raw_label=peer,
                    target=target,
                    samples=repeats,
                )
            )
    stops = details.get(f"stop:{n}", {}).get(wb, [])
    if stops:
        value = median(stops)
        result.rows.append(
            Row(
                metric=f"{n} ranks: %wb stop",
                unit="s",
                workbench=value,
                target=STOP_TARGET.describe(),
                met=STOP_TARGET.check(value) and not details.get("leftovers", {}).get(wb),
                samples=len(stops),
            )
        )


if __name__ == "__main__":
    raise SystemExit(run_main(run))
