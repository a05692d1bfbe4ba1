"""An Accelerate script and a Hugging Face Trainer script run unchanged through ``%wb run``
on 2 CPU ranks, and their loss curves equal the same script in one plain process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from workbench.cluster import Cluster

pytest.importorskip("accelerate")
pytest.importorskip("transformers")
pytestmark = pytest.mark.engines

SCRIPTS = Path(__file__).resolve().parent / "scripts"
TORCHRUN_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_PORT")


def _one_process(script: Path, out: Path) -> dict[str, Any]:
    """The script in a process of its own, without a launcher's environment."""
    env = {k: v for k, v in os.environ.items() if k not in TORCHRUN_VARIABLES}
    subprocess.run(
        [sys.executable, str(script), "--batch", "8", "--out", str(out)],
        env=env,
        cwd=out.parent,
        check=True,
        timeout=300,
        capture_output=True,
    )
    return json.loads(out.read_text())  # type: ignore[no-any-return]


@pytest.fixture
def shell(ipython_shell: Any, cluster: Cluster) -> Any:
    assert ipython_shell._workbench_magics.cluster is cluster
    return ipython_shell


@pytest.mark.parametrize("name", ["accelerate_ddp.py", "trainer_ddp.py"])
def test_the_script_runs_unchanged_on_two_ranks(
    shell: Any, cluster: Cluster, name: str, tmp_path: Path
) -> None:
    script = SCRIPTS / name
    one = _one_process(script, tmp_path / "one.json")
    assert one["processes"] == 1
    for run in range(2):  # the second run starts from fresh Accelerate state too
        out = tmp_path / f"ddp{run}.json"
        shell.run_line_magic("wb", f"run --timeout 300 {script} --batch 8 --out {out}")
        ddp = json.loads(out.read_text())
        assert ddp["processes"] == 2
        assert len(ddp["losses"]) == len(one["losses"]) >= 4
        assert ddp["losses"] == pytest.approx(one["losses"], rel=1e-5)
    # Accelerator.end_training() / Trainer called destroy_process_group(): the group stays
    cell = cluster.execute("t = torch.ones(1); dist.all_reduce(t); print(t.item())")
    assert [r.stdout for r in cell] == ["2.0\n", "2.0\n"]
    environ = cluster.execute("import os; print(sorted(os.environ))")[0].stdout
    assert "'RANK'" in environ and "'TORCHELASTIC_RUN_ID'" not in environ  # put back


def test_an_accelerator_in_a_cell_spans_the_ranks(cluster: Cluster) -> None:
    """Accelerate code typed into a %%wb cell, not a script: every CPU rank is one of
    world_size processes (without ACCELERATE_USE_CPU each ran alone, as 0 of 1)."""
    cells = cluster.execute(
        "from accelerate import Accelerator\n"
        "accelerator = Accelerator()\n"
        "print(accelerator.num_processes, accelerator.process_index)\n"
        "accelerator.end_training()"
    )
    assert [c.stdout for c in cells] == ["2 0\n", "2 1\n"]
    check = cluster.execute("t = torch.ones(1); dist.all_reduce(t); print(t.item())")
    assert [c.stdout for c in check] == ["2.0\n", "2.0\n"]  # end_training kept the group
