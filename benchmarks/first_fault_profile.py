"""The peers benchmark's workbench fault samples, profiled (issue 31): where the first fault
after a fresh start spends its seconds, and what the spare forker costs a cold start.

Each sample is what ``peers_faults`` does for the workbench, from a fresh kernel through
nbclient, 2 ranks: ``%load_ext workbench``, ``%wb start -n 2``, a ``%%wb`` all-reduce
(cold start: kernel-start request to its printed result), then the dead cell (rank 1
writes the time and SIGKILLs itself 0.5 s in while rank 0 waits in a barrier; seconds from
that time to the cell's reply) and ``%wb restart`` + an all-reduce (recovery). One cell
before ``%wb start`` imports ``benchmarks.fault_marks`` in the kernel, which marks the
kernel's own steps (wall clock, comparable with the rank's stamp): the engine watch
seeing the exit, the client dropping the engine, the wait's end, the error built, the
cell's end, the recovery's steps, the spare forker's start and the end of its imports.

Variants, interleaved (rotating order): the plain Python kernel (as the peers' fault rows)
and the workbench kernel (as the peers' cold-start row), each with the spare forker and
without it (``fault_marks.no_spare``: the code before it). ``WB_BENCH_BASELINE=DIR`` (a
directory holding another version's ``workbench``) adds the same variants for that
version, for before/after ratios in one run. ``WB_BENCH_REPEATS=N`` rounds (default 3);
``FF_VARIANTS="python kernel, spare;workbench kernel, spare"`` runs only the variants whose
name contains one of the ``;``-separated parts; ``FF_COLD_ONLY=1`` takes the cold starts
alone (more rounds in the same time).

    .venv/bin/python -m benchmarks.first_fault_profile [--quick]
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import BenchResult, Row, median, run_main
from benchmarks.notebook_driver import KernelSpec, NotebookRun, spec_dir
from benchmarks.peers_bench import BODY, MARKER, TOOLS
from benchmarks.peers_faults import _dead, _recover

__all__ = ["NAME", "TITLE", "run"]

NAME = "first_fault_profile"
TITLE = "The first fault after a fresh start (peers' workbench samples), step by step"
KERNELS = {"python": "ff-python", "workbench": "ff-workbench"}
_DUMP = "MARKS-JSON:"


def _specs() -> list[KernelSpec]:
    py = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    wb = [sys.executable, "-m", "workbench.kernel_launcher", "-f", "{connection_file}"]
    return [KernelSpec(KERNELS["python"], py), KernelSpec(KERNELS["workbench"], wb)]


def _marks(text: str) -> dict[str, Any]:
    """The JSON line ``fault_marks.dump`` printed, from a cell's outputs."""
    for output in json.loads(text):
        for line in str(output.get("text", "")).splitlines():
            if line.startswith(_DUMP):
                return json.loads(line[len(_DUMP) :])
    raise RuntimeError(f"no marks in the cell's output: {text[:300]}")


async def _sample(kernel: str, spare: bool, kernels: Path, env: dict[str, str]) -> dict:
    tool = TOOLS["workbench"]
    run = NotebookRun(KernelSpec(KERNELS[kernel], []), kernels, env={"OMP_NUM_THREADS": "1", **env})
    setup = "import benchmarks.fault_marks as fm\nfm.watch_spare()" + (
        "" if spare else "\nfm.no_spare()"
    )
    fd, stamp = tempfile.mkstemp(prefix="wb-bench-kill-")
    os.close(fd)
    try:
        times = await run.start(
            ["%load_ext workbench", setup, "%wb start -n 2", "%%wb\n" + BODY], MARKER
        )
        if os.environ.get("FF_COLD_ONLY"):
            return {"cold": times.marker_s}
        await run.timed("fm.install()")
        _, _, failed = await run.timed(tool.cell(_dead(stamp)))
        returned = time.time()
        killed = float(Path(stamp).read_text() or "nan")
        _, text, _ = await run.timed(f"fm.dump({_DUMP!r})")
        dead_marks = _marks(text)
        await run.timed("fm.install()")
        recover = await _recover(run, tool, 2, BODY, MARKER)
        _, text, _ = await run.timed(f"fm.dump({_DUMP!r})")
        return {
            "cold": times.marker_s,
            "dead": returned - killed,
            "dead_error": failed,
            "recover": recover,
            "killed": killed,
            "returned": returned,
            "dead_marks": dead_marks,
            "recover_marks": _marks(text),
        }
    finally:
        os.unlink(stamp)
        await run.close()


