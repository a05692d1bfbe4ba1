"""``%wb start``'s launcher options (``--remote-python``, ``--ssh-args``, ...): the magic's
spelling of ``Cluster(launcher_options=...)``; which launcher takes which is checked there."""

from __future__ import annotations

import shlex
from typing import Any

from workbench.errors import ConfigError
from workbench.magics.args import MagicParser

__all__ = ["add_launcher_args", "launcher_options_from"]

# flag -> (option name, takes a list, help)
_FLAGS: dict[str, tuple[str, bool, str]] = {
    "--remote-python": ("remote_python", False, "ssh: the engines' python on the hosts"),
    "--ssh-args": ("ssh_args", True, "ssh: extra ssh options, e.g. '-p 2222 -i ~/.ssh/k'"),
    "--hostfile": ("hostfile", False, "mpi: an MPI hostfile (instead of --hosts)"),
    "--mpi-args": ("mpi_args", True, "mpi: extra mpiexec options"),
    "--mpiexec": ("mpiexec", False, "mpi: the mpiexec to run (default: mpiexec)"),
    "--partition": ("partition", False, "slurm: the partition"),
    "--time": ("time", False, "slurm: the job's time limit, e.g. 01:00:00"),
    "--account": ("account", False, "slurm: the account to charge"),
    "--sbatch-args": ("sbatch_args", True, "slurm: extra sbatch options"),
    "--network-interface": ("network_interface", False, "the interface joining the hosts"),
    "--status-dir": ("status_dir", False, "a directory every node shares (hang reports)"),
}


def add_launcher_args(p: MagicParser) -> None:
    for flag, (name, _, text) in _FLAGS.items():
        p.add_argument(flag, dest=f"lo_{name}", default=None, help=text)


def launcher_options_from(args: Any) -> dict[str, Any] | None:
    """The options given on the line (lists are shell-split), or None when none were."""
    out: dict[str, Any] = {}
    for name, is_list, _ in _FLAGS.values():
        value = getattr(args, f"lo_{name}", None)
        if value is None:
            continue
        try:
            out[name] = shlex.split(value) if is_list else value
        except ValueError as exc:  # an unclosed quote
            raise ConfigError(f"--{name.replace('_', '-')} {value!r} is not valid: {exc}") from None
    return out or None
