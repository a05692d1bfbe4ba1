"""Kernel-side marks for ``first_fault_profile.py``: imported in the profiled kernel by a
cell, it wraps the workbench's own functions there and notes wall-clock times
(``time.time()``, comparable with what a rank writes), first of each name kept.

- ``no_spare()`` (a cell before ``%wb start``): the cluster starts no spare forker, the way
  the code before the spare forker did;
- ``watch_spare()`` (a cell before ``%wb start``): marks when a spare forker is started and
  when it is past its imports (waiting on its pipe: ``/proc/PID/wchan``);
- ``install()`` (a cell after the start): marks from the dead cell to its error, and of a
  recovery's steps; ``dump()`` prints them (and the survivor's status file) as one JSON line.
"""

from __future__ import annotations

import functools
import json
import os
import threading
import time
from collections.abc import Callable
from typing import Any

__all__ = ["dump", "install", "no_spare", "watch_spare"]

MARKS: dict[str, float] = {}
SPARE: dict[str, float] = {}  # the spare forker's own marks, kept across install()
_UNDO: list[Callable[[], None]] = []
READY_WCHAN = ("pipe_read", "pipe_wait", "wait_woken")  # blocked reading its request


def mark(name: str) -> None:
    MARKS.setdefault(name, time.time())


def _wrap(owner: Any, name: str, before: str, after: str) -> None:
    original = getattr(owner, name)

    @functools.wraps(original)
    def timed(*args: Any, **kwargs: Any) -> Any:
        mark(before)
        try:
            return original(*args, **kwargs)
        finally:
            mark(after)

    setattr(owner, name, timed)
    _UNDO.append(lambda: setattr(owner, name, original))


def _wrap_async(owner: Any, name: str, label: str) -> None:
    original = getattr(owner, name)

    async def timed(*args: Any, **kwargs: Any) -> Any:
        mark(f"{label}: start")
        try:
            return await original(*args, **kwargs)
        finally:
            mark(f"{label}: end")

    setattr(owner, name, timed)
    _UNDO.append(lambda: setattr(owner, name, original))


def no_spare() -> None:
    """Start no spare forker (the code before it): recovery starts its own forker. Both
    forms: a spare started after the start (``keep_ready``, before issue 31's profile) and
    one forked by the engines' forker (``prepare``)."""
    from workbench.cluster.launch import standby

    if hasattr(standby, "keep_ready"):
        standby.keep_ready = lambda engines: None
    if hasattr(standby, "prepare"):
        standby.prepare = lambda *args: None


def _spare_ready(pid: int) -> None:
    """Mark once process ``pid`` blocks reading its request (its imports are done)."""
    path = f"/proc/{pid}/wchan"
    while True:
        try:
            with open(path) as f:
                wchan = f.read().strip()
        except OSError:
            return
        if wchan in READY_WCHAN:
            SPARE.setdefault(f"spare {pid}: imports done", time.time())
            return
        time.sleep(0.01)


def _spare_waits(directory: str) -> None:
    """Mark once a spare forked by the engines' forker waits in ``directory``."""
    from workbench.engine.standby import PID

    while os.path.isdir(directory):
        if os.path.exists(os.path.join(directory, PID)):
            SPARE.setdefault("spare fork: waiting", time.time())
            return
        time.sleep(0.01)


def watch_spare() -> None:
    """Mark a spare forker's start and the end of its imports (a spare started ahead), or
    when the spare forked by the engines' forker waits."""
    from workbench.cluster.launch import standby, warm_start

    prepare = getattr(standby, "prepare", None)
    if prepare is not None:

        def prepared(*args: Any) -> Any:
            spare = prepare(*args)
            if spare is not None:
                SPARE["spare fork: directory made"] = time.time()
                threading.Thread(target=_spare_waits, args=(spare.directory,), daemon=True).start()
            return spare

        standby.prepare = prepared

    original = warm_start.spawn

    def spawn(role: str) -> Any:
        mark("spare: spawned")
        process = original(role)
        SPARE[f"spare {process.process.pid}: spawned"] = time.time()
        threading.Thread(target=_spare_ready, args=(process.process.pid,), daemon=True).start()
        return process

    warm_start.spawn = spawn


