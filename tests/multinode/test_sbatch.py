"""The exported ``job.sbatch`` submitted with ``sbatch`` to the bed's Slurm (issue 28 item 5):
2 nodes, 1 task (one ``torchrun``, one rank) per node, gloo on CPU. Its losses equal the
same export run on one node with ``torchrun.sh`` (2 local ranks on 127.0.0.1, which
tests/session/test_job_export.py proves equal to the notebook's run), and nothing of the
job is left on any node afterwards.

Everything runs as the bed's user with the bed's venv (the cluster's python): the export
itself (``workbench export``), the local run and ``sbatch``; the job's files live in the
user's home, which every node shares.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from tests.harness import free_port
from tests.multinode.bed import Bed
from tests.torch_exit import once_more_after_torch_abort

pytestmark = pytest.mark.engines

MIGRATION = Path(__file__).resolve().parents[1] / "cluster" / "scripts" / "migration_ddp.py"
# a built-in run as the stepper exports it (``run.json``): FSDP2 across the two nodes
PRESET = {"model": "mlp-tiny", "strategy": "fsdp", "batch_size": 8, "optimizer": "sgd"}
STEPS = 5
JOB_TIMEOUT = 600  # two CPU nodes sharing a busy machine: generous
TOL = 1e-6

_WRITE_RUN_JSON = """
import json, sys
from workbench.parallel.run_spec import RunSpec
from workbench.session.job_files import job_for_run
spec = RunSpec(**json.loads(sys.argv[1]))
with open(sys.argv[2], "w") as f:
    json.dump(job_for_run(spec, 2, int(sys.argv[3])), f)
