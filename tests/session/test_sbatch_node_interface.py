"""``job.sbatch``'s ``node_interface``, run by bash with stand-ins for ``scontrol``,
``getent`` and ``ip`` on ``PATH``: each node names the interface it reaches another node of
the job through (the first node: the second), not what its own name resolves to. The whole
script runs on the 2-node bed's Slurm in tests/multinode/test_sbatch.py."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

import workbench as wb

pytestmark = pytest.mark.engines  # it starts bash

MIGRATION = Path(__file__).resolve().parents[1] / "cluster" / "scripts" / "migration_ddp.py"
STANDINS = {
    "scontrol": 'printf "gpu1\\ngpu2\\ngpu3\\n"',
    "getent": 'echo "10.9.0.${2#gpu} STREAM $2"',  # getent ahostsv4 gpuN
    "ip": 'echo "$4 dev ib-$4 src 10.9.0.99 uid 1000"',
}


def _node_interface(tmp_path: Path, node: str) -> str:
    text = (
        wb.export(str(MIGRATION), tmp_path / "job", nodes=3, procs_per_node=1)
        .files["sbatch"]
        .read_text()
    )
    function = text[text.index("node_interface() {") : text.index("\n}\n") + 2]
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, body in STANDINS.items():
        (bin_dir / name).write_text(f"#!/bin/bash\n{body}\n")
        (bin_dir / name).chmod(0o755)
    env = {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "SLURM_JOB_NODELIST": "gpu[1-3]",
        "SLURMD_NODENAME": node,
    }
    done = subprocess.run(
        ["bash", "-c", f"{function}\nnode_interface"],
        env=env, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return done.stdout.strip()


@pytest.mark.parametrize(("node", "peer"), [("gpu1", "10.9.0.2"), ("gpu2", "10.9.0.1")])
def test_each_node_names_the_interface_towards_another_node(
    tmp_path: Path, node: str, peer: str
) -> None:
    assert _node_interface(tmp_path, node) == f"ib-{peer}"
