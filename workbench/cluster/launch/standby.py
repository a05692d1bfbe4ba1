"""A local cluster's standby: a replacement engine forked warm (issue 31 item 4).

(The pre-forked warm process is the standby; a spare *host*, ``spare_hosts=``, is another
thing: hosts/spare_hosts.py.)

After a dead rank, most of a recovery was the replacement engine's start: a new forking
process (``workbench.engine.zygote``) imported torch again (~1.8 s on a 2-core machine)
before it forked the one engine. A standby started ahead in the warm-start way did that import
right after the cluster's start, on the cores the first cells use (a cold start 1.4x
slower), and a fault soon after the start still waited for it.

Now the engines' forker itself forks the standby after its engines (the engine side): no
import, milliseconds. The kernel gives each local cluster it owns a private directory with
a FIFO (``prepare``, before the engines launch; the launcher passes it: ``standby_args``); the
replacement's launcher (launch/fork.py) takes the standby that waits there (``take``): it
writes the warm-start request (engine/warm_request.py) to the FIFO and treats the standby as
the process it would have started. The standby then forks the engine, and the next standby.

A standby is taken only where it is what the launcher would have started: the environment
the launcher gives it differs from the one its forker got only in what ``warm_start``
allows (``warm_start.compatible``); else the launcher starts a fresh forker. The cluster's
stop ends a standby still waiting and removes the directory (``end``); a standby whose kernel
exited ends by itself.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import psutil

from workbench.cluster.launch import warm_start
from workbench.engine import zygote
from workbench.engine.standby import FIFO, PID, STANDBY_FLAG
from workbench.engine.warm_request import request_line

__all__ = ["Standby", "end", "launched", "prepare", "standby_args", "take", "waiting_pid"]

log = logging.getLogger("workbench.cluster")

END_WAIT_S = 10.0


@dataclass
class Standby:
    """A cluster's standby directory, and the environment the standby's forker was started
    with (set once the engines' launcher started it)."""

    directory: str
    env: dict[str, str] = field(default_factory=dict)


_standbys: dict[str, Standby] = {}  # directory -> its standby (the launchers know it)


def prepare(launcher: str, owns: bool, parent: str | None = None) -> Standby | None:
    """The standby directory of a local cluster this kernel owns (None elsewhere, or where
    none can be made: a replacement then starts its own forker). ``parent``: the cluster's
    run directory, which the orphan watchdog removes when the kernel dies without a stop
    (and with it the directory, which ends a standby waiting there)."""
    if launcher != "local" or not owns:
        return None
    directory = ""
    try:
        directory = tempfile.mkdtemp(prefix="wb-standby-", dir=parent)
        os.mkfifo(os.path.join(directory, FIFO), 0o600)
    except OSError as exc:  # only a speed-up
        log.warning("no standby forked for replacement engines: %s", exc)
        if directory:
            shutil.rmtree(directory, ignore_errors=True)
        return None
    standby = _standbys[directory] = Standby(directory)
    return standby


def standby_args(directory: str) -> list[str]:
    """The forker's arguments that make it fork a standby into ``directory``."""
    return [STANDBY_FLAG, directory] if directory else []


def launched(directory: str, env: Mapping[str, str]) -> None:
    """The forker of ``directory``'s standbys was started with ``env``."""
    standby = _standbys.get(directory)
    if standby is not None:
        standby.env = dict(env)


def waiting_pid(directory: str) -> int | None:
    """The pid of the standby waiting in ``directory``, if one does."""
    try:
        with open(os.path.join(directory, PID)) as f:
            pid = int(f.read().strip())
        # a fork keeps its forker's command line: never a reused pid of something else
        if zygote.__file__ in psutil.Process(pid).cmdline():
            return pid
    except (OSError, ValueError, psutil.Error):
        pass
    return None


def take(launcher: Any, args: list[str], env: Mapping[str, str]) -> bool:
    """Start ``launcher`` (launch/fork.py) as the standby waiting in its ``standby_dir``, running
    ``args`` with ``env``; False (nothing started) where none may be taken."""
    standby = _standbys.get(launcher.standby_dir)
    pid = waiting_pid(standby.directory) if standby is not None else None
    if standby is None or pid is None:
        return False
    changes = warm_start.env_changes(standby.env, env)
    if not warm_start.compatible(changes):
        _end_pid(pid)  # its imports may have read what changed; the fresh forker forks anew
        return False
    with contextlib.suppress(OSError):
        os.unlink(os.path.join(standby.directory, PID))  # taken once
    cwd, output = os.path.abspath(launcher.work_dir), os.path.abspath(launcher.output_file)
    try:
        fd = os.open(os.path.join(standby.directory, FIFO), os.O_WRONLY | os.O_NONBLOCK)
    except OSError:  # no reader: it ended since its pid was written
        return False
    try:
        os.set_blocking(fd, True)
        with os.fdopen(fd, "wb", closefd=False) as pipe:
            pipe.write(request_line(args, changes, cwd, output))
    finally:
        os.close(fd)
    standby.env = dict(env)  # its own standby will be forked with it
    launcher.adopt(pid)
    return True


def _end_pid(pid: int) -> None:
    """End a waiting standby (ours: its command line was checked) and wait for it."""
    try:
        proc = psutil.Process(pid)
        proc.send_signal(signal.SIGTERM)
        proc.wait(END_WAIT_S)
    except psutil.TimeoutExpired:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    except psutil.Error:
        pass


def end(standby: Standby | None) -> None:
    """End the standby of a cluster if one still waits (a taken one is its launcher's) and
    remove its directory (a standby being forked meanwhile sees it gone and ends)."""
    if standby is None:
        return
    _standbys.pop(standby.directory, None)
    pid = waiting_pid(standby.directory)
    if pid is not None:
        _end_pid(pid)
    shutil.rmtree(standby.directory, ignore_errors=True)
