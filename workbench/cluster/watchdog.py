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

A kept cluster (``--lease SECONDS``, keep.py) outlives its kernel: the watchdog then watches
whichever kernel ``DIR/holder.json`` names (a kernel that attaches writes its pid there;
0 when none holds it), and ends the cluster only once no kernel has held it for the lease
(``DIR/lease.json`` says since when, for ``%wb list``), or at once on SIGUSR1 (``%wb stop``
from a kernel that attached). Then it also removes the cluster's connection file
(``--record``) if that file still names this run directory.

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

__all__ = [
    "GRACE_S",
    "HOLDER",
    "LEASE",
    "POLL_S",
    "main",
    "spawn",
    "stop",
    "write_holder",
    "write_pidfile",
]

POLL_S = 0.25
GRACE_S = 1.0
REMOTE_S = 8.0  # an ssh / scancel that takes longer is abandoned (killed)
_PIDFILE = "pids.json"
HOLDER = "holder.json"  # a kept cluster: the kernel that holds it ({"pid": 0}: none)
LEASE = "lease.json"  # a kept cluster: {"detached_at": wall-clock time, or null}


def write_pidfile(run_dir: str, pids: list[int], remote: dict[str, Any] | None = None) -> None:
    """Tell the watchdog which processes belong to the cluster and how to end its engines
    on other hosts (``{"phases": [[argv, ...], ...], "dirs": [...]}``); atomic replace."""
    path = Path(run_dir) / _PIDFILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"pids": sorted(set(pids)), "remote": remote or {}}))
    os.replace(tmp, path)


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp-" + str(os.getpid()))
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def write_holder(run_dir: str, pid: int) -> None:
    """A kept cluster: the kernel ``pid`` holds it now (0: none; the lease runs)."""
    started = psutil.Process(pid).create_time() if pid else 0.0
    _write_json(Path(run_dir) / HOLDER, {"pid": pid, "started": started})


def spawn(
    run_dir: str, lease: float | None = None, record: str | None = None
) -> subprocess.Popen[bytes]:
    """Start the watchdog for this process's cluster, detached in its own session.
    ``lease``: a kept cluster, ended ``lease`` seconds after no kernel holds it."""
    kept = [] if lease is None else ["--lease", repr(float(lease)), "--record", str(record)]
    return subprocess.Popen(
        [
            sys.executable,
            "-P",  # run the file itself: no workbench/torch import, so it watches at once
            __file__,
            "--parent",
            str(os.getpid()),
            "--run-dir",
            run_dir,
            *kept,
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


def _holder(run_dir: Path, current: psutil.Process | None) -> psutil.Process | None:
    """The kernel that holds a kept cluster now (None: none, or it is gone)."""
    try:
        data = json.loads((run_dir / HOLDER).read_text())
        pid, started = int(data["pid"]), float(data["started"])
    except (OSError, ValueError, TypeError, KeyError):
        return current  # being replaced, or not written yet: nothing changed
    if not pid:
        return None
    if current is not None and current.pid == pid:
        return current
    try:
        proc = psutil.Process(pid)
        return proc if abs(proc.create_time() - started) < 1.0 else None  # never a reused pid
    except psutil.Error:
        return None


def _remove_record(record: str | None, run_dir: Path) -> None:
    """The kept cluster's connection file, if it is still this cluster's."""
    if not record:
        return
    try:
        if json.loads(Path(record).read_text()).get("run_dir") == str(run_dir):
            os.remove(record)
    except (OSError, ValueError, AttributeError):
        pass


def _end(run_dir: Path, known: dict[int, psutil.Process], remote: dict[str, Any]) -> None:
    # the other hosts' engines first (an ssh round trip), the local ones meanwhile
    phases = list(remote.get("phases") or [])
    first = _start_phase(phases[0]) if phases else []
    _terminate(known)
    _end_remote(remote, first)
    shutil.rmtree(run_dir, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="workbench/cluster/watchdog.py")
    parser.add_argument("--parent", type=int, required=True, help="the kernel's pid")
    parser.add_argument("--run-dir", required=True, help="directory holding pids.json")
    parser.add_argument("--lease", type=float, default=None, help="kept: seconds unheld")
    parser.add_argument("--record", default=None, help="kept: its connection file")
    args = parser.parse_args(argv)
    run_dir = Path(args.run_dir)
    try:
        parent = psutil.Process(args.parent)
    except psutil.Error:
        parent = None
    stopping, ending = [], []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    signal.signal(signal.SIGUSR1, lambda *_: ending.append(True))  # a kept cluster's stop
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the notebook's interrupt is not for us
    known: dict[int, psutil.Process] = {}
    remote: dict[str, Any] = {}
    detached: float | None = None  # monotonic time since no kernel holds a kept cluster
    while not stopping:
        pids, ends = _read(run_dir)
        _remember(known, pids)
        remote = remote if ends is None else ends
        if args.lease is not None:
            parent = _holder(run_dir, parent)
        gone = _gone(parent)
        if gone and args.lease is not None and not ending:
            if detached is None:  # the lease starts now: said for `%wb list`
                detached = time.monotonic()
                _write_json(run_dir / LEASE, {"detached_at": time.time()})
            gone = time.monotonic() - detached >= args.lease
        elif not gone and detached is not None:  # a kernel attached: the lease is whole again
            detached = None
            _write_json(run_dir / LEASE, {"detached_at": None})
        if gone or ending:
            _end(run_dir, known, remote)
            _remove_record(args.record, run_dir)
            return 0
        time.sleep(POLL_S)
    return 0


if __name__ == "__main__":
    sys.exit(main())
