"""Processes a cluster started: reaping them after a stop."""

from __future__ import annotations

import time

import psutil

__all__ = ["reap"]


def reap(processes: list[psutil.Process], grace: float = 1.0) -> None:
    """Wait for processes to exit after a stop; kill any that outlive ``grace`` seconds.

    By then the engines have left the process group and exited. A zombie counts as gone:
    it has exited, and its reaping belongs to whoever its parent now is.
    """

    def running(proc: psutil.Process) -> bool:
        try:
            return proc.status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False

    deadline = time.monotonic() + grace
    alive = [p for p in processes if running(p)]
    while alive and time.monotonic() < deadline:
        time.sleep(0.05)
        alive = [p for p in alive if running(p)]
    for proc in alive:
        try:
            proc.kill()
        except psutil.Error:
            continue
