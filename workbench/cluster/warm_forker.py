"""A local cluster's engine forker, started ahead of ``%wb start`` by the workbench kernel.

The slowest step of a local start is the one ``import torch`` in the process that forks the
engines (``workbench.engine.zygote``, ~1.4 s of a ~2.7 s start on a 2-core machine). The
workbench kernel (``workbench.kernel_launcher``, the "Python 3 (workbench)" kernel spec)
starts that process with the kernel, so the import runs while the kernel starts and the
user reads the notebook; the first local cluster's launcher (fork_launcher.py) takes it
over instead of starting its own.

It is taken only where it is what the launcher would have started: the same interpreter,
and the environment the launcher gives the engines differing from the one it was started
with only in variables nothing it imported has read: ipyparallel's per-cluster ones
(``IPP_*``, read by the engine after the fork) and those the kernel's own start-up sets
after the forker started (``KERNEL_SET``). Anything else (a variable the user set since,
e.g. a thread count numpy's BLAS or torch read at import) and it is stopped and a fresh
one started. It holds nothing a user
made and listens on nothing; it reads one request from a pipe only this kernel holds, and
ends on its own when that pipe closes (the kernel exited, or ``stop`` was called).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import subprocess
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["WarmForker", "request_line", "spawn", "stop", "take", "warm"]

# What ipyparallel puts in each launcher's environment (cluster id, profile dir, connection
# info): read by the engine's application after the fork, never at torch's import.
PER_CLUSTER_PREFIX = "IPP_"
# Set by the kernel as it starts, after the forker was started: ipykernel's
# ZMQInteractiveShell.init_environment (terminal colours and pagers for subprocesses) and
# IPKernelApp (matplotlib's inline backend; the forker imports no matplotlib), and debugpy
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


@dataclass
class WarmForker:
    """A started forker and the environment it was started with."""

    process: subprocess.Popen[bytes]
    env: dict[str, str]

    def alive(self) -> bool:
        return self.process.poll() is None


_lock = threading.Lock()
_warm: WarmForker | None = None


def _zygote_file() -> str:
    # The file itself, run with -P as fork_launcher runs it; found without importing the
    # engine package here (this runs before the kernel's own imports).
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return os.path.join(package, "engine", "zygote.py")


def spawn() -> WarmForker:
    """Start a forker now (once per kernel; a second call returns the first one)."""
    global _warm
    with _lock:
        if _warm is not None and _warm.alive():
            return _warm
        env = dict(os.environ)
        process = subprocess.Popen(
            [sys.executable, "-P", _zygote_file(), "--warm"],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
            start_new_session=True,  # as ipyparallel's launchers: no terminal signals
        )
        _warm = WarmForker(process, env)
    return _warm


def warm() -> WarmForker | None:
    """The forker waiting to be taken, if any (it may have exited since)."""
    return _warm


def env_changes(started: Mapping[str, str], wanted: Mapping[str, str]) -> dict[str, str | None]:
    """What to set (a value) or remove (None) to turn ``started`` into ``wanted``."""
    changes: dict[str, str | None] = {k: v for k, v in wanted.items() if started.get(k) != v}
    changes.update({k: None for k in started if k not in wanted})
    return changes


def compatible(changes: Mapping[str, str | None]) -> bool:
    """True when no change touches what the forker's imports may have read."""
    return all(key.startswith(PER_CLUSTER_PREFIX) or key in KERNEL_SET for key in changes)


def take(
    wanted_env: Mapping[str, str],
) -> tuple[subprocess.Popen[bytes], dict[str, str | None]] | None:
    """Hand the warm forker to a launcher that would start one with ``wanted_env``: the
    process and the environment changes to send it; None (after stopping an unusable one)
    when there is none to take."""
    global _warm
    with _lock:
        forker, _warm = _warm, None
    if forker is None:
        return None
    changes = env_changes(forker.env, wanted_env)
    if not forker.alive() or not compatible(changes):
        _end(forker)
        return None
    return forker.process, changes


def request_line(
    n: int, args: list[str], env: Mapping[str, str | None], cwd: str, output: str
) -> bytes:
    """The one request a warm forker reads (see ``zygote._await_request``)."""
    request = {"n": n, "args": args, "env": dict(env), "cwd": cwd, "output": output}
    return (json.dumps(request) + "\n").encode()


def _end(forker: WarmForker) -> None:
    """Close its pipe (it exits by itself once torch is imported) and make sure it ends."""
    process = forker.process
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


def stop() -> None:
    """Stop the forker waiting to be taken (at the kernel's exit; nothing if none)."""
    global _warm
    with _lock:
        forker, _warm = _warm, None
    if forker is not None:
        _end(forker)


atexit.register(stop)
