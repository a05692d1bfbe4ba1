"""Settings shared across layers, as validated keyword-only dataclasses."""

from __future__ import annotations

from dataclasses import dataclass

from workbench.errors import ConfigError, choices_error

__all__ = ["BACKENDS", "LAUNCHERS", "ClusterConfig"]

BACKENDS = ("auto", "gloo", "nccl")
LAUNCHERS = ("local", "mpi", "ssh", "slurm")


@dataclass(kw_only=True, slots=True, frozen=True)
class ClusterConfig:
    """How to start (or connect to) engines and join them into a process group."""

    n: int = 2
    backend: str = "auto"
    launcher: str = "local"
    hosts: tuple[str, ...] = ()
    profile: str | None = None
    cluster_id: str | None = None
    init_timeout: float = 60.0
    start_timeout: float = 60.0
    threads_per_engine: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.n, bool) or not isinstance(self.n, int) or self.n < 1:
            raise ConfigError(f"n={self.n!r} is not valid; the number of engines must be >= 1")
        if self.backend not in BACKENDS:
            raise choices_error("backend", self.backend, BACKENDS)
        if self.launcher not in LAUNCHERS:
            raise choices_error("launcher", self.launcher, LAUNCHERS)
        if self.launcher == "ssh" and not self.hosts:
            raise ConfigError("launcher='ssh' needs hosts=('host1', 'host2', ...)")
        if self.init_timeout <= 0:
            raise ConfigError(f"init_timeout={self.init_timeout!r} must be > 0 seconds")
        if self.start_timeout <= 0:
            raise ConfigError(f"start_timeout={self.start_timeout!r} must be > 0 seconds")
        if self.threads_per_engine is not None and self.threads_per_engine < 1:
            raise ConfigError(
                f"threads_per_engine={self.threads_per_engine!r} must be >= 1 or None (auto)"
            )
