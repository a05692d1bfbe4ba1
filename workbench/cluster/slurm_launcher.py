"""ipyparallel's Slurm engine launcher, with Slurm's own words when it refuses.

ipyparallel runs ``sbatch`` / ``scancel`` with ``check_output``: a refused job (a wrong
partition, an account, a time limit) becomes "returned non-zero exit status 1" while
Slurm's reason goes to the kernel's stderr, unseen in a notebook. Here the reason is the
error. A stop before any job was submitted does nothing (ipyparallel runs ``scancel ''``).
"""

from __future__ import annotations

import subprocess
from typing import Any

from ipyparallel.cluster.launcher import SlurmEngineSetLauncher

from workbench.errors import ClusterError

__all__ = ["WorkbenchSlurmEngineSetLauncher"]


class WorkbenchSlurmEngineSetLauncher(SlurmEngineSetLauncher):
    def _run_command(self, command: list[str], **kwargs: Any) -> str:
        kwargs.pop("stdin", None)
        done = subprocess.run(
            command, stdin=subprocess.DEVNULL, capture_output=True, check=False, **kwargs
        )
        if done.returncode != 0:
            words = (done.stderr or done.stdout).decode("utf8", "replace").strip()
            raise ClusterError(f"{command[0]} refused (exit {done.returncode}): {words}")
        return done.stdout.decode("utf8", "replace")  # type: ignore[no-any-return]

    def stop(self) -> Any:
        if not getattr(self, "job_id", None):  # nothing was submitted
            return None
        return super().stop()
