"""The launcher of a local cluster's engines: one process that imports torch once and forks
them all (``workbench.engine.zygote``).

To ipyparallel it is one launcher holding n engines, as mpiexec is: its process is the
forking one, the engines are its children, and a signal sent to it reaches every engine.
Where the workbench kernel started the forking process ahead (warm_start.py), the
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
from traitlets import Unicode, default

from workbench.cluster.launch import standby
from workbench.cluster.launch.warm import Adopting, start_warm
from workbench.cluster.processes import running
from workbench.engine import zygote

__all__ = ["ForkEngineSetLauncher"]


class ForkEngineSetLauncher(Adopting, LocalEngineLauncher):
    """``n`` local engines forked from one process after it imported torch."""

    standby_dir = Unicode(
        "", config=True, help="where the forker forks a standby for replacements (standby.py)"
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._seen: dict[int, psutil.Process] = {}

    @default("engine_cmd")
    def _zygote_cmd(self) -> list[str]:
        # Run as a file (-P: its directory stays off sys.path), not with -m: that would
        # import the workbench.engine package's parents first.
        return [sys.executable, "-P", zygote.__file__]

    def _forker_args(self) -> list[str]:
        ahead = standby.standby_args(self.standby_dir) if self._default_cmd() else []
        return [*ahead, str(self.n), *self.cluster_args, *self.engine_args]

    def _default_cmd(self) -> bool:
        return bool(self.engine_cmd == self._zygote_cmd())

    def find_args(self) -> list[str]:
        return [*self.engine_cmd, *self._forker_args()]

    def start(self, n: int) -> Any:  # type: ignore[override]
        """The standby a forker of this cluster forked (a replacement), else the forker the
        workbench kernel started ahead, else a new one."""
        self.n = n
        args = self._forker_args()
        env = {**os.environ, **self.get_env()}  # what LocalProcessLauncher.start gives
        if self._default_cmd() and standby.take(self, args, env):
            return None
        standby.launched(self.standby_dir, env)  # its standbys get this environment
        if self._default_cmd() and start_warm(self, "engines", args):
            return None
        return super().start()

    def engine_exited(self) -> bool:
        """True once one of the engines forked so far has exited (seen while the
        cluster starts: ``registration.engines_exited`` asks every 20 ms)."""
        proc = self.process
        if proc is None:
            return False
        try:
            for child in proc.children():
                self._seen.setdefault(child.pid, child)
        except psutil.Error:  # the forking process itself is gone: its state says so
            pass
        return not all(running(child) for child in self._seen.values())