def _spares(marks: dict[str, float]) -> dict[str, float]:
    """``spare PID: what`` -> ``spare N: what``, N counting spares by their start (a
    spare started ahead); other names as they are."""
    started = [k.split(":")[0] for k in marks if re.fullmatch(r"spare \d+: spawned", k)]
    number = {
        p: f"spare {i + 1}"
        for i, p in enumerate(sorted(started, key=lambda p: marks[f"{p}: spawned"]))
    }
    out = {}
    for key, at in marks.items():
        prefix, _, what = key.partition(":")
        out[f"{number[prefix]}:{what}" if prefix in number else key] = at
    return out


def _timeline(samples: list[dict], key: str, origin: str) -> list[str]:
    """Median seconds of each mark after ``origin`` (a mark name or a sample key)."""
    rel: dict[str, list[float]] = {}
    for s in samples:
        t0 = s[origin] if origin in s else s[key]["marks"].get(origin)
        if t0 is None:
            continue
        for name, at in {**s[key]["marks"], **_spares(s[key].get("spare", {}))}.items():
            rel.setdefault(name, []).append(at - t0)
        if key == "dead_marks":
            rel.setdefault("nbclient: reply", []).append(s["returned"] - t0)
            failed_at = (s[key].get("rank0_status") or {}).get("failed_at")
            if isinstance(failed_at, int | float):
                rel.setdefault("rank 0: collective failed (status)", []).append(failed_at - t0)
    rows = sorted((median(v), k, len(v)) for k, v in rel.items())
    return [
        f"  {m:+8.3f}  {k}" + (f" ({n}/{len(samples)})" if n < len(samples) else "")
        for m, k, n in rows
    ]


def _variants() -> dict[str, tuple[str, bool, dict[str, str]]]:
    codes: dict[str, dict[str, str]] = {"": {}}
    base = os.environ.get("WB_BENCH_BASELINE")
    if base:
        if not (Path(base) / "workbench" / "__init__.py").is_file():
            raise ValueError(f"WB_BENCH_BASELINE={base!r} holds no workbench package")
        codes["baseline, "] = {
            "PYTHONPATH": os.pathsep.join([base, os.environ.get("PYTHONPATH", "")])
        }
    out = {}
    only = [w for w in os.environ.get("FF_VARIANTS", "").split(";") if w]
    for code, env in codes.items():
        for kernel in KERNELS:
            for spare in (True, False):
                name = f"{code}{kernel} kernel, {'spare' if spare else 'no spare'}"
                if not only or any(w in name for w in only):
                    out[name] = (kernel, spare, env)
    return out


def run(quick: bool = False) -> BenchResult:
    rounds = 1 if quick else int(os.environ.get("WB_BENCH_REPEATS", "3"))
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    result = BenchResult(NAME, TITLE, ran=f"2 gloo ranks, {rounds} rounds, load avg {load}")
    kernels = spec_dir(_specs())
    variants = _variants()
    samples: dict[str, list[dict]] = {name: [] for name in variants}
    names = list(variants)
    for i in range(rounds):
        shift = i % len(names)
        for name in names[shift:] + names[:shift]:
            kernel, spare, env = variants[name]
            samples[name].append(asyncio.run(_sample(kernel, spare, kernels, env)))
    for name, got in samples.items():
        for key, label in (
            ("cold", "cold start to the first all-reduce"),
            ("dead", "a rank exits mid-cell: until the cell returns"),
            ("recover", "%wb restart + all-reduce after it"),
        ):
            values = [s[key] for s in got if key in s]
            if values:
                result.rows.append(
                    Row(f"{name}: {label}", "s", median(values), samples=len(values))
                )
        if not all("dead_marks" in s for s in got):
            continue
        result.notes.append(f"{name}: dead cell, seconds after rank 1's stamp (median):")
        result.notes += _timeline(got, "dead_marks", "killed")
        result.notes.append(f"{name}: recovery, seconds after the restart cell began (median):")
        result.notes += _timeline(got, "recover_marks", "kernel: cell starts")
    result.details = samples
    return result


if __name__ == "__main__":
    raise SystemExit(run_main(run))
