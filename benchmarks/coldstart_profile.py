"""The workbench kernel's 2-rank cold start, step by step (issue 31: "the start row not
worse"): from the kernel-start request to the first all-reduce's printed result, as the
peers benchmark's "workbench kernel" row measures it, split into the kernel's start, the
``%load_ext workbench`` cell, the ``%wb start -n 2`` cell and the first ``%%wb`` cell; a
cell after them prints the cluster's own start profile (``cluster.startup`` stages).

``WB_BENCH_BASELINE=DIR`` (a directory holding another version's ``workbench``) runs the
same samples for that version, interleaved in rotating order, for before/after medians in
one run. ``CS_PEERS="jupyter-distributed"`` (names from the peers benchmark's tools,
``,``-separated; ``make bench`` installs them) adds their cold starts at 2 ranks to the same
rotation, measured as the peers benchmark does. ``WB_BENCH_REPEATS=N`` rounds (default 6).

    .venv/bin/python -m benchmarks.coldstart_profile [--quick]
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

from benchmarks.common import BenchResult, Row, median, run_main
from benchmarks.notebook_driver import KernelSpec, NotebookRun, spec_dir
from benchmarks.peers_bench import BODY, MARKER, TOOLS, _one, _specs

__all__ = ["NAME", "TITLE", "run"]

NAME = "coldstart_profile"
TITLE = "The workbench kernel's 2-rank cold start, cell by cell"
KERNEL = "cs-workbench"
_DUMP = "STAGES-JSON:"
_STAGES = (
    "import json, sys\nfrom workbench.cluster.cluster import Cluster\n"
    "p = Cluster.latest().startup\n"
    "print({dump!r} + json.dumps({{'stages': p.stages, 'engines': p.engines, 'notes': p.notes, "
    "'torch in the kernel': 'torch' in sys.modules}}))"
)
STEPS = ("kernel ready", "%load_ext workbench", "%wb start -n 2", "first all-reduce printed")


def _stages(text: str) -> dict[str, dict]:
    for output in json.loads(text):
        for line in str(output.get("text", "")).splitlines():
            if line.startswith(_DUMP):
                return dict(json.loads(line[len(_DUMP) :]))
    return {}


async def _sample(kernels: Path, env: dict[str, str]) -> dict:
    run = NotebookRun(KernelSpec(KERNEL, []), kernels, env={"OMP_NUM_THREADS": "1", **env})
    try:
        times = await run.start(["%load_ext workbench", "%wb start -n 2", "%%wb\n" + BODY], MARKER)
        _, text, _ = await run.timed(_STAGES.format(dump=_DUMP))
        return {
            "kernel ready": times.kernel_ready_s,
            "cells": times.cells_s,
            "cold": times.marker_s,
            **_stages(text),
        }
    finally:
        await run.close()


def _variants() -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {"this tree": {}}
    base = os.environ.get("WB_BENCH_BASELINE")
    if base:
        if not (Path(base) / "workbench" / "__init__.py").is_file():
            raise ValueError(f"WB_BENCH_BASELINE={base!r} holds no workbench package")
        path = os.pathsep.join([base, os.environ.get("PYTHONPATH", "")])
        out["baseline"] = {"PYTHONPATH": path}
    return out


def _peer_sample(tool: str, kernels: Path) -> dict:
    """A peer's cold start at 2 ranks, as the peers benchmark takes it (no round trips)."""
    times = asyncio.run(_one(TOOLS[tool], 2, str(kernels), 0))
    return {"cold": times.marker_s}


def _peers() -> list[str]:
    names = [t.strip() for t in os.environ.get("CS_PEERS", "").split(",") if t.strip()]
    for name in names:
        if name not in TOOLS or name.startswith("workbench"):
            choices = [t for t in TOOLS if not t.startswith("workbench")]
            raise ValueError(f"CS_PEERS names {name!r}: not a peer; peers are {choices}")
    return names


def _steps(sample: dict) -> dict[str, float]:
    """Seconds spent in each step (not since the start)."""
    ready = sample["kernel ready"]
    cells = sample["cells"]
    ends = [ready, *cells[:2], sample["cold"]]
    starts = [0.0, ready, *cells[:2]]
    return {step: end - begin for step, begin, end in zip(STEPS, starts, ends, strict=True)}


def run(quick: bool = False) -> BenchResult:
    rounds = 1 if quick else int(os.environ.get("WB_BENCH_REPEATS", "6"))
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    result = BenchResult(NAME, TITLE, ran=f"2 gloo ranks, {rounds} rounds, load avg {load}")
    wb = [sys.executable, "-m", "workbench.kernel_launcher", "-f", "{connection_file}"]
    kernels = spec_dir([KernelSpec(KERNEL, wb), *_specs((2,))])
    variants = _variants()
    peers = _peers()
    names = list(variants) + peers
    samples: dict[str, list[dict]] = {name: [] for name in names}
    for i in range(rounds):
        shift = i % len(names)
        for name in names[shift:] + names[:shift]:
            if name in peers:
                samples[name].append(_peer_sample(name, kernels))
            else:
                samples[name].append(asyncio.run(_sample(kernels, variants[name])))
    for name, got in samples.items():
        cold = [s["cold"] for s in got]
        label = f"{name}: cold start to the first all-reduce"
        result.rows.append(Row(label, "s", median(cold), samples=len(cold)))
        result.notes.append(f"{name}: cold starts {', '.join(f'{c:.2f}' for c in cold)} s")
        if name in peers:
            continue
        for step in STEPS:
            values = [_steps(s)[step] for s in got]
            result.rows.append(Row(f"{name}: {step} (step)", "s", median(values), samples=len(got)))
        torch_in = sum(bool(s.get("torch in the kernel")) for s in got)
        result.notes.append(f"{name}: torch imported in the kernel by then: {torch_in}/{len(got)}")
        stages: dict[str, list[float]] = {}
        for s in got:
            for stage, at in s.get("stages", {}).items():
                stages.setdefault(stage, []).append(at)
            for engine in s.get("engines", {}).values():
                for milestone, at in engine.items():
                    stages.setdefault(f"engine {milestone}", []).append(at)
        for stage, ats in sorted(stages.items(), key=lambda kv: median(kv[1])):
            result.notes.append(f"{name}: start stage {stage} at {median(ats):.3f} s (median)")
    result.details = samples
    return result


if __name__ == "__main__":
    raise SystemExit(run_main(run))
