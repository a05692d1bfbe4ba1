"""Process checks shared by the tests that verify nothing is left running."""

from __future__ import annotations

import psutil

__all__ = ["alive"]


def alive(pids: list[int]) -> list[int]:
    """The pids that still run (a zombie has exited: it does not count)."""
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            continue
    return out