"""


@pytest.fixture(scope="module")
def slurm_bed(bed: Bed) -> Bed:
    if not bed.slurm:
        pytest.skip("slurm-wlm and munge are not installed (apt-get install slurm-wlm munge)")
    return bed


def _export(
    bed: Bed, where: str, nodes: int, procs: int, *, job: str = "", script: Sequence[str] = ()
) -> Path:
    """``workbench export`` as the user, from the home (the job's working directory)."""
    cli = str(bed.python.parent / "workbench")
    options = ["--nodes", str(nodes), "--procs-per-node", str(procs)]
    options += ["--job", job] if job else []
    bed.run_user([cli, "export", *options, where, *script], timeout=300)
    return bed.home / where


def _local_run(bed: Bed, folder: Path, *, users_script: bool = False) -> str:
    """The export's ``torchrun.sh`` on the login node: 2 ranks on 127.0.0.1 (a user's
    script once more after torch's abort at its exit: tests/torch_exit.py)."""

    def once() -> subprocess.CompletedProcess[str]:
        argv = ["bash", str(folder / "torchrun.sh")]
        return bed.run_user(
            argv, timeout=JOB_TIMEOUT, env={"MASTER_PORT": str(free_port())}, check=False
        )

    if users_script:
        done = once_more_after_torch_abort(
            once, lambda d: (d.returncode, d.stdout + d.stderr), f"{folder.name} torchrun.sh"
        )
    else:
        done = once()
    assert done.returncode == 0, f"torchrun.sh exit {done.returncode}: {done.stderr[-4000:]}"
    return done.stdout


def _submit(bed: Bed, folder: Path) -> tuple[subprocess.CompletedProcess[str], str, str]:
    """``sbatch --wait`` the export's ``job.sbatch``: sbatch's result, the job id and the
    job's output (every node's)."""
    out = folder / "slurm-%j.out"
    done = bed.run_user(
        ["sbatch", "--parsable", "--wait", "--output", str(out), str(folder / "job.sbatch")],
        timeout=JOB_TIMEOUT + 60,
        check=False,
    )
    job_id = done.stdout.strip().split(";")[0]
    log = Path(str(out).replace("%j", job_id)) if job_id else None
    text = log.read_text(errors="replace") if log is not None and log.exists() else ""
    return done, job_id, text


def _sbatch(bed: Bed, folder: Path, *, users_script: bool = False) -> str:
    """The job submitted and checked: it ran on both nodes; its output (a user's script is
    submitted once more after torch's abort at its exit: tests/torch_exit.py)."""
    if users_script:
        submitted = once_more_after_torch_abort(
            lambda: _submit(bed, folder),
            lambda r: (r[0].returncode, r[2]),
            f"{folder.name} job.sbatch",
        )
    else:
        submitted = _submit(bed, folder)
    done, job_id, text = submitted
    assert done.returncode == 0, f"sbatch exit {done.returncode}: {done.stderr}\n{text[-4000:]}"
    # both nodes were allocated and each slurmd launched the job's step (its torchrun)
    ctld = (bed.root / "slurm" / "slurmctld.log").read_text(errors="replace")
    # the main scheduler logs "sched: Allocate JobId=N NodeList=...", the backfill one
    # "sched/backfill: _start_job: Started JobId=N in PART on ..." (which one starts it is timing)
    allocated = rf"(Allocate JobId={job_id} NodeList=|Started JobId={job_id} in \S+ on )wbmn\[1-2\]"
    assert re.search(allocated, ctld), ctld[-3000:]
    for node in bed.nodes:
        slurmd = (bed.root / "slurm" / f"slurmd-{node.name}.log").read_text(errors="replace")
        assert f"launch task StepId={job_id}.0 " in slurmd, (node.name, slurmd[-3000:])
    return text


def _nothing_left(bed: Bed) -> None:
    """No job in the queue, no process of the user on any node or the login node (Slurm
    takes a moment to reap a finished job's steps: bounded waits, no timing asserted)."""
    deadline = time.monotonic() + 60
    while queue := bed.run_user(["squeue", "-h", "-u", bed.user], timeout=30).stdout.strip():
        assert time.monotonic() < deadline, queue
        time.sleep(0.5)
    for node in bed.nodes:
        while left := bed.node_processes(node):
            assert time.monotonic() < deadline, (node.name, left)
            time.sleep(0.5)
    while left := [p.pid for p in bed.user_processes()]:
        assert time.monotonic() < deadline, left
        time.sleep(0.5)


def _close(job: list[float], local: list[float], steps: int) -> None:
    assert len(job) == len(local) == steps, (job, local)
    assert max(abs(a - b) for a, b in zip(job, local, strict=True)) <= TOL, (job, local)
    assert job[0] != job[-1]  # it trained


@pytest.mark.parametrize("hosts_style", ["cluster", "debian"])
def test_sbatch_script_on_two_nodes_equals_the_local_run(slurm_bed: Bed, hosts_style: str) -> None:
    # "debian": each node's own name resolves to 127.0.1.1 there, so gloo must be told the
    # interface that joins the nodes (without it the job fails in gloo's connect)
    bed, home = slurm_bed, slurm_bed.home
    outs = {shape: home / f"script-{shape}-{hosts_style}.json" for shape in ("2x1", "1x2")}
    args = ["--batch", "8", "--out"]
    two = _export(
        bed, f"script-2x1-{hosts_style}", 2, 1, script=[str(MIGRATION), *args, str(outs["2x1"])]
    )
    one = _export(
        bed, f"script-1x2-{hosts_style}", 1, 2, script=[str(MIGRATION), *args, str(outs["1x2"])]
    )
    _local_run(bed, one, users_script=True)
    bed.set_hosts_style(hosts_style)
    try:
        printed = _sbatch(bed, two, users_script=True)
    finally:
        bed.set_hosts_style("cluster")
    assert "16 steps" in printed, printed[-4000:]
    job = json.loads(outs["2x1"].read_text())
    _close(job, json.loads(outs["1x2"].read_text()), 16)
    _nothing_left(bed)


def _losses(stdout: str) -> list[float]:
    return [float(m) for m in re.findall(r"^step \d+ loss (\S+)$", stdout, re.MULTILINE)]


def test_exported_fsdp_run_on_two_nodes_equals_the_local_run(slurm_bed: Bed) -> None:
    bed, home = slurm_bed, slurm_bed.home
    run_json = home / "fsdp-run.json"
    bed.run_user(
        [str(bed.python), "-c", _WRITE_RUN_JSON, json.dumps(PRESET), str(run_json), str(STEPS)],
        timeout=300,
    )
    two = _export(bed, "fsdp-2x1", 2, 1, job=str(run_json))
    one = _export(bed, "fsdp-1x2", 1, 2, job=str(run_json))
    local = _losses(_local_run(bed, one))
    job = _losses(_sbatch(bed, two))
    _close(job, local, STEPS)
    _nothing_left(bed)
