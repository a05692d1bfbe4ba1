"""Launching by taking over a process the workbench kernel started ahead (warm_start.py).

A local cluster's two launchers (the engines' forker, launch/fork.py, and the controller)
first look for a process of their role waiting in this kernel; where one may be taken, they
send it their command line and then treat it as the process they would have started.
"""

from __future__ import annotations

import os
from typing import Any

import psutil
from ipyparallel.cluster.launcher import LocalControllerLauncher, ipcontroller_cmd_argv

from workbench.cluster.launch import warm_start
from workbench.engine.warm_request import request_line

__all__ = ["Adopting", "WarmControllerLauncher", "start_warm"]


def start_warm(launcher: Any, role: str, args: list[str]) -> bool:
    """Start ``launcher`` (a LocalProcessLauncher) as the waiting ``role`` process running
    ``args``; False (nothing done) where there is none it may take."""
    if launcher.state != "before":
        return False
    taken = warm_start.take(role, {**os.environ, **launcher.get_env()})
    if taken is None:
        return False
    process, changes = taken
    cwd, output = os.path.abspath(launcher.work_dir), os.path.abspath(launcher.output_file)
    assert process.stdin is not None  # started with a pipe (warm_start.spawn)
    try:
        process.stdin.write(request_line(args, changes, cwd, output))
        process.stdin.close()
    except OSError:  # it died since take() saw it alive: start a fresh one instead
        process.kill()
        process.wait()
        return False
    launcher.adopt(process.pid, process)
    return True


class Adopting:
    """Mixed into an ipyparallel ``LocalProcessLauncher``: it can take a process started
    ahead (warm_start.py, standby.py) as its own, the launcher changing itself."""

    def adopt(self, pid: int, popen: Any = None) -> None:
        """Make process ``pid`` (``popen``, where it is this kernel's child) this launcher's
        own: what LocalProcessLauncher.start does once its own Popen has returned (its wait
        thread uses psutil, which also waits for a process that is no child of this one)."""
        launcher: Any = self  # (the attributes below are LocalProcessLauncher's)
        launcher._popen_process = popen
        launcher.pid = pid
        launcher.process = psutil.Process(pid)
        launcher.notify_start(pid)
        launcher._start_waiting()


class WarmControllerLauncher(Adopting, LocalControllerLauncher):
    """ipyparallel's local controller, or the one the workbench kernel started ahead."""

    def start(self) -> Any:
        args = [*self.cluster_args, *self.controller_args]
        default = self.controller_cmd == ipcontroller_cmd_argv
        if default and start_warm(self, "controller", args):
            return None
        return super().start()
