"""A kernel killed outright (SIGKILL: no atexit, no stop) leaves nothing on any node.

The orphan watchdog is a local process: it ends the engines on the other hosts through
their own host (an ssh there / ``scancel``), never by a local signal to a remote pid. The
"kernel" here is the driver process on the login node, killed once its 2x2 cluster runs.
"""

from __future__ import annotations

import json
import time

import psutil
import pytest

from tests.multinode.bed import Bed
from tests.multinode.checks import HOSTS, ok

pytestmark = pytest.mark.engines

GOAL_S = 10.0
MARGIN_S = 20.0  # a loaded machine (2 cores shared by several test runs) is slow


def _left(bed: Bed) -> list[str]:
    """Whatever of the bed user still runs anywhere, and ``wb-*`` in any node's /tmp."""
    left = []
    for proc in bed.user_processes():
        try:
            if proc.status() != psutil.STATUS_ZOMBIE:
                left.append(f"{proc.pid} {' '.join(proc.cmdline())[:120]}")
        except psutil.Error:  # exited meanwhile
            continue
    for node in bed.nodes:
        tmp = bed.node_exec(node, ["ls", "/tmp"]).stdout.split()
        left += [f"{node.name}:/tmp/{d}" for d in tmp if d.startswith("wb-")]
    return left


@pytest.mark.parametrize("launcher", ["ssh", "slurm"])
def test_killed_kernel_leaves_nothing_on_any_node(bed: Bed, launcher: str) -> None:
    if launcher == "slurm" and not bed.slurm:
        pytest.skip("slurm-wlm and munge are not installed (apt-get install slurm-wlm munge)")
    proc, out = bed.spawn_driver(
        {"scenario": "orphan", "launcher": launcher, "hosts": HOSTS, "n": 4}
    )
    try:
        deadline = time.monotonic() + 300
        while not out.exists():
            log = out.with_suffix(".log")
            assert proc.poll() is None, f"the driver exited ({proc.returncode}):\n{log.read_text()}"
            assert time.monotonic() < deadline, "the cluster did not start within 300 s"
            time.sleep(0.25)
        report = ok(json.loads(out.read_text()))
        assert report["pid"] == proc.pid  # the login chain execs into the driver
        running = {n.name: bed.node_processes(n) for n in bed.nodes}
        assert all(running.values()), running  # engines on both nodes before the kill
        proc.kill()  # the "kernel": SIGKILL, our own child
        proc.wait(30)
        killed = time.monotonic()
        while (left := _left(bed)) and time.monotonic() - killed < GOAL_S + MARGIN_S:
            time.sleep(0.25)
        gone_s = time.monotonic() - killed
        print(f"{launcher}: nothing left {gone_s:.1f} s after the kernel's SIGKILL")
        assert left == [], f"{gone_s:.1f} s after the kernel's SIGKILL: {left}"
        if launcher == "slurm":  # and the engines' jobs are ended (completing is ending)
            queue = bed.run_user(["squeue", "-h", "-u", bed.user, "-o", "%i %t"], timeout=30)
            assert all(line.split()[1] in ("CG", "CA") for line in queue.stdout.splitlines())
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
        for path in (out, out.with_suffix(".log")):
            path.unlink(missing_ok=True)
