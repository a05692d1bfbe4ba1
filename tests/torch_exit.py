"""torch 2.13's abort at the end of a user's DDP script under torchrun, told apart from a
failure of what a test checks.

A gloo group DDP used outlives ``destroy_process_group``; a worker thread of it that drops
its last tensor while the interpreter finalizes aborts the process after all the script's
work is done: SIGABRT, "terminate called without an active exception"
(``workbench/parallel/process_exit.py``; ``benchmarks/gloo_exit_race.py`` measures it).
The workbench's own entry points end through ``exit_process`` and are held to exit 0. A
user's script (tests/cluster/scripts/migration_ddp.py stands for one) is run unchanged, so
a run of it that failed with exactly that abort is run once more, and says so on stderr.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TypeVar

__all__ = ["ABORT", "once_more_after_torch_abort"]

ABORT = "terminate called without an active exception"
Run = TypeVar("Run")


def once_more_after_torch_abort(
    run: Callable[[], Run], outcome: Callable[[Run], tuple[int, str]], what: str
) -> Run:
    """``run()``, and once more when its ``outcome`` (exit code, output) is torch's abort."""
    first = run()
    code, output = outcome(first)
    if code == 0 or ABORT not in output:
        return first
    print(f"{what}: torch aborted at exit (exit {code}, {ABORT!r}); run once more", file=sys.stderr)
    return run()
