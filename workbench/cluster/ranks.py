"""Rank assignment: a pure function from engine facts to ranks, devices and rendezvous.

Ranks are grouped by host (hosts in order of their lowest engine id, engines within a host
by engine id), so ``LOCAL_RANK`` is contiguous per host as torchrun does it. Kept free of
ipyparallel and torch so multi-host layouts are unit-testable without any processes.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

from workbench.config import BACKENDS
from workbench.errors import ClusterError, choices_error

__all__ = ["EngineInfo", "RankAssignment", "assign_ranks", "relocalize"]

LOOPBACK = "127.0.0.1"


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineInfo:
    """What an engine reports about itself before it gets a rank."""

    engine_id: int
    host: str
    pid: int
    address: str = LOOPBACK  # an address of the host that other hosts can reach
    cuda_devices: int = 0
    cpus: int = 1
    pid_space: str = ""  # see hosts.pid_space: the pid is meaningful only there


@dataclass(frozen=True, slots=True, kw_only=True)
class RankAssignment:
    """Everything one engine needs to join the process group."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    num_nodes: int
    engine_id: int
    host: str
    pid: int
    master_addr: str
    master_port: int
    backend: str
    device: str
    threads: int
    pid_space: str = ""

    def env(self) -> dict[str, str]:
        """The torchrun-style environment variables for this rank."""
        return {
            "RANK": str(self.rank),
            "WORLD_SIZE": str(self.world_size),
            "LOCAL_RANK": str(self.local_rank),
            "LOCAL_WORLD_SIZE": str(self.local_world_size),
            "GROUP_RANK": str(self.node_rank),
            "MASTER_ADDR": self.master_addr,
            "MASTER_PORT": str(self.master_port),
        }

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _choose_backend(requested: str, by_host: dict[str, list[EngineInfo]]) -> str:
    if requested not in BACKENDS:
        raise choices_error("backend", requested, BACKENDS)
    # NCCL needs one GPU per engine on every host.
    enough_gpus = all(
        min(e.cuda_devices for e in engines) >= len(engines) for engines in by_host.values()
    )
    if requested == "auto":
        return "nccl" if enough_gpus else "gloo"
    if requested == "nccl" and not enough_gpus:
        have = {h: min(e.cuda_devices for e in es) for h, es in by_host.items()}
        need = {h: len(es) for h, es in by_host.items()}
        raise ClusterError(
            f"backend='nccl' needs one CUDA device per engine; devices per host {have}, "
            f"engines per host {need}. Use backend='gloo' (CPU) or fewer engines per host."
        )
    return requested


def assign_ranks(
    engines: list[EngineInfo],
    *,
    backend: str = "auto",
    master_port: int = 29500,
    threads_per_engine: int | None = None,
) -> list[RankAssignment]:
    """Assign ranks, local ranks, devices, backend and rendezvous address to engines.

    Returns assignments in rank order. ``MASTER_ADDR`` is rank 0's host address, or
    loopback when every engine runs on one host (so nothing listens beyond this machine).
    """
    if not engines:
        raise ClusterError("no engines to assign ranks to; start at least one engine")
    ids = [e.engine_id for e in engines]
    if len(set(ids)) != len(ids):
        raise ClusterError(f"duplicate engine ids {sorted(ids)}")
    by_host: dict[str, list[EngineInfo]] = {}
    for engine in sorted(engines, key=lambda e: e.engine_id):
        by_host.setdefault(engine.host, []).append(engine)
    chosen = _choose_backend(backend, by_host)
    world_size = len(engines)
    hosts = list(by_host)  # insertion order = order of each host's lowest engine id
    single_host = len(hosts) == 1
    master_addr = LOOPBACK if single_host else by_host[hosts[0]][0].address
    out: list[RankAssignment] = []
    rank = 0
    for node_rank, host in enumerate(hosts):
        local = by_host[host]
        cpus = min(e.cpus for e in local)
        threads = threads_per_engine or max(1, cpus // len(local))
        for local_rank, engine in enumerate(local):
            device = f"cuda:{local_rank}" if chosen == "nccl" else "cpu"
            out.append(
                RankAssignment(
                    rank=rank,
                    world_size=world_size,
                    local_rank=local_rank,
                    local_world_size=len(local),
                    node_rank=node_rank,
                    num_nodes=len(hosts),
                    engine_id=engine.engine_id,
                    host=host,
                    pid=engine.pid,
                    master_addr=master_addr,
                    master_port=master_port,
                    backend=chosen,
                    device=device,
                    threads=threads,
                    pid_space=engine.pid_space,
                )
            )
            rank += 1
    return out


def relocalize(ranks: list[RankAssignment]) -> list[RankAssignment]:
    """Recompute the per-host numbering of ranks whose hosts may have changed (a replaced
    engine), keeping every global rank: ``LOCAL_RANK`` / ``LOCAL_WORLD_SIZE`` by host in
    rank order, ``GROUP_RANK`` by each host's lowest rank, and one device per local rank."""
    ordered = sorted(ranks, key=lambda r: r.rank)
    by_host: dict[str, list[RankAssignment]] = {}
    for r in ordered:
        by_host.setdefault(r.host, []).append(r)
    hosts = list(by_host)
    out = []
    for r in ordered:
        local = by_host[r.host]
        local_rank = local.index(r)
        device = f"cuda:{local_rank}" if r.device.startswith("cuda") else r.device
        out.append(
            replace(
                r,
                local_rank=local_rank,
                local_world_size=len(local),
                node_rank=hosts.index(r.host),
                num_nodes=len(hosts),
                device=device,
            )
        )
    return out
