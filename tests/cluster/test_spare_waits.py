"""A spare forker (engine/standby.py) on its own, outside a cluster: it waits on its FIFO, a
request makes it run as asked, and one nobody takes ends once its kernel has exited or its
directory is gone (the cluster's stop removes it) -- never left behind."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.processes import BOUND_S, alive
from workbench.engine.standby import FIFO, PID
from workbench.engine.warm_request import request_line

pytestmark = pytest.mark.engines  # processes of their own

# The forker's part: fork the spare; the spare, once taken, prints what it was asked.
_FORKER = textwrap.dedent(
    """
    import os, sys, time
    from workbench.engine import standby
    taken = standby.fork_standby(sys.argv[1], int(sys.argv[2]))
    if taken is not None:
        print("taken", taken, flush=True)
        os._exit(0)
    time.sleep(120)
    """
)


@pytest.fixture
def directory() -> Iterator[str]:
    d = tempfile.mkdtemp(prefix="wb-test-spare-")
    os.mkfifo(os.path.join(d, FIFO), 0o600)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _start(directory: str, owner: int) -> tuple[subprocess.Popen[bytes], int]:
    """The forker and its spare's pid, once the spare waits."""
    forker = subprocess.Popen([sys.executable, "-c", _FORKER, directory, str(owner)])
    deadline = time.monotonic() + BOUND_S
    pid_file = Path(directory, PID)
    while not pid_file.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    return forker, int(pid_file.read_text())


def _gone(pid: int) -> bool:
    deadline = time.monotonic() + BOUND_S
    while alive([pid]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not alive([pid])


def _stop(*procs: subprocess.Popen[bytes]) -> None:
    for proc in procs:
        proc.kill()
        proc.wait(BOUND_S)


def test_a_request_makes_the_spare_run_as_asked(directory: str, tmp_path: Path) -> None:
    forker, spare = _start(directory, os.getpid())
    try:
        output = tmp_path / "out.log"
        with open(os.path.join(directory, FIFO), "wb") as fifo:
            fifo.write(
                request_line(["1", "--x=2"], {"WB_TEST_SPARE": "1"}, str(tmp_path), str(output))
            )
        assert _gone(spare)
        assert output.read_text().strip() == "taken ['1', '--x=2']"
    finally:
        _stop(forker)


def test_a_spare_nobody_takes_ends_with_its_kernel(directory: str) -> None:
    kernel = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    forker, spare = _start(directory, kernel.pid)
    try:
        assert alive([spare])
        _stop(kernel)
        assert _gone(spare)
    finally:
        _stop(forker, kernel)


def test_a_spare_nobody_takes_ends_once_its_directory_is_removed(directory: str) -> None:
    forker, spare = _start(directory, os.getpid())
    try:
        shutil.rmtree(directory)
        assert _gone(spare)
    finally:
        _stop(forker)
