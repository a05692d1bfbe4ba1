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

Engines on other hosts are never signalled from here by pid (a pid of another host means
nothing here). ``pids.json`` also carries commands that end them through their own host
(an ssh to the host, ``scancel``; see remote_ends.py): run at once, beside the local
termination, each bounded by ``REMOTE_S``.
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
from typing import Any

import psutil

__all__ = ["GRACE_S", "POLL_S", "main", "spawn", "stop", "write_pidfile"]

POLL_S = 0.25
GRACE_S = 1.0
REMOTE_S = 8.0  # an ssh / scancel that takes longer is abandoned (killed)
_PIDFILE = "pids.json"


def write_pidfile(run_dir: str, pids: list[int], remote: dict[str, Any] | None = None) -> None:
    """Tell the watchdog which processes belong to the cluster and how to end its engines
    on other hosts (``{"phases": [[argv, ...], ...], "dirs": [...]}``); atomic replace."""
    path = Path(run_dir) / _PIDFILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"pids": sorted(set(pids)), "remote": remote or {}}))
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


def _read(run_dir: Path) -> tuple[list[int], dict[str, Any] | None]:
    """The pids and the remote commands; (``[]``, None) while the file cannot be read (a
    None keeps the commands read before)."""
    try:
        data = json.loads((run_dir / _PIDFILE).read_text())
        return [int(p) for p in data["pids"]], dict(data.get("remote") or {})
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return [], None


def _start_phase(commands: list[list[str]]) -> list[subprocess.Popen[bytes]]:
    procs = []
    for argv in commands:
        try:
            procs.append(
                subprocess.Popen(
                    [str(a) for a in argv],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    close_fds=True,
                )
            )
        except OSError:  # e.g. no scancel here: nothing else can be done about it
            continue
    return procs


def _wait_phase(procs: list[subprocess.Popen[bytes]], deadline: float) -> None:
    for proc in procs:
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()  # our own child: its pid is ours
            proc.wait()


def _end_remote(remote: dict[str, Any], first: list[subprocess.Popen[bytes]]) -> None:
    """Wait for the first phase (started already), run the others, remove the dirs."""
    phases = list(remote.get("phases") or [])
    _wait_phase(first, time.monotonic() + REMOTE_S)
    for phase in phases[1:]:
        _wait_phase(_start_phase(phase), time.monotonic() + REMOTE_S)
    for d in remote.get("dirs") or []:
        shutil.rmtree(str(d), ignore_errors=True)


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
    remote: dict[str, Any] = {}
    while not stopping:
        pids, ends = _read(run_dir)
        _remember(known, pids)
        remote = remote if ends is None else ends
        if _gone(parent):
            # the other hosts' engines first (an ssh round trip), the local ones meanwhile
            phases = list(remote.get("phases") or [])
            first = _start_phase(phases[0]) if phases else []
            _terminate(known)
            _end_remote(remote, first)
            shutil.rmtree(run_dir, ignore_errors=True)
            return 0
        time.sleep(POLL_S)
    return 0


if __name__ == "__main__":
    sys.exit(main())
