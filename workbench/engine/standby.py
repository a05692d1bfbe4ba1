"""A standby forker: a fork of a local cluster's engine forker, past its imports, waiting to
become the forker of a replacement engine (issue 31).

A replacement engine's start used to import torch again in a new forking process (~1.8 s
of a recovery on a 2-core machine), or waited for a standby started after the cluster's start
to finish that import, on the cores the first cells use (a cold start 1.4x slower). Here
the forker (engine/zygote.py, run with ``--standby DIR``) forks the standby right after its
engines: a copy of a process that has imported everything, made in milliseconds, sharing
its memory until written.

``DIR`` is a private directory the kernel made (cluster/launch/standby.py) holding a FIFO
(``FIFO``). The standby is the forker's child but not one of its engines (the forker passes
signals to its engines only, and exits once they have); it starts a session of its own,
opens the FIFO, writes its pid (``PID``) and waits for one request line
(engine/warm_request.py) from the launcher of a replacement engine. The request makes it a
forker with ``--standby DIR`` again, so it forks the next standby after its engine. Without a
request it ends once the kernel that started the cluster has exited or ``DIR`` is gone
(the cluster's stop removes it), looked at every ``CHECK_S``. Standard library only.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal

from workbench.engine.warm_request import apply_request

__all__ = ["CHECK_S", "FIFO", "PID", "STANDBY_FLAG", "fork_standby", "split_args"]

STANDBY_FLAG = "--standby"
FIFO = "request.fifo"
PID = "standby.pid"
CHECK_S = 0.5  # how often a waiting standby looks whether its kernel and directory remain
_DEFAULT = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)  # the forker passes these on


def split_args(argv: list[str]) -> tuple[str | None, list[str]]:
    """``[--standby DIR] N ARGS...`` -> (DIR or None, ``[N, ARGS...]``)."""
    if argv[:1] == [STANDBY_FLAG] and len(argv) >= 2:
        return argv[1], argv[2:]
    return None, argv


def fork_standby(directory: str, owner: int) -> list[str] | None:
    """In the forker, after its engines: fork the standby. Returns None in the forker; in the
    standby, once a launcher took it, the request's arguments (it then forks as asked). A
    standby that is not taken exits here."""
    if os.fork():
        return None
    try:
        for sig in _DEFAULT:  # the forker's handlers pass signals to its engines
            signal.signal(sig, signal.SIG_DFL)
        os.setsid()
        line = _await_line(directory, owner)
        if line is None:
            os._exit(0)
        return apply_request(line)
    except BaseException:  # e.g. the directory removed under it: nobody will take it
        os._exit(1)


def _wanted(directory: str, owner: int) -> bool:
    """The kernel that started the cluster still runs, and the cluster still has it."""
    try:
        os.kill(owner, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists (as another user): not ours to judge
        pass
    return os.path.isdir(directory)


def _await_line(directory: str, owner: int) -> str | None:
    """Open the FIFO, say where this standby is, and read one request line (None: not taken)."""
    path = os.path.join(directory, FIFO)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # no writer needed to open
    try:
        _write_pid(directory)
        data = b""
        while True:
            ready, _, _ = select.select([fd], [], [], CHECK_S)
            if not ready:
                if not _wanted(directory, owner):
                    return None
                continue
            chunk = os.read(fd, 65536)
            data += chunk
            if b"\n" in data or (not chunk and data):
                return data.split(b"\n", 1)[0].decode()
            if not chunk:  # a writer came and went with nothing: wait for the next one
                os.close(fd)
                fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    finally:
        with contextlib.suppress(OSError):
            os.close(fd)


def _write_pid(directory: str) -> None:
    """Written once the FIFO is open for reading: a launcher that reads it finds a reader."""
    tmp = os.path.join(directory, f".{PID}.{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(str(os.getpid()))
    os.replace(tmp, os.path.join(directory, PID))
