"""``workbench.export``: the exported torchrun command, run for real (torch's own torchrun,
2 local processes on 127.0.0.1), reproduces the notebook's run — the stepper's losses for
a user model and a built-in one, a script's losses under ``%wb run`` — and the sbatch
script is valid bash that reads the allocation's first node."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

import workbench as wb
from tests.harness import free_port
from tests.parallel import _user_models as um
from tests.torch_exit import once_more_after_torch_abort
from workbench.cluster import Cluster
from workbench.session.job_files import Export
from workbench.trace import Metric
from workbench.ui.stepper import Stepper

pytestmark = [pytest.mark.engines, pytest.mark.slow]

MIGRATION = Path(__file__).resolve().parents[1] / "cluster" / "scripts" / "migration_ddp.py"
STEPS = 5


def _run(script: Path, *, users_script: bool = False) -> subprocess.CompletedProcess[str]:
    """The export's ``torchrun.sh``; a user's own script gets a second run after torch's
    abort at its exit (tests/torch_exit.py), the workbench's own job none."""

    def once() -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "OMP_NUM_THREADS": "1", "MASTER_PORT": str(free_port())}
        return subprocess.run(
            ["bash", str(script)], capture_output=True, text=True, env=env, timeout=300, cwd="/"
        )

    if users_script:
        result = once_more_after_torch_abort(
            once, lambda r: (r.returncode, r.stdout + r.stderr), str(script)
        )
    else:
        result = once()
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    return result


def _printed_losses(stdout: str) -> list[float]:
    return [float(m) for m in re.findall(r"^step \d+ loss (\S+)$", stdout, re.MULTILINE)]


def _stepper_losses(stepper: Stepper) -> list[float]:
    return [e.value for e in stepper.events if isinstance(e, Metric) and e.rank == 0]


def _notebook_run(stepper: Stepper, folder: Path) -> tuple[list[float], Export]:
    """The stepper's losses after ``STEPS`` steps, and its run exported into ``folder``."""
    try:
        stepper.run(STEPS)
        done = wb.export(stepper, folder)
        assert isinstance(done, Export)
        return _stepper_losses(stepper), done
    finally:
        stepper.close()


def _same(job: list[float], notebook: list[float]) -> None:
    assert len(job) == len(notebook) == STEPS
    assert max(abs(a - b) for a, b in zip(job, notebook, strict=True)) <= 1e-6


def test_exported_user_run_reproduces_the_stepper(cluster: Cluster, tmp_path: Path) -> None:
    # The factories are imported by name in the job (tests.parallel._user_models:...), from
    # the folder the export puts on PYTHONPATH; the job runs from another working directory.
    stepper = Stepper(
        cluster=cluster,
        model=um.make_model,
        data=um.make_data,
        loss=um.lm_loss,
        optimizer=um.adamw,
        strategy="fsdp",
    )
    notebook, done = _notebook_run(stepper, tmp_path / "job")
    job = json.loads(done.files["job"].read_text())
    assert job["factories"]["model"] == "tests.parallel._user_models:make_model"
    assert job["steps"] == STEPS and job["strategy"] == "fsdp"
    _same(_printed_losses(_run(done.files["torchrun"]).stdout), notebook)


def test_exported_builtin_run_reproduces_the_stepper(cluster: Cluster, tmp_path: Path) -> None:
    stepper = Stepper("mlp-tiny", "dp", cluster=cluster, optimizer="sgd")
    notebook, done = _notebook_run(stepper, tmp_path / "job")
    assert json.loads(done.files["job"].read_text())["spec"]["strategy"] == "dp"
    _same(_printed_losses(_run(done.files["torchrun"]).stdout), notebook)


def test_exported_script_reproduces_wb_run(cluster: Cluster, tmp_path: Path) -> None:
    on_engines, exported = tmp_path / "engines.json", tmp_path / "torchrun.json"
    results = cluster.run_script(MIGRATION, ["--batch", "8", "--out", str(on_engines)])
    assert all(r.ok for r in results), [r.error for r in results]
    done = wb.export(
        str(MIGRATION),
        tmp_path / "job",
        args=["--batch", 8, "--out", str(exported)],
        procs_per_node=2,
    )
    assert "job" not in done.files  # a script is its own entry point
    _run(done.files["torchrun"], users_script=True)
    job, notebook = json.loads(exported.read_text()), json.loads(on_engines.read_text())
    assert len(job) == len(notebook) == 16
    assert max(abs(a - b) for a, b in zip(job, notebook, strict=True)) <= 1e-6


def test_sbatch_script_is_bash_and_meets_at_the_first_node(tmp_path: Path) -> None:
    done = wb.export(str(MIGRATION), tmp_path / "job", nodes=2, procs_per_node=4, gpus=True)
    sbatch = done.files["sbatch"]
    checked = subprocess.run(["bash", "-n", str(sbatch)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr
    text = sbatch.read_text()
    for line in (
        "#SBATCH --nodes=2",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --gpus-per-node=4",
        'MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        "--nproc-per-node 4",
        '--rdzv-endpoint "$MASTER_ADDR:$MASTER_PORT"',
    ):
        assert line in text
    assert str(MIGRATION) in text


def test_the_job_checkpoints_where_the_stepper_does_and_the_stepper_loads_them(
    cluster: Cluster, tmp_path: Path
) -> None:
    ckpt = tmp_path / "ckpt"
    stepper = Stepper(
        "mlp-tiny",
        "fsdp",
        cluster=cluster,
        optimizer="sgd",
        checkpoint_dir=ckpt,
        checkpoint_every=2,
    )
    try:
        stepper.step()  # one step: no checkpoint yet
        done = wb.export(stepper, tmp_path / "job", steps=4)
        job = json.loads(done.files["job"].read_text())
        assert job["checkpoint"] == {"dir": str(ckpt), "every": 2, "keep_last": 3}
        printed = _printed_losses(_run(done.files["torchrun"]).stdout)
        assert [c["step"] for c in stepper.checkpoints()] == [2, 4]
        meta = stepper.load()  # signed by the job with the notebook's key: trusted
        assert meta["step"] == 4 and meta["last_loss"] == printed[-1]
    finally:
        stepper.close()
