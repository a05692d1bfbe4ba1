"""The process that starts a cluster (the notebook's kernel) never needs torch: the start's
replies and a first cell's results reach it as plain values. A torch object in a reply
(as ``torch.__version__``, a TorchVersion, in the engines' facts was) makes its client
import torch while unpickling it, ~1 s of a 2-rank cold start on a 2-core machine."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

_SCRIPT = """
import sys
import workbench as wb

with wb.Cluster(n=2, backend="gloo") as cluster:
    results = cluster.execute(
        "import torch, torch.distributed as dist\\n"
        "t = torch.ones(1)\\n"
        "dist.all_reduce(t)\\n"
        "print('sum', t.item())"
    )
    assert all(r.ok for r in results), results
    assert all("sum 2.0" in r.stdout for r in results), results
    print("torch imported here:", "torch" in sys.modules)
"""


@pytest.mark.engines
def test_starting_a_cluster_and_its_first_all_reduce_import_no_torch_here() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT],
        capture_output=True,
        text=True,
        timeout=300,  # generous: the machine's cores may be busy
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "torch imported here: False" in done.stdout, done.stdout[-2000:]
