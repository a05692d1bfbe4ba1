"""Settings shared across layers, as validated keyword-only dataclasses."""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from workbench import validate
from workbench.errors import ConfigError

__all__ = [
    "ANY_SPARE",
    "BACKENDS",
    "LAUNCHERS",
    "MAX_ENGINES",
    "ClusterConfig",
    "not_private",
    "parse_hosts",
    "state_dir",
]

BACKENDS = ("auto", "gloo", "nccl")
LAUNCHERS = ("local", "mpi", "ssh", "slurm")
# More engines than this is a typo, not a run: every engine is a process with torch loaded,
# and one controller serves them all.
MAX_ENGINES = 1024
# spare_hosts="any" (Slurm): a lost host's ranks go to a new job wherever the partition
# has room, on a node the cluster does not run on (cluster/hosts/spare_hosts.py)
ANY_SPARE = "any"
SPARE_LAUNCHERS = ("ssh", "slurm")


@dataclass(kw_only=True, slots=True, frozen=True)
class ClusterConfig:
    """How to start (or connect to) engines and join them into a process group.

    ``hosts`` (ssh: required; mpi: the hostfile; slurm: the node list) is a sequence of
    host names or one string: a
    string is one host, or several separated by commas (``"node-a,node-b"``, as
    ``%wb start --hosts`` takes them); it is stored as a tuple of names.
    """

    n: int = 2
    backend: str = "auto"
    launcher: str = "local"
    hosts: Sequence[str] = ()
    profile: str | None = None
    cluster_id: str | None = None
    init_timeout: float = 60.0
    start_timeout: float = 60.0
    threads_per_engine: int | None = None
    # ssh/slurm: where a lost host's ranks go (cluster/hosts/spare_hosts.py)
    spare_hosts: Sequence[str] = ()

    def __post_init__(self) -> None:
        validate.integer("n", self.n, minimum=1, maximum=MAX_ENGINES, what="a number of engines")
        validate.choice("backend", self.backend, BACKENDS)
        validate.choice("launcher", self.launcher, LAUNCHERS)
        hosts = parse_hosts("hosts", self.hosts)
        object.__setattr__(self, "hosts", hosts)  # frozen: normalise once, here
        if self.launcher == "ssh" and not hosts:
            raise ConfigError("launcher='ssh' needs hosts=('host1', 'host2', ...)")
        if self.launcher == "local" and hosts:
            raise validate.invalid(
                "hosts",
                hosts,
                "launcher='local' does not place engines on named hosts",
                "use launcher='ssh', 'mpi' or 'slurm' with hosts, or leave hosts empty",
            )
        spares = parse_hosts("spare_hosts", self.spare_hosts)
        object.__setattr__(self, "spare_hosts", spares)
        _check_spares(spares, self.launcher, hosts)
        # A profile / cluster_id is looked up by Cluster itself (cluster.connection): finding
        # ipyparallel's connection file is the cluster layer's business, not a setting's.
        for name in ("init_timeout", "start_timeout"):
            object.__setattr__(self, name, validate.seconds(name, getattr(self, name)))
        validate.integer(
            "threads_per_engine",
            self.threads_per_engine,
            minimum=1,
            none_means="auto: the host's cores shared by its engines",
            what="a number of threads",
        )


def state_dir() -> Path:
    """Where the workbench keeps per-user state (the checkpoint key, kept clusters):
    ``$WORKBENCH_STATE_DIR``, else ``$XDG_STATE_HOME/workbench``, else
    ``~/.local/state/workbench``."""
    explicit = os.environ.get("WORKBENCH_STATE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_STATE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".local" / "state"
    return base / "workbench"


def not_private(path: Path) -> str | None:
    """Why a secret's file (or directory) is not this user's alone, as ssh checks its
    private keys: ``"owner"`` (another user owns it), ``"mode NNN"`` (others may read or
    write it), or None."""
    info = path.stat()
    if hasattr(os, "getuid") and info.st_uid != os.getuid():
        return "owner"
    mode = stat.S_IMODE(info.st_mode)
    return f"mode {mode:o}" if mode & 0o077 else None


def parse_hosts(name: str, value: object) -> tuple[str, ...]:
    """Host names from a sequence of names, or from one string of comma-separated names
    (never the characters of a string: ``"node-a"`` is one host)."""
    items = [h for h in value.split(",") if h.strip()] if isinstance(value, str) else value
    if not isinstance(items, Sequence) or isinstance(items, bytes):
        raise validate.invalid(
            name, value, "not a list of host names", "use e.g. ('node-a', 'node-b') or 'node-a'"
        )
    hosts = tuple(h.strip() if isinstance(h, str) else h for h in items)
    bad = [h for h in hosts if not isinstance(h, str) or not h or any(c.isspace() for c in h)]
    if bad:
        raise validate.invalid(
            name,
            value,
            f"{bad[0]!r} is not a host name",
            "use names like 'node-a' or 'user@node-a', without spaces",
        )
    return hosts


def _check_spares(spares: tuple[str, ...], launcher: str, hosts: tuple[str, ...]) -> None:
    """Spare hosts: ssh or slurm (a new engine is started there by ssh, or as a job pinned
    to that node), none of them also a host the run starts on, none named twice;
    ``"any"`` alone, and for slurm only (Slurm picks the node)."""
    if not spares:
        return
    if launcher not in SPARE_LAUNCHERS:
        raise validate.invalid(
            "spare_hosts",
            spares,
            f"launcher={launcher!r} cannot start a lost host's ranks on a named spare",
            "use spare_hosts with launcher='ssh' or 'slurm', or leave it out",
        )
    if ANY_SPARE in spares and (launcher != "slurm" or len(spares) > 1):
        why = (
            f"{ANY_SPARE!r} lets Slurm pick the node, so it takes no other host"
            if launcher == "slurm"
            else f"{ANY_SPARE!r} (a node Slurm picks) needs launcher='slurm'"
        )
        raise validate.invalid(
            "spare_hosts", spares, why, f"name the spare hosts, or (slurm) {ANY_SPARE!r} alone"
        )
    both = [h for h in spares if h in hosts]
    twice = sorted({h for h in spares if spares.count(h) > 1})
    if both or twice:
        why = f"{both[0]!r} is also in hosts" if both else f"{twice[0]!r} is named twice"
        raise validate.invalid(
            "spare_hosts", spares, why, "name hosts the run does not start on, each once"
        )
