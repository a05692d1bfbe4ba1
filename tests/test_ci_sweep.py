"""CI's clean-up ends exactly the processes its own run started, matched by a per-run token."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.processes import alive

pytestmark = pytest.mark.engines

ROOT = Path(__file__).resolve().parents[1]
SWEEP = ROOT / ".ci" / "sweep.py"


def _spawn(token: str | None, *, ignore_term: bool = False) -> subprocess.Popen[bytes]:
    env = dict(os.environ)
    env.pop("WB_CI_RUN_TOKEN", None)
    if token is not None:
        env["WB_CI_RUN_TOKEN"] = token
    code = "import signal, time\n"
    if ignore_term:
        code += "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    code += "time.sleep(120)\n"
    # A new session: the sweep must find it by its token, not through a process group.
    return subprocess.Popen([sys.executable, "-c", code], env=env, start_new_session=True)


def test_sweep_ends_tagged_processes_and_spares_others() -> None:
    token = f"wb-ci-test-{os.getpid()}-{time.time_ns()}"
    mine = [_spawn(token), _spawn(token, ignore_term=True)]
    other_run = _spawn(token + "-other")  # same command line, another run's token
    untagged = _spawn(None)
    procs = [*mine, other_run, untagged]
    try:
        time.sleep(0.5)  # let the children exec so /proc shows their environment
        env = {k: v for k, v in os.environ.items() if k != "WB_CI_RUN_TOKEN"}
        out = subprocess.run(
            [sys.executable, str(SWEEP), token], env=env, capture_output=True, timeout=60
        )
        assert out.returncode == 0, out.stderr
        for p in mine:
            p.wait(timeout=30)
        assert alive([p.pid for p in mine]) == []
        assert alive([other_run.pid, untagged.pid]) == [other_run.pid, untagged.pid]
        assert str(mine[0].pid) in out.stderr.decode()
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=30)


def test_sweep_without_leftovers_is_silent() -> None:
    out = subprocess.run(
        [sys.executable, str(SWEEP), f"wb-ci-none-{time.time_ns()}"],
        capture_output=True,
        timeout=60,
    )
    assert out.returncode == 0
    assert out.stderr == b""


def test_ci_and_makefile_never_kill_by_name() -> None:
    pattern = re.compile(r"\b(pkill|killall)\b|ipcluster stop --all")
    for path in (ROOT / ".ci" / "run", ROOT / "Makefile"):
        offending = [line for line in path.read_text().splitlines() if pattern.search(line)]
        assert offending == [], f"{path.name} kills by name: {offending}"
