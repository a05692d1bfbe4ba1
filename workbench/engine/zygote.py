"""A local cluster's engines, forked from one process that imported torch once.

Every engine needs torch, and ``import torch`` (with ipyparallel's engine) is ~2.5 s of CPU
per process: on a small machine, n engines importing it side by side take n times that
from the same cores. Here one process imports it, then forks the n engines, which share
the imported modules (copy-on-write) and start registering at once. It runs as
``python -P .../workbench/engine/zygote.py N <ipengine args>``;
``workbench.cluster.launch.fork`` launches it.

Forking is safe at that point: no Python thread runs, no zmq context or event loop exists
yet, torch's own thread pools start with the first parallel op, and the one native thread
pool an import starts (numpy's OpenBLAS, unless OMP_NUM_THREADS=1) shuts itself down
around a fork (pthread_atfork) and starts again in each engine when used. Each engine
reseeds Python's (and numpy's) global random state, so ranks do not share one stream.

Started ahead (``zygote.py --warm``, by the workbench kernel: cluster/launch/warm_start.py), it
imports torch and then waits on its stdin for its command line (``N <ipengine args>``),
environment, working directory and output file (engine/warm_request.py), which the kernel
writes when ``%wb start`` launches the engines. End of input before a request (the kernel
ended or gave it up) ends it.

With ``--standby DIR`` first (``zygote.py [--warm] [--standby DIR] N ...``), it forks a standby
forker right after its engines, which a replacement engine's launcher takes
(engine/standby.py).

This process stays until every engine it forked has exited (reaping them; exiting with the
first non-zero status), and passes SIGTERM, SIGINT and SIGHUP on to them: to ipyparallel it
is one launcher holding n engines, as mpiexec is.
"""

from __future__ import annotations

import os
import signal
import sys
import time

from workbench.engine import standby
from workbench.engine.boot import FORKED_ENV, STARTED_ENV
from workbench.engine.warm_request import await_request

__all__ = ["FORWARDED", "WARM_FLAG", "main"]

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
WARM_FLAG = "--warm"


def _preload() -> None:
    # Besides torch and ipyparallel's engine: what each engine imported after the fork on
    # its own, ~0.1 s of CPU each, the kernel's debugger support (ipykernel.debugger:
    # debugpy, ~120 modules; no thread starts at import), its history database (sqlite3),
    # and the collective tracer that joining the process group starts.
    import sqlite3  # noqa: F401

    import ipykernel.debugger  # noqa: F401
    import ipyparallel.engine.app  # noqa: F401
    import torch
    import torch.distributed

    import workbench.engine.process_group  # (the first request imports it)
    import workbench.trace.comm  # noqa: F401

    del torch


def _reseed() -> None:
    """A forked engine's own random streams (a fork copies the parent's state)."""
    import random

    random.seed()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()


def _engine(started: float, args: list[str]) -> None:
    """In a forked child: become an engine (never returns to the forking loop)."""
    for sig in FORWARDED:
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.environ[STARTED_ENV] = repr(started)  # when the process this engine runs in began
    os.environ[FORKED_ENV] = repr(time.time())  # torch imported, the engine starts now
    _reseed()
    sys.argv = [sys.argv[0], *args]
    from ipyparallel.engine.app import main as engine_main

    engine_main()
    sys.exit(0)


def _fork_engines(started: float, argv: list[str]) -> set[int]:
    """Fork ``argv[0]`` engines running ``argv[1:]``; signals to this process reach them.
    Returns their pids (in the engines themselves it never returns)."""
    n, args = int(argv[0]), argv[1:]
    children: set[int] = set()
    me = os.getpid()

    def forward(sig: int, _frame: object) -> None:
        if os.getpid() != me:  # a child between its fork and its own handlers
            return
        for pid in list(children):
            try:
                os.kill(pid, sig)
            except OSError:  # exited meanwhile
                continue

    for sig in FORWARDED:
        signal.signal(sig, forward)
    for _ in range(n):
        pid = os.fork()
        if pid == 0:
            _engine(started, args)
        children.add(pid)
    return children


def _reap(children: set[int]) -> int:
    """Wait for every engine; the first non-zero exit status (a signal as 128 + number)."""
    code = 0
    while children:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            break
        children.discard(pid)
        exit_code = os.waitstatus_to_exitcode(status)
        if exit_code and not code:
            code = exit_code if exit_code > 0 else 128 - exit_code
    return code


def main() -> None:
    started = time.time()
    owner = os.getppid()  # the kernel: a standby not taken ends once it has gone
    argv = sys.argv[1:]
    warm = argv[:1] == [WARM_FLAG]
    _preload()
    if warm:
        argv = await_request()
    while True:
        standby_dir, argv = standby.split_args(argv)
        children = _fork_engines(started, argv)
        taken = standby.fork_standby(standby_dir, owner) if standby_dir else None
        if taken is None:
            break
        # This process is the standby, now a replacement's forker: fork as it asks.
        argv, started = taken, time.time()
    sys.exit(_reap(children))


if __name__ == "__main__":
    main()
