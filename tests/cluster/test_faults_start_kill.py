"""A kernel SIGKILLed in the middle of a cluster's start leaves no process behind: the
watchdog runs before the first process starts and learns each one as it appears."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from tests.processes import alive

pytestmark = pytest.mark.engines

# The progress callback runs while engines register; it announces that moment and holds
# the start there, so the kill lands mid-start every time.
SCRIPT = textwrap.dedent(
    """
    import time
    from workbench.cluster import Cluster

    def progress(stage, done, total):
        if stage == "engines":
            print("REGISTERING", done, total, flush=True)
            time.sleep(120)  # the test kills us here

    Cluster(n=2, backend="gloo", progress=progress).start_sync()
    """
)


def _descendants(pid: int) -> dict[int, str]:
    try:
        procs = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return {}
    out = {}
    for proc in procs:
        try:
            out[proc.pid] = " ".join(proc.cmdline())
        except psutil.Error:
            continue
    return out


def test_kernel_killed_while_engines_register_leaves_nothing() -> None:
    kernel = subprocess.Popen(
        [sys.executable, "-c", SCRIPT], stdout=subprocess.PIPE, text=True, env=dict(os.environ)
    )
    seen: dict[int, str] = {}
    try:
        assert kernel.stdout is not None
        line = kernel.stdout.readline()
        assert line.startswith("REGISTERING"), f"the start did not get to the engines: {line!r}"
        # The forking process and both engines it forked (their command line is its own;
        # a local engine has no nanny) are there.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            seen.update(_descendants(kernel.pid))
            if sum("workbench/engine/zygote.py" in c for c in seen.values()) >= 3:
                break
            time.sleep(0.2)
        assert any("workbench/cluster/watchdog.py" in c for c in seen.values()), seen
        assert any("ipyparallel.controller" in c for c in seen.values()), seen
        assert sum("workbench/engine/zygote.py" in c for c in seen.values()) >= 3, seen
        os.kill(kernel.pid, signal.SIGKILL)
        kernel.wait(30)
        deadline = time.monotonic() + 30  # generous: the machine may be busy
        while alive(list(seen)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert alive(list(seen)) == [], {p: seen[p] for p in alive(list(seen))}
    finally:
        if kernel.poll() is None:
            kernel.kill()
            kernel.wait(10)
        for pid in alive(list(seen)):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                continue
