"""A kept cluster on CUDA (issues 44 and 48): tensors the engines hold on their GPU survive
Jupyter's kernel restart, and the new kernel's ``%wb attach`` finds them intact (same
device, same values, the process group still working on NCCL)."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from typing import Any

from benchmarks.kernel_session import Kernel
from tests.gpu.conftest import gpu_count
from tests.processes import alive

CELL_SET = (
    "%%wb\n"
    "kept = torch.full((1 << 20,), float(rank + 1), device=device)  # an exact sum\n"
    "print(kept.device, float(kept.sum()))"
)
CELL_CHECK = (
    "%%wb\n"
    "print(kept.device, float(kept.sum()))\n"
    "t = torch.ones(1, device=device)\n"
    "dist.all_reduce(t)\n"
    "print('allreduce', dist.get_backend(), float(t))"
)


def test_kept_cluster_keeps_its_cuda_tensors_across_a_kernel_restart(
    numbers: dict[str, Any],
) -> None:
    n = min(2, gpu_count())  # one GPU per engine: NCCL
    kernel = Kernel()
    pids: list[int] = []
    try:
        kernel.run("%load_ext workbench")
        kernel.run(f"%wb start -n {n} --keep --name gpu44")
        before = kernel.run(CELL_SET)
        assert "cuda:" in before, before
        vital, pids = json.loads(
            kernel.run(
                "import json, workbench as wb\nc = wb.Cluster.current()\n"
                "vital = c.pids() + [c.engines.watchdog.pid]\n"
                "tree = [p.pid for p in c.engines.process_tree(c.ranks)]\n"
                "print(json.dumps([vital, vital + tree]))"
            )
            .strip()
            .splitlines()[-1]
        )
        kernel.restart()
        assert alive(vital) == vital  # the forker's spare (in pids) ends with its kernel
        kernel.run("%load_ext workbench")
        started = time.perf_counter()
        said = kernel.run("%wb attach gpu44")
        attach_s = time.perf_counter() - started
        assert re.search(r"attached to kept cluster 'gpu44'", said), said
        after = kernel.run(CELL_CHECK)
        numbers.update(ranks=n, attach_s=round(attach_s, 3), before=before, after=after)
        for line in before.splitlines():
            if line.startswith("cuda:"):
                assert line in after  # the same device and sum on that rank
        assert after.count(f"allreduce nccl {float(n)}") == n, after
        kernel.run("%wb stop")
        deadline = time.monotonic() + 10
        while alive(pids) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert alive(pids) == []
    finally:
        kernel.close()
        for pid in alive(pids):
            os.kill(pid, signal.SIGKILL)
