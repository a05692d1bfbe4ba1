"""How a torchrun'd entry point of the workbench ends its process: without the interpreter's
finalization, once everything of its own is done.

torch 2.13 keeps a gloo process group's worker threads running after
``destroy_process_group`` while anything still holds the group, and after DDP or FSDP2 ran
something always does (DTensor's sharding caches; a group DDP used stays alive even once
the model and its reducer are freed). A worker that drops its last collective's tensor
while the interpreter finalizes must take the GIL of a dying interpreter, and the process
aborts: SIGABRT, "terminate called without an active exception", after all the training
was done (the mechanism torch's own abandoned fix, pytorch/pytorch#179291, describes; here
faulthandler showed the aborting thread was none of Python's). Under ``srun
--kill-on-bad-exit`` that one rank fails the whole job. Measured on this machine
(``benchmarks/gloo_exit_race.py``, ``results/gloo-exit-race``): with the group held past
``destroy_process_group``, 3 of 10 four-rank runs aborted; 0 of 10 with this exit; 0 of 10
with the group freed.

So the entry points (``python -m workbench.parallel.job``, ``python -m workbench.parallel``)
run their ``atexit`` handlers (logging's flush among them) and flush stdio themselves, then
leave with ``os._exit``: the same exit code, nothing lost, no finalization to race.
A user's script may end the same way; run by ``%wb run`` on an engine (or in a ``%%wb``
cell), where the process is the engine and must live on, the call ends only the script:
``SystemExit(code)``, which a script run takes as its process's exit.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
from typing import NoReturn

__all__ = ["exit_process"]


def exit_process(code: int) -> NoReturn:
    """End this process with ``code``: ``atexit`` handlers run and stdio flushed first
    (on an engine, in user code: end that code with ``SystemExit(code)``)."""
    guard = sys.modules.get("workbench.engine.group_guard")  # loaded on engines only
    if guard is not None and guard.user_code():
        raise SystemExit(code)
    atexit._run_exitfuncs()  # what a normal exit would have run, last registered first
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a closed or broken stream: nothing to flush
            stream.flush()
    os._exit(code)
