"""Orphan watchdog: stops a cluster's processes when the kernel that owns them is gone.

A kernel killed with SIGKILL runs no atexit handler, so its controller, engines and their
nannies would run on forever. ``Cluster.start`` spawns this module before it starts the
first process of the cluster, detached (its own session, so the kernel's process group
being killed does not take it along), as a plain script that imports only the standard
library and psutil, so it is watching within milliseconds:

    python -P .../workbench/cluster/watchdog.py --parent PID --run-dir DIR

It polls the parent every ``POLL_S`` seconds; the cluster keeps ``DIR/pids.json`` up to date
(every 0.1 s while it starts, as each process appears, and after every recovery). The
watchdog also remembers every descendant of those processes it has seen, since orphaned
children are re-parented and cannot be found from the kernel any more. When the parent is
gone it sends SIGTERM to all of them, SIGKILL after ``GRACE_S``, removes ``DIR`` and exits.
When the cluster stops normally, it is told to exit (SIGTERM) and touches nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

__all__ = ["GRACE_S", "POLL_S", "main", "spawn", "stop", "write_pidfile"]

POLL_S = 0.25
GRACE_S = 1.0
_PIDFILE = "pids.json"


def write_pidfile(run_dir: str, pids: list[int]) -> None:
    """Tell the watchdog which processes belong to the cluster (atomic replace)."""
    path = Path(run_dir) / _PIDFILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(sorted(set(pids))))
    os.replace(tmp, path)


def spawn(run_dir: str) -> subprocess.Popen[bytes]:
    """Start the watchdog for this process's cluster, detached in its own session."""
    return subprocess.Popen(
        [
            sys.executable,
            "-P",  # run the file itself: no workbench/torch import, so it watches at once
            __file__,
            "--parent",
            str(os.getpid()),
            "--run-dir",
            run_dir,
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        close_fds=True,
    )


def stop(proc: subprocess.Popen[bytes]) -> None:
    """The cluster stopped normally: end the watchdog without it touching anything."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def _read_pids(run_dir: Path) -> list[int]:
    try:
        return [int(p) for p in json.loads((run_dir / _PIDFILE).read_text())]
    except (OSError, ValueError, TypeError):
        return []


def _remember(known: dict[int, psutil.Process], pids: list[int]) -> None:
    for pid in pids:
        if pid in known:
            continue
        try:
            known[pid] = psutil.Process(pid)
        except psutil.Error:
            continue
    for proc in list(known.values()):
        try:
            for child in proc.children(recursive=True):
                known.setdefault(child.pid, child)
        except psutil.Error:
            continue


def _terminate(known: dict[int, psutil.Process]) -> None:
    procs = []
    for proc in known.values():
        try:
            if proc.is_running():  # same pid *and* creation time: never a reused pid
                proc.terminate()
                procs.append(proc)
        except psutil.Error:
            continue
    _, alive = psutil.wait_procs(procs, timeout=GRACE_S)
    for proc in alive:
        try:
            proc.kill()
        except psutil.Error:
            continue
    psutil.wait_procs(alive, timeout=GRACE_S)


def _gone(parent: psutil.Process | None) -> bool:
    try:
        return parent is None or not parent.is_running() or parent.status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="workbench/cluster/watchdog.py")
    parser.add_argument("--parent", type=int, required=True, help="the kernel's pid")
    parser.add_argument("--run-dir", required=True, help="directory holding pids.json")
    args = parser.parse_args(argv)
    run_dir = Path(args.run_dir)
    try:
        parent = psutil.Process(args.parent)
    except psutil.Error:
        parent = None
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the notebook's interrupt is not for us
    known: dict[int, psutil.Process] = {}
    while not stopping:
        _remember(known, _read_pids(run_dir))
        if _gone(parent):
            _terminate(known)
            shutil.rmtree(run_dir, ignore_errors=True)
            return 0
        time.sleep(POLL_S)
    return 0


if __name__ == "__main__":
    sys.exit(main())
