"""The launcher of a local cluster's engines: one process that imports torch once and forks
them all (``workbench.engine.zygote``).

To ipyparallel it is one launcher holding n engines, as mpiexec is: its process is the
forking one, the engines are its children, and a signal sent to it reaches every engine.
Where the workbench kernel started the forking process ahead (warm_forker.py), the
launcher takes that one over instead of starting another: the same command, already past
its torch import.

The kernel learns each engine's own pid from the engine (``engine_info``) and watches and
signals it by that pid (engine_watch.py, signals.py).
"""

from __future__ import annotations

import os
import sys
from typing import Any

import psutil
from ipyparallel.cluster.launcher import LocalEngineLauncher
from traitlets import default

from workbench.cluster import warm_forker
from workbench.cluster.processes import running
from workbench.engine import zygote

__all__ = ["ForkEngineSetLauncher"]


class ForkEngineSetLauncher(LocalEngineLauncher):
    """``n`` local engines forked from one process after it imported torch."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._seen: dict[int, psutil.Process] = {}

    @default("engine_cmd")
    def _zygote_cmd(self) -> list[str]:
        # Run as a file (-P: its directory stays off sys.path), not with -m: that would
        # import the workbench.engine package's parents first.
        return [sys.executable, "-P", zygote.__file__]

    def find_args(self) -> list[str]:
        return [*self.engine_cmd, str(self.n), *self.cluster_args, *self.engine_args]

    def start(self, n: int) -> Any:  # type: ignore[override]
        self.n = n
        env = {**os.environ, **self.get_env()}
        taken = warm_forker.take(env) if self.state == "before" else None
        if taken is None:
            return super().start()
        process, changes = taken
        args = [*self.cluster_args, *self.engine_args]
        cwd, output = os.path.abspath(self.work_dir), os.path.abspath(self.output_file)
        line = warm_forker.request_line(n, args, changes, cwd, output)
        assert process.stdin is not None  # started with a pipe (warm_forker.spawn)
        process.stdin.write(line)
        process.stdin.close()
        # What LocalProcessLauncher.start does once its own Popen has returned.
        self._popen_process = process
        self.pid = process.pid
        self.process = psutil.Process(process.pid)
        self.notify_start(process.pid)
        self._start_waiting()
        return None

    def engine_exited(self) -> bool:
        """True once one of the engines forked so far has exited (seen while the
        cluster starts: ``start_sequence.engines_exited`` asks every 20 ms)."""
        proc = self.process
        if proc is None:
            return False
        try:
            for child in proc.children():
                self._seen.setdefault(child.pid, child)
        except psutil.Error:  # the forking process itself is gone: its state says so
            pass
        return not all(running(child) for child in self._seen.values())
