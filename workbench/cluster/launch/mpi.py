"""launcher="mpi": what is checked before mpiexec runs (mpiexec and mpi4py present, root,
where the engines go), each failure one sentence naming the option that fixes it."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence
from typing import Protocol

import psutil

from workbench.errors import ClusterError, ConfigError

__all__ = ["MpiOptions", "check_mpi_slots", "is_openmpi", "preflight_mpi"]


class MpiOptions(Protocol):
    """The launcher options these checks read (``launchers.LauncherOptions``; named here,
    not imported, so that ``launchers.py`` may import this module)."""

    @property
    def hostfile(self) -> str: ...

    @property
    def mpi_args(self) -> tuple[str, ...]: ...

    @property
    def mpiexec(self) -> str: ...


def is_openmpi(mpiexec: str) -> bool:
    try:
        out = subprocess.run([mpiexec, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "Open MPI" in out.stdout or "OpenRTE" in out.stdout


def preflight_mpi(options: MpiOptions) -> None:
    import importlib.util

    if shutil.which(options.mpiexec) is None:
        raise ClusterError(
            f"launcher='mpi' needs {options.mpiexec!r} on PATH (Debian: apt-get install "
            "openmpi-bin), or launcher_options={'mpiexec': '/path/to/mpiexec'}"
        )
    if importlib.util.find_spec("mpi4py") is None:
        raise ClusterError(
            "launcher='mpi' runs `ipengine --mpi`, which needs mpi4py: "
            "pip install 'distributed-workbench[mpi]' (in the environment of every node)"
        )
    if (
        os.geteuid() == 0
        and is_openmpi(options.mpiexec)
        and "--allow-run-as-root" not in (options.mpi_args)
    ):
        raise ClusterError(
            "openmpi's mpiexec refuses to run as root; run the notebook as a regular user "
            "(or, knowingly, launcher_options={'mpi_args': ['--allow-run-as-root']})"
        )


# mpiexec options that say where the engines go, or that more of them than cores may run
_PLACEMENT = ("--host", "-H", "-host", "--hostfile", "-hostfile", "--machinefile", "-machinefile")


def check_mpi_slots(n: int, hosts: Sequence[str], options: MpiOptions) -> None:
    """Without hosts or a hostfile, openmpi starts every engine here and, with more engines
    than this machine's cores (its default slots), fails with its own "not enough slots"
    text that names none of the workbench's options: say which ones to pass, first."""
    if hosts or options.hostfile or not is_openmpi(options.mpiexec):
        return
    if any(a in _PLACEMENT or "oversubscribe" in a.lower() for a in options.mpi_args):
        return
    slots = psutil.cpu_count(logical=False) or os.cpu_count() or 1
    if n > slots:
        raise ConfigError(
            f"launcher='mpi' with n={n} and neither hosts nor a hostfile starts every engine "
            f"on this machine, where openmpi has {slots} slot(s) (one per core); name the "
            "nodes with hosts=['node1', 'node2'] (`%wb start --hosts node1,node2`) or "
            "launcher_options={'hostfile': '/path/to/hostfile'} (`--hostfile PATH`), or "
            "run more engines than cores here with "
            "launcher_options={'mpi_args': ['--oversubscribe']}"
        )
