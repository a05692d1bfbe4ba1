"""How to end, from this host, what a cluster runs on other hosts: commands for the watchdog.

A kernel killed with SIGKILL leaves its engines on other hosts running until their
heartbeats time out (30-60 s). The orphan watchdog (a local process) must end them too, and
only through their own host: a pid of another host means nothing here. So the cluster
hands the watchdog ready-made commands, rewritten whenever its processes change:

- ssh: one ssh per host that ends, *on that host*, this user's processes whose environment
  holds ``IPP_CLUSTER_ID=<this cluster>`` (engines and their nannies: every ipyparallel
  launcher puts it there, and nothing else has it), then removes their log files;
- slurm: one ``scancel`` of the engines' jobs (Slurm ends every process of a job);
- mpi: nothing here: ``mpiexec`` is a local process (the watchdog ends it by pid) and ends
  its ranks on every host itself.

Phases run in order, the commands of a phase at once: first the engines, then the shared
ssh connections are closed (``ssh -O exit``), whose sockets are in ``dirs``.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from typing import Any

from workbench.cluster.launch.slurm import job_ids
from workbench.cluster.launch.ssh import FastSSHEngineLauncher

__all__ = ["RemoteEnds", "end_cluster_line", "remote_ends"]

# Phases of argv lists, and directories to remove afterwards.
RemoteEnds = dict[str, Any]

# SIGTERM, then SIGKILL for any still there 1 s later (an engine finalising gloo threads).
_END = (
    'pids=""; for e in /proc/[0-9]*/environ; do '
    "tr '\\0' '\\n' < \"$e\" 2>/dev/null | grep -qxF {needle} && "
    '{{ p=${{e#/proc/}}; pids="$pids ${{p%/environ}}"; }}; done; '
    '[ -z "$pids" ] || {{ kill -TERM $pids 2>/dev/null; sleep 1; kill -KILL $pids 2>/dev/null; }}; '
)


def end_cluster_line(cluster_id: str, files: Sequence[str] = ()) -> str:
    """POSIX shell, run on a host: end this user's processes of ``cluster_id`` there (found
    by their environment, never by name or by a pid known elsewhere), remove ``files``."""
    line = _END.format(needle=shlex.quote(f"IPP_CLUSTER_ID={cluster_id}"))
    if files:
        line += "cd && rm -f " + " ".join(shlex.quote(f) for f in files) + "; "
    return line + "true"


def remote_ends(ipp_cluster: Any, ssh_dir: str | None) -> RemoteEnds:
    """The watchdog's commands for ``ipp_cluster``'s engines on other hosts."""
    if ipp_cluster is None:
        return {}
    cluster_id = str(getattr(ipp_cluster, "cluster_id", "") or "")
    hosts: dict[tuple[str, ...], list[str]] = {}  # ssh argv up to the host -> log files
    jobs: list[str] = []
    for engine_set in list(getattr(ipp_cluster, "engines", {}).values()):
        jobs += job_ids(engine_set)
        for el in list(getattr(engine_set, "launchers", {}).values()):
            # listed from the moment it starts: an engine started just before the kernel
            # died is found on its host by its environment, before its pid came back
            if isinstance(el, FastSSHEngineLauncher) and el.hostname:
                argv = (*el.ssh_cmd, *el.ssh_args, el.location)
                hosts.setdefault(argv, []).append(el.remote_output_file)
    first: list[list[str]] = []
    if jobs:
        first.append(["scancel", *jobs])
    if cluster_id:
        first += [[*argv, end_cluster_line(cluster_id, files)] for argv, files in hosts.items()]
    # then close the shared connections (their master would persist a few seconds more)
    second = [[*argv[:-1], "-O", "exit", argv[-1]] for argv in hosts] if ssh_dir else []
    if not first and not second:
        return {}
    return {"phases": [p for p in (first, second) if p], "dirs": [ssh_dir] if ssh_dir else []}
