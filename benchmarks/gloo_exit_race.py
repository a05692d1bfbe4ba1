"""How often a torchrun'd gloo job aborts at exit, and whether ``process_exit`` stops it.

Each round is one ``torchrun --nproc-per-node 4`` of a tiny job: 20 all-reduces, then
``destroy_process_group``, then the end, in three variants run side by side:

- ``held``: the group is still referenced after ``destroy_process_group`` (as DDP and FSDP2
  leave it), the process exits normally: the interpreter's finalization races gloo's
  worker threads (``workbench/parallel/process_exit.py`` says how);
- ``held + exit_process``: the same, ending with ``workbench.parallel.process_exit``;
- ``freed``: nothing holds the group, so ``destroy_process_group`` ends its threads.

A round fails when torchrun's exit code is not 0; the rows count them, and count those that
printed "terminate called without an active exception". Rates, not times: ``--quick`` runs
3 rounds, the full run 10 (about 8 minutes with both cores free).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.common import BenchResult, Row, run_main
from workbench.parallel.local import free_port

NAME = "gloo_exit_race"
TITLE = "gloo job's exit: aborts at the interpreter's finalization, with and without process_exit"
RANKS = 4
ABORT = "terminate called without an active exception"

JOB = """
import os, sys
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
held = dist.group.WORLD if sys.argv[1] != "freed" else None
for _ in range(20):
    t = torch.ones(4)
    dist.all_reduce(t)
dist.destroy_process_group()
if sys.argv[1] == "exit_process":
    from workbench.parallel.process_exit import exit_process

    exit_process(0)
"""

VARIANTS = {  # row label: the job's argument
    "group held past destroy, normal exit": "held",
    "group held past destroy, exit_process": "exit_process",
    "group freed at destroy, normal exit": "freed",
}


def _round(script: Path, variant: str) -> tuple[bool, bool]:
    """One torchrun of the job: (failed, printed torch's abort)."""
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(RANKS)]
    argv += ["--master-addr", "127.0.0.1", "--master-port", str(free_port()), str(script)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [*argv, variant], capture_output=True, text=True, env=env, timeout=300, check=False
    )
    return done.returncode != 0, ABORT in done.stdout + done.stderr


def run(quick: bool = False) -> BenchResult:
    rounds = 3 if quick else 10
    result = BenchResult(NAME, TITLE, ran=f"{RANKS} gloo ranks under torchrun, {rounds} rounds")
    counts = {variant: [0, 0] for variant in VARIANTS.values()}
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "gloo_exit_job.py"
        script.write_text(JOB)
        for _ in range(rounds):  # interleaved: each variant sees the same machine
            for variant in VARIANTS.values():
                failed, aborted = _round(script, variant)
                counts[variant][0] += failed
                counts[variant][1] += aborted
    for label, variant in VARIANTS.items():
        failed, aborted = counts[variant]
        result.rows.append(Row(f"{label}: runs failed", "runs", failed, samples=rounds))
        aborts = Row(f"{label}: runs with torch's abort", "runs", aborted, samples=rounds)
        result.rows.append(aborts)
    result.details = {"rounds": rounds, "counts": counts}
    return result


if __name__ == "__main__":
    raise SystemExit(run_main(run))
