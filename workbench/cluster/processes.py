"""Processes a cluster started: their state where it can be seen, reaping them after a stop.

A pid means something only on its own host: an engine on another host is never inspected
or signalled from here (``local_state`` answers None for it).
"""

from __future__ import annotations

import os
import socket
import time

import psutil

__all__ = [
    "FROZEN",
    "GONE",
    "is_local",
    "local_state",
    "reap",
    "running",
    "signal_local",
    "started_for",
    "terminate",
]

GONE = "gone"
# Process states in which an engine cannot answer at all (SIGSTOP / a debugger's stop).
FROZEN = frozenset({psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP})


def running(proc: psutil.Process) -> bool:
    """Still the process that was started (pid and start time) and not exited; a zombie
    has exited (its reaping belongs to its parent)."""
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def is_local(host: str) -> bool:
    """True when an engine reporting ``host`` runs on this machine (same host name)."""
    return host == socket.gethostname()


def local_state(host: str, pid: int) -> str | None:
    """psutil's status of the engine process ``pid`` ("running", "sleeping", "stopped",
    ...), ``GONE`` when it has exited, or None when ``host`` is another host."""
    if not is_local(host):
        return None
    try:
        status = psutil.Process(pid).status()
    except psutil.Error:
        return GONE
    return GONE if status == psutil.STATUS_ZOMBIE else str(status)


def signal_local(host: str, pid: int, sig: int) -> bool:
    """Send ``sig`` to engine process ``pid`` if it runs on this host; False when it is on
    another host (its pid means nothing here) or already gone."""
    if not is_local(host):
        return False
    try:
        psutil.Process(pid).send_signal(sig)
    except psutil.Error:
        return False
    return True


def terminate(processes: list[psutil.Process]) -> list[psutil.Process]:
    """SIGTERM each process that is still the one we started (pid and start time; never a
    reused pid). Returns those signalled; ``reap`` kills what outlives them."""
    signalled = []
    for proc in processes:
        try:
            if running(proc):
                proc.terminate()
                signalled.append(proc)
        except psutil.Error:
            continue
    return signalled


def reap(
    processes: list[psutil.Process], grace: float = 1.0, poll: float = 0.05
) -> list[psutil.Process]:
    """Wait for processes to exit after a stop; SIGKILL any that outlive ``grace`` seconds.
    Returns those that needed it.

    By then the engines have left the process group and exited. A zombie counts as gone:
    it has exited, and its reaping belongs to whoever its parent now is.
    """
    deadline = time.monotonic() + grace
    alive = [p for p in processes if running(p)]
    while alive and time.monotonic() < deadline:
        time.sleep(poll)
        alive = [p for p in alive if running(p)]
    for proc in alive:
        try:
            proc.kill()
        except psutil.Error:
            continue
    return alive


def started_for(cluster_id: str) -> list[psutil.Process]:
    """This user's processes on this host (this PID namespace) that ipyparallel started for
    ``cluster_id``: every launcher puts ``IPP_CLUSTER_ID`` in their environment. Finds the
    ones a tree walk misses: a controller's scheduler started just as a failed start-up
    stopped the controller, orphaned before anyone saw it."""
    needle = f"IPP_CLUSTER_ID={cluster_id}".encode()
    me, uid = os.getpid(), os.getuid()
    try:
        ns = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return []
    found = []
    for proc in psutil.process_iter(["uids"]):
        if proc.pid == me or proc.info["uids"] is None or proc.info["uids"].real != uid:
            continue
        try:
            if os.stat(f"/proc/{proc.pid}/ns/pid").st_ino != ns:
                continue  # another host's (or container's) process: not ours to touch
            with open(f"/proc/{proc.pid}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    found.append(proc)
        except OSError:
            continue
    return found
