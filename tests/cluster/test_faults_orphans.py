"""A kernel killed with SIGKILL (no atexit) leaves no workbench process behind: the
watchdog started with the cluster stops controller, engines and nannies."""

from __future__ import annotations

import json
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

SCRIPT = textwrap.dedent(
    """
    import json, sys, time, psutil
    from IPython.testing.globalipapp import start_ipython
    shell = start_ipython()
    shell.run_line_magic("load_ext", "workbench")
    shell.run_line_magic("wb", "start -n 2")
    me = psutil.Process()
    print(json.dumps([p.pid for p in me.children(recursive=True)]), flush=True)
    time.sleep(120)  # the test kills us here
    """
)


def test_sigkilled_kernel_leaves_no_processes() -> None:
    kernel = subprocess.Popen(
        [sys.executable, "-c", SCRIPT], stdout=subprocess.PIPE, text=True, env=dict(os.environ)
    )
    try:
        line = ""
        while kernel.stdout is not None and not line.startswith("["):
            line = kernel.stdout.readline()  # after `%wb start`'s own message
            assert line, "the kernel exited before starting its cluster"
        pids = json.loads(line)
        cmdlines = {pid: " ".join(psutil.Process(pid).cmdline()) for pid in alive(pids)}
        assert any("workbench/cluster/watchdog.py" in c for c in cmdlines.values())
        assert len(pids) >= 4  # controller, 2 engines (+ nannies), watchdog
        started = time.monotonic()
        os.kill(kernel.pid, signal.SIGKILL)
        kernel.wait(10)
        while alive(pids) and time.monotonic() - started < 30:  # generous: a busy machine
            time.sleep(0.1)
        cleanup = time.monotonic() - started
        assert alive(pids) == [], {p: cmdlines.get(p) for p in alive(pids)}
        print(f"orphans gone {cleanup:.2f} s after SIGKILL")
    finally:
        if kernel.poll() is None:
            kernel.kill()
        kernel.wait(10)
        for pid in alive(pids if "pids" in locals() else []):
            os.kill(pid, signal.SIGKILL)
