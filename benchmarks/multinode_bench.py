"""Cold start and stop of 2x2 engines on the 2-node bed, per launcher: workbench ``Cluster``
vs a raw ipyparallel start with the same launcher; and SSH's cold start vs the local
launcher's (goal <= 1.5x).

Builds the bed of ``tests/multinode/`` (root, network/PID namespaces, Debian's sshd; slurm
and openmpi rows when installed) and skips with the reason when it cannot. Every sample
is a fresh process of the bed's user on the login node (benchmarks/multinode_sample.py),
the variants interleaved in rotating order.

    sudo .venv/bin/python -m benchmarks.multinode_bench [--quick]
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys

from benchmarks.common import ROOT, BenchResult, Row, Target, interleaved, median, run_main

__all__ = ["NAME", "TITLE", "run"]

NAME = "multinode"
TITLE = "Multi-node cold start and stop (2 nodes x 2 engines): workbench vs raw ipyparallel"
HOSTS = ["wbmn1", "wbmn2"]
N = 4
SSH_VS_LOCAL = Target("<=", 1.5)


def _sample(bed: object, kind: str, launcher: str) -> dict[str, float]:
    cfg = {"kind": kind, "launcher": launcher, "hosts": [] if launcher == "local" else HOSTS}
    cfg["n"] = N
    done = bed.run_user(  # type: ignore[attr-defined]
        [sys.executable, "-m", "benchmarks.multinode_sample", json.dumps(cfg)],
        timeout=900,
        check=False,
        cwd=str(ROOT),
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{kind} {launcher} failed ({done.returncode}): {done.stderr[-2000:]}")
    return json.loads(lines[-1])  # type: ignore[no-any-return]


def _launchers(slurm: bool) -> tuple[list[str], list[str]]:
    """The launchers this machine can run on the bed, and why the others are left out."""
    names, notes = ["local", "ssh"], []
    if shutil.which("mpiexec") and importlib.util.find_spec("mpi4py"):
        names.append("mpi")
    else:
        notes.append("mpi skipped: needs openmpi-bin and mpi4py")
    if slurm:
        names.append("slurm")
    else:
        notes.append("slurm skipped: needs slurm-wlm and munge")
    return names, notes


def run(quick: bool = False) -> BenchResult:
    from tests.multinode.bed import Bed, unavailable_reason

    repeats = 1 if quick else 2
    result = BenchResult(
        NAME,
        TITLE,
        ran=f"2-node namespace bed (tests/multinode/), gloo, {N} engines (2 per node); per "
        "launcher: workbench Cluster(n=4, launcher=..., hosts=[...]).start_sync() / "
        "stop_sync() vs ipp.Cluster with the same launcher configured by hand + "
        "wait_for_engines + init_process_group on every engine (same 500 ms heartbeat), "
        f"interleaved, {repeats} sample(s) each, every sample a fresh process",
    )
    reason = unavailable_reason()
    if reason is not None:
        result.notes.append(f"skipped: {reason}")
        return result
    slurm = all(shutil.which(c) for c in ("munged", "slurmctld", "slurmd", "sbatch"))
    names, notes = _launchers(slurm)
    result.notes += notes
    bed = Bed(slurm=slurm).up()
    try:
        samples: dict[str, list[dict[str, float]]] = {}
        for launcher in names:
            got = interleaved(
                {
                    f"{kind} {launcher}": _timed(bed, kind, launcher, samples)
                    for kind in ("workbench", "raw")
                },
                repeats=repeats,
            )
            del got  # the start times; each sample's start and stop are kept in ``samples``
    finally:
        bed.down()
    result.details["samples"] = samples
    med = {
        key: {m: median([s[m] for s in vals]) for m in ("start_s", "stop_s")}
        for key, vals in samples.items()
    }
    for launcher in names:
        wb, raw = med[f"workbench {launcher}"], med[f"raw {launcher}"]
        for metric, what in (("start_s", "cold start"), ("stop_s", "stop")):
            result.rows.append(
                Row.compare(
                    f"{launcher} 2x2: {what}, workbench vs raw ipyparallel",
                    "s",
                    wb[metric],
                    raw[metric],
                    raw_label=f"raw {launcher}",
                    target=None,
                    samples=repeats,
                )
            )
    result.rows.append(
        Row.compare(
            "ssh 2x2 cold start vs the local launcher (4 engines)",
            "s",
            med["workbench ssh"]["start_s"],
            med["workbench local"]["start_s"],
            raw_label="workbench local",
            target=SSH_VS_LOCAL,
            samples=repeats,
        )
    )
    return result


def _timed(bed: object, kind: str, launcher: str, samples: dict[str, list[dict[str, float]]]):  # type: ignore[no-untyped-def]
    def sample() -> float:
        got = _sample(bed, kind, launcher)
        samples.setdefault(f"{kind} {launcher}", []).append(got)
        return got["start_s"]

    return sample


if __name__ == "__main__":
    raise SystemExit(run_main(run))
