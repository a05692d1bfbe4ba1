"""A process that exits without stopping its cluster still leaves nothing behind."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import psutil
import pytest

pytestmark = pytest.mark.engines

SCRIPT = textwrap.dedent(
    """
    import json, psutil
    from IPython.testing.globalipapp import start_ipython
    shell = start_ipython()
    shell.run_line_magic("load_ext", "workbench")
    shell.run_line_magic("wb", "start -n 2")
    me = psutil.Process()
    print("PIDS " + json.dumps([p.pid for p in me.children(recursive=True)]), flush=True)
    # no %wb stop: the interpreter exits as a kernel does on shutdown or restart
    """
)


def test_normal_exit_stops_the_cluster() -> None:
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120, check=True
    )
    # Other output (exit-time messages) may follow: find our line by its marker.
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("PIDS "))
    pids = json.loads(line[len("PIDS ") :])
    assert len(pids) >= 3
    procs = []
    for pid in pids:
        try:
            procs.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            continue
    _, alive = psutil.wait_procs(procs, timeout=10)
    assert [p.pid for p in alive if p.status() != psutil.STATUS_ZOMBIE] == []
