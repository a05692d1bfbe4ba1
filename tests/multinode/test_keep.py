"""A kept cluster on the 2-node bed (issue 44): ``keep=True`` with ssh and Slurm engines,
its "kernel" (the driver on the login node) SIGKILLed, then a new driver on the login node
attaches it, finds each rank's variable, runs an all-reduce and stops it: nothing is left
on any node (the driver reports what of the bed user still runs 20 s after its stop)."""

from __future__ import annotations

import json
import signal
import time

import psutil
import pytest

from tests.multinode.bed import Bed
from tests.multinode.checks import HOSTS, ok

pytestmark = pytest.mark.engines

LEASE_S = 300.0  # should the test fail midway, the kept cluster still ends by itself


def _end_kept(bed: Bed, name: str) -> None:
    """After a failure: end the kept cluster ``name`` through its watchdog (SIGUSR1, as
    ``%wb stop`` does), so nothing waits for the lease."""
    dogs = []
    for proc in bed.user_processes():
        try:
            argv = proc.cmdline()
        except psutil.Error:
            continue
        if any(a.endswith("watchdog.py") for a in argv) and any(f"{name}.json" in a for a in argv):
            proc.send_signal(signal.SIGUSR1)
            dogs.append(proc)
    psutil.wait_procs(dogs, timeout=60)


@pytest.mark.timeout(900)  # the bed's first build is part of the first test's time
@pytest.mark.parametrize("launcher", ["ssh", "slurm"])
def test_kept_cluster_is_attached_from_a_new_kernel(bed: Bed, launcher: str) -> None:
    if launcher == "slurm" and not bed.slurm:
        pytest.skip("slurm-wlm and munge are not installed (apt-get install slurm-wlm munge)")
    name = f"bed-{launcher}"
    cfg = {"launcher": launcher, "hosts": HOSTS, "n": 4, "name": name, "lease": LEASE_S}
    proc, out = bed.spawn_driver({"scenario": "keep", **cfg})
    attached: dict[str, object] = {}
    try:
        deadline = time.monotonic() + 300
        while not out.exists():
            log = out.with_suffix(".log")
            assert proc.poll() is None, f"the driver exited ({proc.returncode}):\n{log.read_text()}"
            assert time.monotonic() < deadline, "the cluster did not start within 300 s"
            time.sleep(0.25)
        ok(json.loads(out.read_text()))
        proc.kill()  # the "kernel": SIGKILL
        proc.wait(30)
        time.sleep(2)  # past the watchdog's poll: an unkept cluster would be ending now
        running = {n.name: bed.node_processes(n) for n in bed.nodes}
        assert all(running.values()), running  # the engines outlived their kernel
        attached = bed.drive({"scenario": "attach", **cfg})
        ok(attached)
        print(f"{launcher}: attached in {attached['attach_s']:.2f} s")
        assert attached["kept"] == [f"{r * 10 + 7}\n" for r in range(4)]
        assert attached["all_reduce"] == [10.0] * 4
        assert attached["left"] == [], attached["left"]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
        if not attached or attached.get("error"):  # the attach did not stop it: end it now
            _end_kept(bed, name)
        for path in (out, out.with_suffix(".log")):
            path.unlink(missing_ok=True)
