"""A local cluster's spare forker: a replacement engine forked warm (issue 31 item 4).

After a dead rank, most of a recovery was the replacement engine's start: a new forking
process (``workbench.engine.zygote``) imported torch again (~1.8 s on a 2-core machine)
before it forked the one engine. A spare started ahead in the warm-start way did that import
right after the cluster's start, on the cores the first cells use (a cold start 1.4x
slower), and a fault soon after the start still waited for it.

Now the engines' forker itself forks the spare after its engines (engine/spare.py): no
import, milliseconds. The kernel gives each local cluster it owns a private directory with
a FIFO (``prepare``, before the engines launch; the launcher passes ``--spare DIR``); the
replacement's launcher (launch/fork.py) takes the spare that waits there (``take``): it
writes the warm-start request (engine/warm_request.py) to the FIFO and treats the spare as
the process it would have started. The spare then forks the engine, and the next spare.

A spare is taken only where it is what the launcher would have started: the environment
the launcher gives it differs from the one its forker got only in what ``warm_start``
allows (``warm_start.compatible``); else the launcher starts a fresh forker. The cluster's
stop ends a spare still waiting and removes the directory (``end``); a spare whose kernel
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

from workbench.cluster import warm_start
from workbench.engine import zygote
from workbench.engine.spare import FIFO, PID, SPARE_FLAG
from workbench.engine.warm_request import request_line

__all__ = ["Spare", "end", "launched", "prepare", "spare_args", "take", "waiting_pid"]

log = logging.getLogger("workbench.cluster")

END_WAIT_S = 10.0


@dataclass
class Spare:
    """A cluster's spare directory, and the environment the spare's forker was started
    with (set once the engines' launcher started it)."""

    directory: str
    env: dict[str, str] = field(default_factory=dict)


_spares: dict[str, Spare] = {}  # directory -> its spare (the launchers know the directory)


def prepare(launcher: str, owns: bool, parent: str | None = None) -> Spare | None:
    """The spare directory of a local cluster this kernel owns (None elsewhere, or where
    none can be made: a replacement then starts its own forker). ``parent``: the cluster's
    run directory, which the orphan watchdog removes when the kernel dies without a stop
    (and with it the directory, which ends a spare waiting there)."""
    if launcher != "local" or not owns:
        return None
    directory = ""
    try:
        directory = tempfile.mkdtemp(prefix="wb-spare-", dir=parent)
        os.mkfifo(os.path.join(directory, FIFO), 0o600)
    except OSError as exc:  # only a speed-up
        log.warning("no spare forker for replacement engines: %s", exc)
        if directory:
            shutil.rmtree(directory, ignore_errors=True)
        return None
    spare = _spares[directory] = Spare(directory)
    return spare


def spare_args(directory: str) -> list[str]:
    """The forker's arguments that make it fork a spare into ``directory``."""
    return [SPARE_FLAG, directory] if directory else []


def launched(directory: str, env: Mapping[str, str]) -> None:
    """The forker of ``directory``'s spares was started with ``env``."""
    spare = _spares.get(directory)
    if spare is not None:
        spare.env = dict(env)


def waiting_pid(directory: str) -> int | None:
    """The pid of the spare waiting in ``directory``, if one does."""
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
    """Start ``launcher`` (launch/fork.py) as the spare waiting in its ``spare_dir``, running
    ``args`` with ``env``; False (nothing started) where none may be taken."""
    spare = _spares.get(launcher.spare_dir)
    pid = waiting_pid(spare.directory) if spare is not None else None
    if spare is None or pid is None:
        return False
    changes = warm_start.env_changes(spare.env, env)
    if not warm_start.compatible(changes):
        _end_pid(pid)  # its imports may have read what changed; the fresh forker forks anew
        return False
    with contextlib.suppress(OSError):
        os.unlink(os.path.join(spare.directory, PID))  # taken once
    cwd, output = os.path.abspath(launcher.work_dir), os.path.abspath(launcher.output_file)
    try:
        fd = os.open(os.path.join(spare.directory, FIFO), os.O_WRONLY | os.O_NONBLOCK)
    except OSError:  # no reader: it ended since its pid was written
        return False
    try:
        os.set_blocking(fd, True)
        with os.fdopen(fd, "wb", closefd=False) as pipe:
            pipe.write(request_line(args, changes, cwd, output))
    finally:
        os.close(fd)
    spare.env = dict(env)  # its own spare will be forked with it
    launcher.adopt(pid)
    return True


def _end_pid(pid: int) -> None:
    """End a waiting spare (ours: its command line was checked) and wait for it."""
    try:
        proc = psutil.Process(pid)
        proc.send_signal(signal.SIGTERM)
        proc.wait(END_WAIT_S)
    except psutil.TimeoutExpired:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    except psutil.Error:
        pass


def end(spare: Spare | None) -> None:
    """End the spare of a cluster if one still waits (a taken one is its launcher's) and
    remove its directory (a spare being forked meanwhile sees it gone and ends)."""
    if spare is None:
        return
    _spares.pop(spare.directory, None)
    pid = waiting_pid(spare.directory)
    if pid is not None:
        _end_pid(pid)
    shutil.rmtree(spare.directory, ignore_errors=True)
