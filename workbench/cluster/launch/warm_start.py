"""A local cluster's processes, started ahead of ``%wb start`` by the workbench kernel.

Most of a local start is two imports in two processes: ``import torch`` in the process
that forks the engines (``workbench.engine.zygote``, ~1.4 s on a 2-core machine) and
ipyparallel's controller (``cluster/launch/warm_controller.py``, ~0.6 s). The workbench kernel
(``workbench.kernel_launcher``, the "Python 3 (workbench)" kernel spec) starts both with
the kernel, so the imports run while the kernel starts and the user reads the notebook;
the first local cluster's launchers (launch/warm.py) take them over instead of
starting their own, and send each its command line (engine/warm_request.py).

A process is taken only where it is what the launcher would have started: the same
interpreter, and the environment the launcher gives it differing from the one it was
started with only in variables nothing it imported has read: ipyparallel's per-cluster
ones (``IPP_*``, read after the request) and those the kernel's own start-up sets after
it started (``KERNEL_SET``). Anything else (a variable the user set since, e.g. a thread
count numpy's BLAS or torch read at import) and it is stopped and a fresh one started.
It holds nothing a user made and listens on nothing; it reads one request from a pipe only
this kernel holds, and ends on its own when that pipe closes (the kernel exited, or
``stop`` was called).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from workbench.engine.zygote import WARM_FLAG

__all__ = [
    "ROLES",
    "WarmProcess",
    "compatible",
    "discard",
    "env_changes",
    "pop_outcomes",
    "spawn",
    "stop",
    "take",
    "warm",
]

# What ipyparallel puts in each launcher's environment (cluster id, profile dir, connection
# info): read by the controller's and the engines' applications, after the request.
PER_CLUSTER_PREFIX = "IPP_"
# Set by the kernel as it starts, after the warm processes were started: ipykernel's
# ZMQInteractiveShell.init_environment (terminal colours and pagers for subprocesses) and
# IPKernelApp (matplotlib's inline backend; nothing here imports matplotlib), and debugpy
# at its import (PYDEVD_USE_FRAME_EVAL=NO where unset: the forker's own import of the
# kernel's debugger support sets the same value in it).
KERNEL_SET = frozenset(
    {
        "TERM",
        "CLICOLOR",
        "CLICOLOR_FORCE",
        "FORCE_COLOR",
        "PAGER",
        "GIT_PAGER",
        "MPLBACKEND",
        "PYDEVD_USE_FRAME_EVAL",
    }
)
STOP_WAIT_S = 10.0
_HERE = os.path.dirname(os.path.abspath(__file__))  # workbench/cluster/launch
_PACKAGE = os.path.dirname(os.path.dirname(_HERE))  # workbench
# role -> the file run (with -P, as the launchers run it) and its arguments until the request.
ROLES: dict[str, list[str]] = {
    "engines": [os.path.join(_PACKAGE, "engine", "zygote.py"), WARM_FLAG],
    "controller": [os.path.join(_HERE, "warm_controller.py")],
}


@dataclass
class WarmProcess:
    """A process started ahead and the environment it was started with."""

    role: str
    process: subprocess.Popen[bytes]
    env: dict[str, str]
    started: float = field(default_factory=time.monotonic)

    def alive(self) -> bool:
        return self.process.poll() is None


_lock = threading.Lock()
_warm: dict[str, WarmProcess] = {}
# role -> what became of its warm process at the last take, for the start-up profile.
_outcomes: dict[str, str] = {}


def spawn(role: str) -> WarmProcess:
    """Start the ``role`` process now (one per kernel; while one waits, it is returned)."""
    if role not in ROLES:
        raise ValueError(f"role {role!r} is not one of {sorted(ROLES)}")
    with _lock:
        current = _warm.get(role)
        if current is not None and current.alive():
            return current
        env = dict(os.environ)
        process = subprocess.Popen(
            [sys.executable, "-P", *ROLES[role]],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
            start_new_session=True,  # as ipyparallel's launchers: no terminal signals
        )
        _warm[role] = WarmProcess(role, process, env)
        return _warm[role]


def warm(role: str) -> WarmProcess | None:
    """The ``role`` process waiting to be taken, if any (it may have exited since)."""
    return _warm.get(role)


def env_changes(started: Mapping[str, str], wanted: Mapping[str, str]) -> dict[str, str | None]:
    """What to set (a value) or remove (None) to turn ``started`` into ``wanted``."""
    changes: dict[str, str | None] = {k: v for k, v in wanted.items() if started.get(k) != v}
    changes.update({k: None for k in started if k not in wanted})
    return changes


def compatible(changes: Mapping[str, str | None]) -> bool:
    """True when no change touches what the process's imports may have read."""
    return all(key.startswith(PER_CLUSTER_PREFIX) or key in KERNEL_SET for key in changes)


def take(
    role: str, wanted_env: Mapping[str, str]
) -> tuple[subprocess.Popen[bytes], dict[str, str | None]] | None:
    """Hand the waiting ``role`` process to a launcher that would start one with
    ``wanted_env``: the process and the environment changes to send it; None (after
    stopping an unusable one) when there is none to take."""
    with _lock:
        current = _warm.pop(role, None)
    if current is None:
        return None
    changes = env_changes(current.env, wanted_env)
    usable = False
    if not current.alive():
        outcome = "not taken: it had exited"
    elif not compatible(changes):
        read = sorted(k for k in changes if not k.startswith(PER_CLUSTER_PREFIX))
        named = ", ".join(read[:3]) + (f" and {len(read) - 3} more" if len(read) > 3 else "")
        outcome = f"not taken: {named} changed since the kernel started"
    else:
        usable = True
        outcome = f"taken ({time.monotonic() - current.started:.1f} s after it was started)"
    with _lock:
        _outcomes[role] = outcome
    if usable:
        return current.process, changes
    _end(current)
    return None


def pop_outcomes() -> list[str]:
    """One line per role whose warm process a launcher looked at since the last call."""
    with _lock:
        outcomes = dict(_outcomes)
        _outcomes.clear()
    return [f"{role} started with the workbench kernel: {text}" for role, text in outcomes.items()]


def _end(warm_process: WarmProcess) -> None:
    """Close its pipe (it exits by itself once past its imports) and make sure it ends."""
    process = warm_process.process
    if process.stdin is not None:
        with contextlib.suppress(OSError):  # a pipe it already closed
            process.stdin.close()
    if process.poll() is None:
        process.terminate()  # our own child, by its pid
        try:
            process.wait(STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def discard(warm_process: WarmProcess) -> None:
    """Stop ``warm_process`` if it still waits to be taken (a taken one is its launcher's)."""
    with _lock:
        if _warm.get(warm_process.role) is not warm_process:
            return
        del _warm[warm_process.role]
    _end(warm_process)


def stop() -> None:
    """Stop every process still waiting to be taken (at the kernel's exit)."""
    with _lock:
        waiting = list(_warm.values())
        _warm.clear()
    for warm_process in waiting:
        _end(warm_process)


atexit.register(stop)