def _watch_client(cluster: Any, stop: threading.Event) -> None:
    client = cluster.engines.client_unchecked()
    ids = set(client.ids)
    while not stop.is_set():
        if set(client.ids) != ids:
            mark("client: engine gone" if set(client.ids) < ids else "client: engine id changed")
            ids = set(client.ids)
        time.sleep(0.001)


def shell_of() -> Any:
    from IPython import get_ipython

    return get_ipython()


def _cell_events() -> None:
    """Mark when the kernel starts and ends a ``%%wb`` / ``%wb restart`` cell."""
    from IPython import get_ipython

    shell = get_ipython()
    if shell is None:
        return

    def pre(info: Any) -> None:
        if "%wb" in (info.raw_cell or ""):
            mark("kernel: cell starts")

    def post(result: Any) -> None:
        if "%wb" in (result.info.raw_cell or ""):
            mark("kernel: cell ends")

    shell.events.register("pre_run_cell", pre)
    shell.events.register("post_run_cell", post)
    _UNDO.append(lambda: shell.events.unregister("pre_run_cell", pre))
    _UNDO.append(lambda: shell.events.unregister("post_run_cell", post))


def install() -> None:
    """Clear the marks and wrap the dead cell's and the recovery's steps."""
    from workbench.cluster import Cluster
    from workbench.cluster.dispatch import fail_wait
    from workbench.cluster.dispatch import rank_dispatch as dispatch
    from workbench.cluster.lifecycle import engine_watch, recovery

    for undo in _UNDO:
        undo()
    _UNDO.clear()
    MARKS.clear()
    _wrap(engine_watch.EngineWatch, "_report", "watch: exit seen", "watch: told controller")
    _wrap(dispatch.RankDispatch, "execute", "execute: start", "execute: end")
    _wrap(dispatch.RankDispatch, "_wait_all", "wait: start", "wait: over")
    _wrap(dispatch.RankDispatch, "_lost_error", "error: building", "error: built")
    look = fail_wait.Seen.look

    def seen_look(self: Any, index: int, status: Any) -> None:
        look(self, index, status)
        mark("seen: survivor counted" if index in self.ranks else "seen: survivor not yet")

    fail_wait.Seen.look = seen_look  # type: ignore[method-assign]
    _UNDO.append(lambda: setattr(fail_wait.Seen, "look", look))
    from workbench.cluster import cluster as cluster_module
    from workbench.magics import cluster_cmds

    _wrap(Cluster, "recover_sync", "recover_sync: called", "recover_sync: returned")
    _wrap(cluster_cmds, "_session_on", "magic: session looked up", "magic: session found")
    _wrap(Cluster, "check_controller", "check_controller: start", "check_controller: end")
    _wrap(shell_of(), "showtraceback", "ipython: traceback start", "ipython: traceback shown")
    _wrap_async(cluster_module, "recover_engines", "recover")
    for name, label in {
        "_kill_local": "kill unresponsive",
        "_start_replacements": "launcher start",
        "new_engines": "replacement registered + facts",
        "_free_stuck": "free stuck",
        "regroup": "regroup",
    }.items():
        _wrap_async(recovery, name, label)
    _cell_events()
    stop = threading.Event()
    threading.Thread(target=_watch_client, args=(Cluster.latest(), stop), daemon=True).start()
    _UNDO.append(stop.set)


def dump(label: str) -> None:
    """Print the marks (and rank 0's status file) as one JSON line after ``label``."""
    from workbench.cluster import Cluster
    from workbench.cluster.dispatch import hang

    cluster = Cluster.latest()
    status = hang.read_status(cluster.engines.run_dir, 0) if cluster is not None else None
    print(label + json.dumps({"marks": MARKS, "spare": SPARE, "rank0_status": status}, default=str))
