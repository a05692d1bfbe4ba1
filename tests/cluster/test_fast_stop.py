"""The fast stop's two halves: an engine ending itself at once with a clean exit code and
its output flushed, and ending processes by pid (SIGTERM, then SIGKILL after a grace)."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil
import pytest

from workbench.cluster.lifecycle.fast_stop import end

pytestmark = pytest.mark.engines


def test_exit_now_flushes_output_and_exits_zero_while_the_main_thread_is_busy() -> None:
    code = (
        "import sys, time\n"
        "from workbench.engine.boot import exit_now\n"
        "print('pid', exit_now(0.05)); sys.stdout.write('unflushed tail')\n"
        "time.sleep(60)\n"  # the exit must not wait for the main thread
    )
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("pid ") and proc.stdout.endswith("unflushed tail")
    assert time.monotonic() - started < 55  # not the sleep: exit_now ended it


def test_end_terminates_and_kills_what_ignores_sigterm() -> None:
    polite = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    stubborn = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import signal, sys, time\n"
            "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "print('ready', flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert stubborn.stdout is not None and stubborn.stdout.readline() == "ready\n"
        procs = [psutil.Process(polite.pid), psutil.Process(stubborn.pid)]
        killed = end(procs, grace=0.5)
        assert [p.pid for p in killed] == [stubborn.pid]
        assert polite.wait(30) == -15  # SIGTERM
        assert stubborn.wait(30) == -9  # SIGKILL after the grace
    finally:
        for p in (polite, stubborn):
            if p.poll() is None:
                p.kill()
                p.wait()


def test_end_leaves_a_reused_or_finished_pid_alone() -> None:
    done = subprocess.Popen([sys.executable, "-c", "pass"])
    proc = psutil.Process(done.pid)
    done.wait(30)
    assert end([proc], grace=0.1) == []
