"""Slurm engines: one batch job per engine, all submitted at once.

ipyparallel's ``SlurmEngineSetLauncher`` starts every engine in one job. A job keeps its
CPUs until it ends, so when one engine dies nothing can replace it (the new job waits
for CPUs the old one holds). Here each engine is its own 1-task job, pinned to its node
(``--nodelist=HOST --nodes=1 --ntasks=1``) when ``hosts=[...]`` names the nodes: one
engine's death ends its job and frees its CPU, and a replacement is a new 1-engine job on
the dead rank's node (a lost node's ranks: on a spare, ``cluster/hosts/spare_hosts.py``). Every
engine reports the node Slurm ran it on (``WB_LAUNCH_HOST`` from ``$SLURMD_NODENAME``),
which is where its replacement goes.

ipyparallel runs ``sbatch`` / ``scancel`` with ``check_output``: a refused job (a wrong
partition, an account, a time limit) becomes "returned non-zero exit status 1" while
Slurm's reason goes to the kernel's stderr, unseen in a notebook. Here the reason is the
error. A stop before any job was submitted does nothing (ipyparallel runs ``scancel ''``).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from typing import Any

from ipyparallel.cluster.launcher import LocalEngineSetLauncher, SlurmEngineSetLauncher
from traitlets import Dict, List, Unicode

from workbench.errors import ClusterError

__all__ = [
    "SlurmJobsEngineSetLauncher",
    "WorkbenchSlurmEngineSetLauncher",
    "job_ids",
    "scancel",
]

_SCANCEL_S = 30.0
# One engine per job, run by the batch script itself (no srun step: one task needs none).
# ``exec``: the engine *is* the job's batch step, so its death ends the job at once.
# ``--no-requeue``: a job whose node failed is requeued by default (JobRequeue=1), which
# would start an engine nobody asked for once slurmctld declares the node DOWN; recovery
# starts the lost ranks' engines itself (on a spare: cluster/hosts/spare_hosts.py).
_TEMPLATE = """#!/bin/sh
#SBATCH --export=ALL
#SBATCH --no-requeue
#SBATCH --job-name=ipengine-{cluster_id}
export WB_LAUNCH_HOST="$SLURMD_NODENAME"
exec {program_and_args}
"""


def _run(command: list[str], **kwargs: Any) -> str:
    kwargs.pop("stdin", None)
    done = subprocess.run(
        command, stdin=subprocess.DEVNULL, capture_output=True, check=False, **kwargs
    )
    if done.returncode != 0:
        words = (done.stderr or done.stdout).decode("utf8", "replace").strip()
        raise ClusterError(f"{command[0]} refused (exit {done.returncode}): {words}")
    return done.stdout.decode("utf8", "replace")


class WorkbenchSlurmEngineSetLauncher(SlurmEngineSetLauncher):
    """One Slurm job of engines (``n`` tasks); the set below runs one per engine."""

    def _run_command(self, command: list[str], **kwargs: Any) -> str:
        return _run(command, **kwargs)

    def stop(self) -> Any:
        if not getattr(self, "job_id", None):  # nothing was submitted
            return None
        return super().stop()


class SlurmJobsEngineSetLauncher(LocalEngineSetLauncher):
    """Engines as 1-engine Slurm jobs, submitted all at once.

    ``engines``: ``{node: count}`` (from ``hosts=[...]``; a replacement names the dead
    rank's node); empty: Slurm places every job. ``sbatch_args``: every job's extra sbatch
    options (the user's). ``batch_dir``: where the job scripts are written.
    """

    launcher_class = WorkbenchSlurmEngineSetLauncher
    engines = Dict(config=True, help="node -> number of engines (empty: Slurm places them)")
    sbatch_args = List(Unicode(), config=True, help="extra sbatch options for every job")
    batch_dir = Unicode("", config=True, help="directory for the job scripts")

    def _placements(self, n: int) -> list[str | None]:
        if not self.engines:
            return [None] * n
        nodes = [node for node, count in self.engines.items() for _ in range(int(count))]
        return list(nodes[:n])

    def _job(self, index: int, node: str | None) -> WorkbenchSlurmEngineSetLauncher:
        pin = [f"--nodelist={node}"] if node else []
        name = f"engine-{self.cluster_id}-{self.engine_set_id}-{index}"
        log_dir = os.path.join(self.profile_dir, "log")  # in the home, which nodes share
        os.makedirs(log_dir, exist_ok=True)
        output = os.path.join(log_dir, f"ip{name}.log")
        el = self.launcher_class(
            work_dir=self.work_dir,
            parent=self,
            log=self.log,
            profile_dir=self.profile_dir,
            cluster_id=self.cluster_id,
            environment=dict(self.environment),
            identifier=name,
            batch_template=_TEMPLATE,
            batch_file_name=os.path.join(self.batch_dir or self.work_dir, f"{name}.sbatch"),
            output_file=output,
            submit_command=[
                "sbatch",
                *pin,
                "--nodes=1",
                "--ntasks=1",
                f"--output={output}",
                *self.sbatch_args,
            ],
        )
        el.engine_cmd = list(self.engine_cmd)
        el.engine_args = list(self.engine_args)
        return el

    async def start(self, n: int) -> list[str]:  # type: ignore[override]
        """Submit one job per engine, all at once (sbatch returns once queued)."""
        placements = self._placements(n)
        jobs = []
        for i, node in enumerate(placements):
            el = self._job(i, node)
            # registered before it is submitted: a failed start cancels what was queued
            self.launchers[el.identifier] = el
            jobs.append(el)
        results = await asyncio.gather(
            *(asyncio.to_thread(el.start, 1) for el in jobs), return_exceptions=True
        )
        for result in results:
            if isinstance(result, BaseException):
                raise result
        self.n = len(jobs)
        self.notify_start([el.job_id for el in jobs])
        return [el.job_id for el in jobs]

    async def stop(self) -> None:  # type: ignore[override]
        """Cancel every job of this set with one scancel (a job whose engine died has
        ended already; scancel's complaint about it is not an error of the stop)."""
        ids = job_ids(self)
        if ids:
            await asyncio.to_thread(scancel, ids)
        self.notify_stop({"job_ids": ids})

    def signal(self, sig: int) -> None:
        scancel(job_ids(self), str(sig))


def scancel(ids: list[str], sig: str | None = None) -> str:
    """``scancel [-s SIG] IDS``; Slurm's complaint (e.g. a job already ended), or ''."""
    if not ids:
        return ""
    argv = ["scancel", *(["-s", sig] if sig else []), *ids]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=_SCANCEL_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    return done.stderr.strip() if done.returncode != 0 else ""


def job_ids(engine_set: Any) -> list[str]:
    """The Slurm job ids an engine set submitted (none for other launchers)."""
    out = []
    for el in getattr(engine_set, "launchers", {}).values():
        job_id = (
            getattr(el, "job_id", "") if isinstance(el, WorkbenchSlurmEngineSetLauncher) else ""
        )
        if job_id:
            out.append(str(job_id))
    return out
